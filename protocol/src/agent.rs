//! The messages between `sandbox-runner` (the unprivileged client, running
//! as the student inside their Slurm batch step) and `sandbox-agent` (the
//! root-owned per-node daemon that alone holds the Docker socket).
//!
//! A connection is a stream of frames over a Unix socket: a 4-byte little
//! endian length, then an encoded record (the same 8-byte `DLGT` header as
//! the job-directory records, kind `Q` for a request, `A` for an answer,
//! then postcard), at most [`MAX_FRAME_BYTES`]. A [`Request::Run`] frame
//! carries three file descriptors by `SCM_RIGHTS`, in this order: the job
//! directory (opened `O_NOFOLLOW|O_DIRECTORY` by the runner, as the
//! student), and its freshly created `stdout` and `stderr` files.
//!
//! The agent trusts nothing in these messages it can check otherwise: the
//! caller's uid and Slurm job come from the kernel (`SO_PEERCRED`, the
//! parent `slurmstepd`) and slurmctld, the spec is checked again against
//! the site policy, the directory is the inode behind the descriptor.

use serde::{Deserialize, Serialize};

use crate::record::{decode, encode, Record};
use crate::{Result, Spec};

/// Where the agent listens unless the site policy says otherwise.
pub const DEFAULT_AGENT_SOCKET: &str = "/run/delegate/agent.sock";
/// Upper bound on one frame (length prefix excluded).
pub const MAX_FRAME_BYTES: u64 = 128 * 1024;
/// The number of descriptors a [`Request::Run`] frame carries.
pub const RUN_FDS: usize = 3;
/// The agent closes a connection that waits this long for its next
/// request while none of its calls runs; a runner reconnects rather than
/// reuse a connection idle for half of it.
pub const IDLE_SECS: u64 = 60;

/// What the runner asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Engine version, image, perf mode (for `sandbox-runner probe`); asked
    /// by anyone, starts nothing.
    Probe,
    /// Run one job (carries the directory and output descriptors).
    Run(RunRequest),
    /// Stop the running job's container now (a signal, the cancel marker).
    Kill,
    /// Run one rank of a multi-node job (carries the same descriptors as
    /// [`Request::Run`]). Served only to the task of a non-batch step of
    /// the caller's running job; the agent derives the rank from
    /// slurmctld's node list, never from this message.
    RunRank(RankRequest),
    /// Whether another user's job waits for a partition (`sandbox-runner
    /// pull` asks between the calls of a map's allocation: students do not
    /// see other users' jobs, `PrivateData=jobs`). Served only to the batch
    /// task of a running job. Appended last: the earlier requests keep
    /// their encoding.
    Queue(QueueRequest),
}

/// [`Request::Queue`]: the partition of the caller's job (its own
/// `SLURM_JOB_PARTITION`; `None`: any).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRequest {
    pub partition: Option<String>,
}

/// One rank of a multi-node job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankRequest {
    pub run: RunRequest,
    /// The rank the runner believes it has (`SLURM_NODEID`), for its
    /// output file names: the agent refuses a request whose rank is not
    /// this node's index in the job's node list.
    pub rank: u32,
}

/// The rank environment of a sandbox of a multi-node job: the
/// torch.distributed / Horovod conventions.
pub const MASTER_ALIAS: &str = "rank0";
/// The port `MASTER_PORT` names (torch.distributed's customary one).
pub const MASTER_PORT: u16 = 29500;

/// `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`, and
/// `DELEGATE_RANK`/`DELEGATE_WORLD_SIZE`, replacing any of the spec's own.
pub fn rank_env(env: &[(String, String)], rank: u32, world: u32) -> Vec<(String, String)> {
    const SET: [&str; 7] = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "DELEGATE_RANK",
        "DELEGATE_WORLD_SIZE",
    ];
    let mut out: Vec<(String, String)> = env.iter().filter(|(k, _)| !SET.contains(&k.as_str())).cloned().collect();
    for (k, v) in [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_RANK", "0".to_string()),
        ("MASTER_ADDR", MASTER_ALIAS.to_string()),
        ("MASTER_PORT", MASTER_PORT.to_string()),
        ("DELEGATE_RANK", rank.to_string()),
        ("DELEGATE_WORLD_SIZE", world.to_string()),
    ] {
        out.push((k.to_string(), v));
    }
    out
}

/// One call to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The spec as the runner read and checked it; checked again by the agent.
    pub spec: Spec,
    /// The job directory's path, for the policy's job roots and messages
    /// (the agent checks it names the descriptor's inode).
    pub job_dir: String,
    /// The gid the sandbox runs as (checked: one of the caller's groups).
    pub gid: u32,
}

/// What the agent answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    Probe(ProbeReport),
    /// The agent will not serve this caller or this request; nothing was
    /// started. The reason is one sentence.
    Refused(String),
    /// The call failed before its container started (engine errors...):
    /// the job's outcome is `failed` with this reason.
    Failed(String),
    /// The container exists (not started yet).
    Created {
        container_id: String,
        perf_mode: String,
    },
    /// The container started; the runner records it.
    Started {
        container_id: String,
        perf_mode: String,
        started_ms: u64,
    },
    /// The container ended and has been removed (or could not be).
    Ended(Ended),
    /// The machine the call ran on (sent before [`Answer::Ended`]; an
    /// agent of before has none, the runner then writes none). Appended
    /// last: the earlier answers keep their encoding.
    Fingerprint(Box<crate::Fingerprint>),
    /// The answer to [`Request::Queue`]: whether a job of another user
    /// than the caller waits for the partition's nodes (pending for
    /// resources or priority, not held). Appended last.
    Queue {
        others_wait: bool,
    },
}

/// Why the container stopped, from the agent's side.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndedHow {
    /// The main process exited by itself.
    Exited,
    /// The spec's time limit was reached.
    TimedOut,
    /// Killed because the runner asked ([`Request::Kill`]).
    Killed,
    /// The engine's wait failed; the reason.
    WaitFailed(String),
    /// Stopped by the site policy's disk limits; the reason.
    Stopped(String),
    /// Failed after creation, before or while starting; the reason.
    Failed(String),
}

/// The end of a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    pub how: EndedHow,
    pub exit_code: Option<i32>,
    pub oom_killed: bool,
    /// Set when the engine stopped during the job (the reason).
    pub engine_gone: Option<String>,
    /// Output problems (write errors, drain timeout, truncation past
    /// `max_output`), appended to the outcome's reason.
    pub output_note: Option<String>,
    /// Set when the container could not be removed (the reason).
    pub removal_error: Option<String>,
    pub started_ms: Option<u64>,
}

/// `sandbox-runner probe`'s findings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub docker_ok: bool,
    pub version: String,
    pub api_version: String,
    pub error: String,
    pub image: String,
    pub image_present: bool,
    pub perf_mode: String,
    pub perf_detail: String,
    /// How allocated GPUs reach the sandbox on this node (`none`,
    /// `devices`, `nvidia`, `cdi`), and why.
    pub gpu_mode: String,
    pub gpu_detail: String,
}

impl Record for Request {
    const KIND: u8 = b'Q';
    const MAX_BYTES: u64 = MAX_FRAME_BYTES;
    const NAME: &'static str = "agent request";
    /// 2: the spec it carries has retries (spec version 2). An agent of
    /// another version refuses the request by name.
    const VERSION: u16 = 2;
}
impl Record for Answer {
    const KIND: u8 = b'A';
    const MAX_BYTES: u64 = MAX_FRAME_BYTES;
    const NAME: &'static str = "agent answer";
    /// 2: the fingerprint it carries has GPUs. A runner and an agent of
    /// different versions refuse each other's answers by name.
    const VERSION: u16 = 2;
}

/// A frame: length prefix and the encoded record.
pub fn frame<R: Record>(r: &R) -> Result<Vec<u8>> {
    let body = encode(r)?;
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Accumulates bytes from the stream and yields whole frames.
#[derive(Default, Debug)]
pub struct FrameBuf {
    buf: Vec<u8>,
}

impl FrameBuf {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }
    /// The next whole frame decoded, `Ok(None)` when more bytes are
    /// needed, an error for a frame over the bound or that does not decode
    /// (the connection is then dropped).
    pub fn next_frame<R: Record>(&mut self) -> Result<Option<R>> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as u64;
        if len > R::MAX_BYTES {
            return Err(crate::ProtocolError::TooLarge {
                path: R::NAME.into(),
                size: len,
                limit: R::MAX_BYTES,
            });
        }
        let len = len as usize;
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let r = decode::<R>(&self.buf[4..4 + len], R::NAME);
        self.buf.drain(..4 + len);
        r.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::sample_spec;

    #[test]
    fn frames_round_trip_in_pieces() {
        let reqs = vec![
            Request::Probe,
            Request::Run(RunRequest {
                spec: sample_spec(),
                job_dir: "/home/a/x".into(),
                gid: 5,
            }),
            Request::Kill,
            Request::RunRank(RankRequest {
                run: RunRequest {
                    spec: sample_spec(),
                    job_dir: "/home/a/y".into(),
                    gid: 5,
                },
                rank: 1,
            }),
            Request::Queue(QueueRequest { partition: Some("delegate".into()) }),
        ];
        let mut bytes = Vec::new();
        for r in &reqs {
            bytes.extend(frame(r).unwrap());
        }
        let mut fb = FrameBuf::default();
        let mut got = Vec::new();
        for b in bytes.chunks(3) {
            fb.push(b);
            while let Some(r) = fb.next_frame::<Request>().unwrap() {
                got.push(r);
            }
        }
        assert_eq!(got, reqs);
    }

    #[test]
    fn rank_env_replaces_the_specs_own() {
        let env = vec![
            ("RANK".to_string(), "7".to_string()),
            ("FOO".to_string(), "x".to_string()),
        ];
        let e = rank_env(&env, 1, 2);
        let get = |k: &str| e.iter().filter(|(n, _)| n == k).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        assert_eq!(get("RANK"), ["1"]);
        assert_eq!(get("WORLD_SIZE"), ["2"]);
        assert_eq!(get("LOCAL_RANK"), ["0"]);
        assert_eq!(get("MASTER_ADDR"), [MASTER_ALIAS]);
        assert_eq!(get("MASTER_PORT"), ["29500"]);
        assert_eq!(get("FOO"), ["x"]);
    }

    #[test]
    fn oversized_and_wrong_kind_frames_are_errors() {
        let mut fb = FrameBuf::default();
        fb.push(&(u32::MAX).to_le_bytes());
        let r = fb.next_frame::<Request>();
        assert!(matches!(r, Err(crate::ProtocolError::TooLarge { .. })), "{r:?}");
        let mut fb = FrameBuf::default();
        fb.push(&frame(&Answer::Refused("no".into())).unwrap());
        let r = fb.next_frame::<Request>();
        assert!(matches!(r, Err(crate::ProtocolError::WrongKind { .. })), "{r:?}");
    }
}

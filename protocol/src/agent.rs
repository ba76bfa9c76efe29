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
}
impl Record for Answer {
    const KIND: u8 = b'A';
    const MAX_BYTES: u64 = MAX_FRAME_BYTES;
    const NAME: &'static str = "agent answer";
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
    fn oversized_and_wrong_kind_frames_are_errors() {
        let mut fb = FrameBuf::default();
        fb.push(&(u32::MAX).to_le_bytes());
        assert!(fb.next_frame::<Request>().is_err());
        let mut fb = FrameBuf::default();
        fb.push(&frame(&Answer::Refused("no".into())).unwrap());
        assert!(fb.next_frame::<Request>().is_err());
    }
}

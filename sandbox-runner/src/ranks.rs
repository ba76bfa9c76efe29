//! Multi-node rank jobs.
//!
//! `sandbox-runner ranks <JOB_DIR>` is the batch step of a job submitted
//! with `--nodes N` (the only form job_submit.lua accepts with more than
//! one node). It checks the job directory like a single call, then starts
//! one `sandbox-runner rank <JOB_DIR>` per node of the allocation with
//! `srun --kill-on-bad-exit=1` (the only step delegate's SPANK plugin lets
//! a user run), waits for them, and writes the job's one `outcome` from the
//! ranks' `outcome.<K>`, with each rank's exit code.
//!
//! `sandbox-runner rank <JOB_DIR>` runs in that step, one task per node: it
//! asks the node's agent for this rank's sandbox (the agent derives the
//! rank from slurmctld's node list, never from this process) and records
//! `stdout.<K>`, `stderr.<K>`, `outcome.<K>` (`started` for rank 0,
//! `started.<K>` for the others). It exits 0 when its rank completed and 1
//! otherwise, so that srun ends the other ranks (they end `cancelled`,
//! SIGTERM from Slurm) and the job's outcome names the rank that failed.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use delegate_protocol::{
    decode, now_ms, rank_file, read_bounded_at, refused_line, state_line, Outcome, Record, State, Writer, OUTCOME,
};

use crate::run::{self, SignalWatch, EXIT_INTERNAL, EXIT_OUTCOME, EXIT_REFUSED};
use crate::validate::{self, Refusal};

/// Where srun may be (root-owned files only).
const SRUN_PATHS: &[&str] = &["/usr/bin/srun", "/usr/local/bin/srun"];

fn srun_path() -> Option<PathBuf> {
    SRUN_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| std::fs::metadata(p).map(|m| m.uid() == 0 && m.is_file()).unwrap_or(false))
}

/// `SLURM_NODEID` of this task (set by slurmstepd); only a hint for the
/// file names: the agent refuses a rank that is not this node's.
fn node_id() -> Option<u32> {
    std::env::var("SLURM_NODEID")
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|&n| n < delegate_protocol::MAX_RANKS)
}

/// `sandbox-runner rank <dir>`: one rank. Exit 0 when the rank completed.
pub async fn run_rank(dir: &Path, signals: SignalWatch) -> i32 {
    let Some(rank) = node_id() else {
        say!("delegate: error: sandbox-runner rank runs only as a task of delegate's rank step (no SLURM_NODEID)");
        return 2;
    };
    let mut agent = None;
    let finish = run::run_job_as(dir, crate::load_policy(), &mut agent, signals, Some(rank)).await;
    if let Some(line) = &finish.final_line {
        say!("rank {rank}: {line}");
    }
    if finish.code != EXIT_OUTCOME {
        return finish.code;
    }
    // Completed iff its outcome says so (the line is printed only otherwise).
    if finish.final_line.is_none() {
        0
    } else {
        1
    }
}

/// `SLURM_JOB_ID` of this batch step (set by slurmstepd, which overrides
/// whatever the submitter's environment said).
fn slurm_job_id() -> Option<String> {
    let id = std::env::var("SLURM_JOB_ID").ok()?;
    (!id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit())).then_some(id)
}

/// The only environment srun gets: the submitter's `SLURM_*` variables
/// are srun's options (`SLURM_PROLOG` is `--prolog`, run by srun as the
/// student outside any sandbox), so srun starts from nothing but a PATH;
/// the job comes from `--jobid`.
pub const SRUN_ENV: &[(&str, &str)] = &[("PATH", "/usr/bin:/bin")];

/// The argv of the rank step: srun with every option that runs a program
/// pinned (no srun prolog or epilog), then exactly the form the SPANK
/// plugin admits (`<runner> rank <dir>`).
pub fn srun_args(runner: &str, dir: &Path, nodes: u32, job: &str) -> Vec<String> {
    vec![
        format!("--jobid={job}"),
        "--prolog=none".into(),
        "--epilog=none".into(),
        "--kill-on-bad-exit=1".into(),
        format!("--nodes={nodes}"),
        format!("--ntasks={nodes}"),
        "--ntasks-per-node=1".into(),
        runner.into(),
        "rank".into(),
        dir.display().to_string(),
    ]
}

/// The job's outcome from its ranks' (`None`: that rank wrote none).
pub fn combine(ranks: &[Option<Outcome>], host: &str, srun_note: Option<&str>) -> Outcome {
    let mut o = Outcome::ended(State::Completed, String::new(), host, Writer::Runner);
    o.started_ms = ranks.iter().flatten().filter_map(|r| r.started_ms).min();
    o.oom_killed = ranks.iter().flatten().any(|r| r.oom_killed);
    let codes: Vec<String> = ranks
        .iter()
        .enumerate()
        .map(|(k, r)| match r {
            Some(r) => match r.exit_code {
                Some(c) => format!("rank {k}: {c}"),
                None => format!("rank {k}: {}", r.state),
            },
            None => format!("rank {k}: no outcome"),
        })
        .collect();
    let summary = format!("exit codes {}", codes.join(", "));
    if ranks.iter().all(|r| r.as_ref().is_some_and(|r| r.state == State::Completed)) {
        o.exit_code = Some(0);
        o.reason = format!("all {} ranks exited with code 0", ranks.len());
        return o;
    }
    // The first rank that failed by itself (not cancelled because another
    // one failed), else the first that did not complete.
    let first = ranks
        .iter()
        .enumerate()
        .find(|(_, r)| {
            r.as_ref()
                .is_some_and(|r| !matches!(r.state, State::Completed | State::Cancelled))
        })
        .or_else(|| {
            ranks
                .iter()
                .enumerate()
                .find(|(_, r)| r.as_ref().is_none_or(|r| r.state != State::Completed))
        });
    match first {
        Some((k, Some(r))) => {
            o.state = r.state;
            o.exit_code = r.exit_code;
            o.refused = r.refused && ranks.iter().flatten().all(|x| x.refused || x.state == State::Cancelled);
            o.reason = format!("rank {k} {}: {}; {summary}", r.state, r.reason);
        }
        Some((k, None)) => {
            o.state = State::Failed;
            o.reason = format!(
                "rank {k} ended without an outcome{}; {summary}",
                srun_note.map(|n| format!(" ({n})")).unwrap_or_default()
            );
        }
        None => o.reason = summary,
    }
    o
}

/// `sandbox-runner ranks <dir>`: the batch step of a rank job.
pub async fn run_ranks(path: &Path, mut signals: SignalWatch) -> i32 {
    let uid = nix::unistd::getuid().as_raw();
    let dir = match validate::open_job_dir(path, uid) {
        Ok(d) => d,
        Err(r) => {
            say!("{}", refused_line(r.reason()));
            return EXIT_REFUSED;
        }
    };
    let host = delegate_protocol::host::hostname();
    let write = |o: &Outcome| -> i32 {
        match delegate_protocol::write_record_at(&dir.fd, &dir.path, o) {
            Ok(()) => {
                if o.state != State::Completed {
                    say!("{}", state_line(o.state, &o.reason));
                }
                EXIT_OUTCOME
            }
            Err(e) => {
                say!("delegate: error: cannot write the outcome ({e})");
                EXIT_INTERNAL
            }
        }
    };
    let fail = |state, reason: String, refused| {
        let mut o = Outcome::ended(state, reason, host.clone(), Writer::Runner);
        o.refused = refused;
        o
    };
    let policy = match crate::load_policy() {
        Ok(p) => p,
        Err(e) => return write(&fail(State::Failed, format!("{e}; ask the cluster's administrators"), false)),
    };
    let checked = match validate::check_job(&dir, uid, &policy) {
        Ok(c) => c,
        Err(Refusal::Job { reason, write_outcome: false }) => {
            say!("{}", refused_line(&reason));
            return EXIT_REFUSED;
        }
        Err(r) => return write(&fail(State::Failed, format!("refused: {}", r.reason()), true)),
    };
    if checked.cancel_requested {
        let why = delegate_protocol::cancel::read_cancel_reason(&dir.fd, &dir.path);
        let reason = delegate_protocol::cancel::cancelled_before_start(why.as_deref());
        return write(&fail(State::Cancelled, reason, false));
    }
    let nodes = checked.spec.resources.nodes;
    let status = match start_srun(&dir.path, nodes, checked.job_id.as_str()) {
        Ok(child) => wait_srun(child, &mut signals).await,
        Err(why) => return write(&fail(State::Failed, why, false)),
    };
    let note = match &status {
        Ok(s) if s.success() => None,
        Ok(s) => Some(format!("srun ended with {s}")),
        Err(e) => Some(format!("waiting for srun failed: {e}")),
    };
    let ranks: Vec<Option<Outcome>> = (0..nodes)
        .map(|k| {
            let name = rank_file(OUTCOME, k);
            read_bounded_at(&dir.fd, &dir.path, &name, <Outcome as Record>::MAX_BYTES, Some(uid))
                .ok()
                .and_then(|b| decode::<Outcome>(&b, &name).ok())
        })
        .collect();
    let mut o = combine(&ranks, &host, note.as_deref());
    o.finished_ms = now_ms();
    write(&o)
}

/// Starts the rank step: srun from an empty environment, one rank per
/// node, each `<runner> rank <dir>`; or why it cannot.
fn start_srun(dir: &Path, nodes: u32, job: &str) -> Result<tokio::process::Child, String> {
    let srun = srun_path().ok_or("srun is not installed on this node")?;
    // The runner's own path as the batch script exec'd it (job_submit.lua
    // checked it is the site's runner): the SPANK plugin admits exactly it.
    let runner = std::env::args().next().unwrap_or_default();
    if !runner.starts_with('/') {
        return Err("sandbox-runner ranks must be started by its absolute path".into());
    }
    let slurm_job =
        slurm_job_id().ok_or("sandbox-runner ranks runs only as the batch step of a Slurm job (no SLURM_JOB_ID)")?;
    tracing::info!("job {job}: starting {nodes} ranks with {}", srun.display());
    tokio::process::Command::new(&srun)
        .env_clear()
        .envs(SRUN_ENV.iter().copied())
        .args(srun_args(&runner, dir, nodes, &slurm_job))
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| format!("cannot start srun: {e}"))
}

/// Waits for srun whatever happens: it forwards Slurm's signals to the
/// ranks, and each rank ends its sandbox and writes its outcome.
async fn wait_srun(
    mut child: tokio::process::Child,
    signals: &mut SignalWatch,
) -> std::io::Result<std::process::ExitStatus> {
    loop {
        tokio::select! {
            s = child.wait() => return s,
            _ = signals.changed() => {
                if let Some(sig) = *signals.borrow() {
                    tracing::warn!("{sig}: the ranks are being ended by Slurm");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(state: State, code: Option<i32>, reason: &str) -> Option<Outcome> {
        let mut o = Outcome::ended(state, reason, "w", Writer::Runner);
        o.exit_code = code;
        o.started_ms = Some(5);
        Some(o)
    }

    #[test]
    fn all_completed() {
        let r = vec![
            ended(State::Completed, Some(0), "exited with code 0"),
            ended(State::Completed, Some(0), "exited with code 0"),
        ];
        let o = combine(&r, "h", None);
        assert_eq!(o.state, State::Completed);
        assert_eq!(o.exit_code, Some(0));
        assert_eq!(o.started_ms, Some(5));
    }

    #[test]
    fn the_failing_rank_is_the_reason() {
        let r = vec![
            ended(
                State::Cancelled,
                None,
                "cancelled (SIGTERM from Slurm: scancel or Slurm time limit)",
            ),
            ended(State::Failed, Some(3), "exited with code 3"),
        ];
        let o = combine(&r, "h", Some("srun ended with exit status: 1"));
        assert_eq!(o.state, State::Failed);
        assert_eq!(o.exit_code, Some(3));
        assert!(o.reason.starts_with("rank 1 failed: exited with code 3"), "{}", o.reason);
        assert!(o.reason.contains("rank 0: cancelled, rank 1: 3"), "{}", o.reason);
    }

    #[test]
    fn a_missing_rank_fails_the_job() {
        let r = vec![ended(State::Completed, Some(0), "exited with code 0"), None];
        let o = combine(&r, "h", Some("srun ended with exit status: 1"));
        assert_eq!(o.state, State::Failed);
        assert!(o.reason.contains("rank 1 ended without an outcome (srun ended"), "{}", o.reason);
    }

    #[test]
    fn srun_argv_is_the_spank_form() {
        let a = srun_args("/usr/local/bin/sandbox-runner", Path::new("/home/a/j"), 2, "42");
        assert_eq!(&a[a.len() - 3..], ["/usr/local/bin/sandbox-runner", "rank", "/home/a/j"]);
        for pinned in ["--kill-on-bad-exit=1", "--jobid=42", "--prolog=none", "--epilog=none"] {
            assert!(a.contains(&pinned.to_string()), "{pinned} missing from {a:?}");
        }
        assert!(SRUN_ENV.iter().all(|(k, _)| !k.starts_with("SLURM")));
    }
}

//! One call, from its checked request to its answer: the job's one slot
//! on the node, the job directory pinned, the call's context, then the
//! container phase (a panic there is the call's failure, not the agent's).

use std::os::fd::OwnedFd;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use delegate_protocol::agent::{Answer, RunRequest};
use futures_util::FutureExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::caller::conn::Incoming;
use crate::caller::ident::{self, Caller};
use crate::sandbox::call::CheckedCall;
use crate::sandbox::stage::Staged;

use super::check::{checked_request, past_allocation_bound};
use super::container::{engine_phase, EngineConn};
use super::Shared;

/// The test-only pause between the checks and the container's creation:
/// honoured only when this file is root-owned and not writable by others
/// (written by the test fixture as root, never reachable by a job).
pub const TEST_PAUSE_FILE: &str = "/etc/delegate/agent-test-pause";

/// Removes the job from the running set when dropped.
pub(super) struct Slot<'a> {
    shared: &'a Shared,
    job: String,
}
impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Ok(mut r) = self.shared.running.lock() {
            r.remove(&self.job);
        }
        self.shared.progress.touch(&self.job);
    }
}

pub(super) fn test_pause() -> Option<Duration> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(TEST_PAUSE_FILE).ok()?;
    if m.uid() != 0 || m.mode() & 0o022 != 0 || !m.is_file() {
        return None;
    }
    let secs: f64 = std::fs::read_to_string(TEST_PAUSE_FILE).ok()?.trim().parse().ok()?;
    (secs > 0.0 && secs < 120.0).then(|| Duration::from_secs_f64(secs))
}

/// Runs one call; returns the answer that ends it.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    shared: &Shared,
    caller: &Caller,
    engine: &mut Option<EngineConn>,
    req: RunRequest,
    fds: Vec<OwnedFd>,
    stream: &UnixStream,
    rx: &mut mpsc::Receiver<Incoming>,
    place: Option<ident::RankPlace>,
) -> Answer {
    let mut fds = fds.into_iter();
    let (Some(dir), Some(out), Some(err)) = (fds.next(), fds.next(), fds.next()) else {
        return Answer::Refused("a run request needs the job directory and its output files".into());
    };
    let uid = caller.uid;
    let (policy, limits) = match checked_request(&req, uid, [&dir, &out, &err]) {
        Ok(p) => p,
        Err(answer) => return answer,
    };
    // (A rank is its job's one call, started with its step.)
    let bound = place.is_none().then_some(limits.max_allocation_secs);
    if let Some(why) = bound.and_then(|b| past_allocation_bound(caller, b)) {
        tracing::warn!("Slurm job {}: {why}", caller.job);
        return Answer::Refused(why);
    }
    let spec = req.spec;
    let gid = if req.gid == caller.gid || caller.groups.contains(&req.gid) {
        req.gid
    } else {
        caller.gid
    };
    let slurm_job = caller.job.clone();
    let alone;
    {
        let Ok(mut r) = shared.running.lock() else {
            return Answer::Failed("internal error in sandbox-agent: poisoned lock".into());
        };
        if !r.insert(slurm_job.clone()) {
            return Answer::Refused(format!("Slurm job {slurm_job} already has a sandbox running"));
        }
        alone = r.len() == 1;
    }
    let _slot = Slot { shared, job: slurm_job.clone() };
    if let Some(p) = test_pause() {
        tracing::warn!("job {slurm_job}: checks done, pausing {p:?} (test hook {TEST_PAUSE_FILE})");
        tokio::time::sleep(p).await;
    }
    if !caller.alive() {
        return Answer::Refused("the batch task has ended".into());
    }
    // Pin the checked inode at a root-owned path: the engine is given
    // only this path, which the user cannot rename.
    let staged = match Staged::new(&policy, &slurm_job, &dir) {
        Ok(s) => s,
        Err(e) => return Answer::Failed(format!("the delegate agent cannot stage the job directory: {e}")),
    };
    let ctx = CheckedCall {
        policy: &policy,
        host: delegate_protocol::host::hostname(),
        uid,
        gid,
        slurm_job: &slurm_job,
        spec: &spec,
        tmp_bytes: limits.tmp_bytes,
        max_output: limits.max_output_bytes,
        max_job_bytes: limits.max_job_bytes,
        max_job_files: policy.max_job_files,
        caller,
        node: shared.node.clone(),
        alone,
        place,
    };
    let answer = AssertUnwindSafe(engine_phase(&ctx, engine, &staged, &dir, out, err, stream, rx))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Answer::Failed(format!("internal error in sandbox-agent: {msg}"))
        });
    drop(staged);
    shared.republish.notify_one();
    answer
}

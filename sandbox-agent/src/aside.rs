//! A map's allocation that stepped aside, eligible again as soon as the
//! node it gave up is taken.
//!
//! An allocation steps aside by going back into Slurm's queue
//! (`scontrol requeue`), and Slurm holds a requeued job until its
//! credential has expired (`cred_expire`, 30 s here): once the other
//! student's short job was over, the node idled for the rest of that time
//! while the map's calls waited. The agent that told the allocation that
//! others wait ([`crate::queue`]) watches it: once it is pending again,
//! held only by that begin time, and no other user's job waits for its
//! partition any more (the one it stepped aside for has the node), it is
//! made eligible at once (`StartTime=now`, which the student could set on
//! their own job too). If others still wait, Slurm's own delay stands, as
//! before: the nodes are busy then, none idles. A requeued allocation never
//! counts as "others waiting" (crate::queue::others_waiting), so two maps
//! do not trade a node call by call.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ask::Question;
use crate::job::Shared;

/// How long an allocation is watched after it was told to step aside:
/// longer than Slurm's requeue delay, after which there is nothing to do.
const WATCH: Duration = Duration::from_secs(60);
/// Between two looks at the job.
const STEP: Duration = Duration::from_millis(500);
/// How long one scontrol may take.
const PATIENCE: Duration = Duration::from_secs(10);
/// At most this much of `scontrol show job`'s answer is read.
const MAX_ANSWER: usize = 64 << 10;
/// Allocations watched at once at most (one per node is the rule).
const MAX_WATCHED: usize = 64;

/// The allocations being watched.
#[derive(Default)]
pub struct Watched(Mutex<HashSet<String>>);

/// What became of a watched allocation.
#[derive(Debug, PartialEq, Eq)]
enum Watch {
    /// Made eligible at once.
    Hastened,
    /// It ended, started again or is pending for another reason.
    Over,
    /// Still held by its begin time when the watch ended: others waited.
    OthersWaited,
}

/// Watches Slurm job `job` (a map's allocation of `uid`, told that others
/// wait for `partition`), in the background, once at a time per job.
pub fn watch(shared: Arc<Shared>, job: String, partition: Option<String>, uid: u32) {
    {
        let mut watched = shared.aside.0.lock().unwrap_or_else(|p| p.into_inner());
        if watched.len() >= MAX_WATCHED || !watched.insert(job.clone()) {
            return;
        }
    }
    tokio::spawn(async move {
        match until_free(&shared, &job, partition.as_deref(), uid).await {
            Ok(Watch::Hastened) => tracing::info!(
                "Slurm job {job} stepped aside and the node it gave up is taken: eligible again at once"
            ),
            Ok(Watch::OthersWaited) => {
                tracing::info!("Slurm job {job} stepped aside; others still wait: Slurm's requeue delay stands")
            }
            Ok(Watch::Over) => {}
            Err(e) => tracing::warn!("Slurm job {job} stepped aside: {e}; Slurm's requeue delay stands"),
        }
        shared.aside.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&job);
    });
}

/// Looks at the job every [`STEP`] until it is requeued and nobody else
/// waits (then makes it eligible), or it is over, or [`WATCH`] passed.
async fn until_free(shared: &Shared, job: &str, partition: Option<&str>, uid: u32) -> Result<Watch, String> {
    let end = Instant::now() + WATCH;
    while Instant::now() < end {
        let answer = scontrol(&["show", "job", "-o", job]).await?;
        match held_by_begin_time(&answer) {
            Some(true) if !shared.queue.others_wait(partition, uid).await => {
                scontrol(&["update", &format!("jobid={job}"), "StartTime=now"]).await?;
                return Ok(Watch::Hastened);
            }
            Some(_) => {}
            None => return Ok(Watch::Over),
        }
        tokio::time::sleep(STEP).await;
    }
    Ok(Watch::OthersWaited)
}

/// From `scontrol show job -o`: `Some(true)` when the job is pending on its
/// begin time (requeued), `Some(false)` while it still runs or completes,
/// `None` when it is over or pending for another reason (nothing to do).
fn held_by_begin_time(answer: &str) -> Option<bool> {
    let field = |name: &str| {
        answer
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    match (field("JobState")?, field("Reason").unwrap_or("")) {
        ("PENDING", "BeginTime") => Some(true),
        ("RUNNING" | "COMPLETING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_FED", _) => Some(false),
        _ => None,
    }
}

async fn scontrol(args: &[&str]) -> Result<String, String> {
    let argv: Vec<&str> = std::iter::once("scontrol").chain(args.iter().copied()).collect();
    let question = Question {
        argv: &argv,
        patience: PATIENCE,
        max_answer: MAX_ANSWER,
        env: &[],
        clear_env: false,
    };
    question.ask().await.map_err(|e| format!("scontrol {}: {e}", args.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requeued_allocation_is_held_by_its_begin_time() {
        let show = |state: &str, reason: &str| {
            format!("JobId=12 ArrayJobId=11 JobName=delegate UserId=a(1000) JobState={state} Reason={reason} Dependency=(null) Requeue=1 Restarts=1")
        };
        assert_eq!(held_by_begin_time(&show("PENDING", "BeginTime")), Some(true));
        for running in ["RUNNING", "COMPLETING", "CONFIGURING"] {
            assert_eq!(held_by_begin_time(&show(running, "None")), Some(false), "{running}");
        }
        for (state, reason) in [
            ("PENDING", "Priority"),
            ("PENDING", "JobHeldUser"),
            ("COMPLETED", "None"),
            ("CANCELLED", "None"),
        ] {
            assert_eq!(held_by_begin_time(&show(state, reason)), None, "{state} {reason}");
        }
        assert_eq!(held_by_begin_time("slurm_load_jobs error: Invalid job id specified"), None);
        assert_eq!(held_by_begin_time(""), None);
    }
}

//! Whether another user's job waits for a partition: the question a map's
//! allocation asks between its calls (`Request::Queue`), so that it steps
//! aside when another student's job waits that has not run yet. Students do not see other users' jobs
//! (`PrivateData=jobs`); the agent, root, asks squeue, at most once per
//! [`FRESH`] per partition whoever asks.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::ask::{AskError, BoundedRun};

/// How long an answer is reused.
const FRESH: Duration = Duration::from_secs(1);
/// How long squeue may take.
const PATIENCE: Duration = Duration::from_secs(10);
/// At most this much of squeue's list of pending jobs is read.
const MAX_PENDING_ANSWER: usize = 64 << 20;
/// The partitions remembered at most (a caller names its own).
const MAX_PARTITIONS: usize = 64;

/// The last answers: partition ("" for any) → (when asked, the pending
/// jobs' `uid|reason` lines).
#[derive(Default)]
pub struct Cached(Mutex<HashMap<String, (Instant, String)>>);

impl Cached {
    /// Whether a job of another user than `uid` waits for `partition`'s
    /// nodes. A failed squeue says no (the allocation goes on; the agent's
    /// bound on its age still holds).
    pub async fn others_wait(&self, partition: Option<&str>, uid: u32) -> bool {
        let key = partition.filter(|p| is_partition(p)).unwrap_or("").to_owned();
        let mut cache = self.0.lock().await;
        let fresh = cache.get(&key).filter(|(at, _)| at.elapsed() < FRESH).map(|(_, l)| l.clone());
        let lines = match fresh {
            Some(l) => l,
            None => {
                let l = pending(&key).await.unwrap_or_else(|e| {
                    tracing::warn!("cannot ask Slurm whether others wait ({e}); a map's allocation goes on");
                    String::new()
                });
                if cache.len() >= MAX_PARTITIONS {
                    cache.clear();
                }
                cache.insert(key, (Instant::now(), l.clone()));
                l
            }
        };
        others_waiting(&lines, uid, &now_utc())
    }
}

/// A partition name as slurm.conf allows it (the caller's word for it).
fn is_partition(p: &str) -> bool {
    !p.is_empty() && p.len() <= 64 && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Now as squeue prints times with `TZ=UTC`: `YYYY-MM-DDTHH:MM:SS`.
fn now_utc() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S").to_string()
}

/// squeue's `uid|reason|eligible time|restarts` lines (UTC) of the
/// pending jobs of `partition` ("": all).
async fn pending(partition: &str) -> Result<String, AskError> {
    let mut argv = vec![
        "squeue",
        "-h",
        "-t",
        "PENDING",
        "-O",
        "UserId:|,Reason:|,EligibleTime:|,RestartCnt:",
    ];
    if !partition.is_empty() {
        argv.extend(["-p", partition]);
    }
    let question = BoundedRun {
        argv: &argv,
        deadline: PATIENCE,
        max_answer: MAX_PENDING_ANSWER,
        env: &[("TZ", "UTC")],
        clear_env: false,
    };
    question.ask().await
}

/// squeue's `uid|reason|eligible time|restarts` lines of pending jobs:
/// whether one of another user waits for nodes now and has not run yet:
/// not held, not waiting on a dependency, a begin time or its own limits,
/// eligible already, never requeued. A map's allocation that stepped aside
/// (requeued) waits for the one holding the node to finish or reach its
/// bound: were it counted, two maps would trade the node call by call,
/// each switch costing Slurm's requeue delay (cred_expire), and ten maps
/// left the node idle while every one of them waited out that delay.
pub fn others_waiting(squeue: &str, uid: u32, now: &str) -> bool {
    squeue.lines().any(|l| {
        let mut f = l.trim().split('|').map(str::trim);
        let (Some(u), Some(reason)) = (f.next(), f.next()) else {
            return false;
        };
        let (eligible, restarts) = (f.next().unwrap_or(""), f.next().unwrap_or("0"));
        let eligible_now = !eligible.starts_with(|c: char| c.is_ascii_digit()) || eligible <= now;
        u.parse::<u32>().is_ok_and(|u| u != uid)
            && matches!(reason, "None" | "Priority" | "Resources")
            && eligible_now
            && restarts == "0"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_waits_for_the_partition() {
        const NOW: &str = "2026-11-27T09:00:00";
        let waits = |lines: &str| others_waiting(lines, 1000, NOW);
        assert!(!waits(""));
        assert!(
            !waits("1000|Resources|2026-11-27T08:59:00\n1000|Priority|N/A\n"),
            "the same user's jobs"
        );
        assert!(waits("1000|Resources|2026-11-27T08:59:00\n1001|Priority|2026-11-27T08:59:00\n"));
        assert!(waits("1001|None|2026-11-27T09:00:00\n"), "just submitted");
        assert!(waits("1001|Resources|N/A\n"), "no eligible time: waits");
        for reason in [
            "Dependency",
            "JobHeldUser",
            "BeginTime",
            "QOSMaxJobsPerUserLimit",
            "AssocGrpCPURunMinutesLimit",
        ] {
            assert!(!waits(&format!("1001|{reason}|2026-11-27T08:00:00\n")), "{reason}");
        }
        assert!(!waits("1001|None|2026-11-27T09:00:31\n"), "requeued, eligible in 31 s");
        assert!(waits("1001|Priority|2026-11-27T08:59:00|0\n"));
        assert!(
            !waits("1001|Priority|2026-11-27T08:59:00|3\n"),
            "a map's allocation that stepped aside before waits its turn"
        );
        assert!(!waits("garbage\nx|Resources|N/A\n"));
    }

    #[test]
    fn partition_names() {
        assert!(is_partition("delegate") && is_partition("gpu-a100.x"));
        for bad in ["", "a b", "a;b", "-x\n", &"p".repeat(65)] {
            assert!(!is_partition(bad), "{bad:?}");
        }
    }
}

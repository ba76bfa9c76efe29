//! Whether another user's job waits for a partition: the question a map's
//! allocation asks between its calls (`Request::Queue`), so that it steps
//! aside when another student waits. Students do not see other users' jobs
//! (`PrivateData=jobs`); the agent, root, asks squeue, at most once per
//! [`FRESH`] per partition whoever asks.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// How long an answer is reused.
const FRESH: Duration = Duration::from_secs(1);
/// How long squeue may take.
const PATIENCE: Duration = Duration::from_secs(10);
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
        others_waiting(&lines, uid)
    }
}

/// A partition name as slurm.conf allows it (the caller's word for it).
fn is_partition(p: &str) -> bool {
    !p.is_empty() && p.len() <= 64 && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// squeue's `uid|reason` lines of the pending jobs of `partition` ("": all).
async fn pending(partition: &str) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new("squeue");
    cmd.args(["-h", "-t", "PENDING", "-o", "%U|%r"]);
    if !partition.is_empty() {
        cmd.args(["-p", partition]);
    }
    let run = cmd.stdin(std::process::Stdio::null()).kill_on_drop(true).output();
    let out = tokio::time::timeout(PATIENCE, run)
        .await
        .map_err(|_| format!("squeue took more than {PATIENCE:?}"))?
        .map_err(|e| format!("cannot run squeue: {e}"))?;
    if !out.status.success() {
        return Err(format!("squeue failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// squeue's `%U|%r` lines of pending jobs: whether one of another user
/// waits for nodes (not one held, waiting on a dependency, a begin time or
/// its own limits).
pub fn others_waiting(squeue: &str, uid: u32) -> bool {
    squeue.lines().any(|l| {
        let Some((u, reason)) = l.trim().split_once('|') else {
            return false;
        };
        u.parse::<u32>().is_ok_and(|u| u != uid) && matches!(reason.trim(), "None" | "Priority" | "Resources")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_waits_for_the_partition() {
        assert!(!others_waiting("", 1000));
        assert!(!others_waiting("1000|Resources\n1000|Priority\n", 1000), "the same user's jobs");
        assert!(others_waiting("1000|Resources\n1001|Priority\n", 1000));
        assert!(others_waiting("1001|None\n", 1000), "just submitted");
        for reason in [
            "Dependency",
            "JobHeldUser",
            "BeginTime",
            "QOSMaxJobsPerUserLimit",
            "AssocGrpCPURunMinutesLimit",
        ] {
            assert!(!others_waiting(&format!("1001|{reason}\n"), 1000), "{reason}");
        }
        assert!(!others_waiting("garbage\nx|Resources\n", 1000));
    }

    #[test]
    fn partition_names() {
        assert!(is_partition("delegate") && is_partition("gpu-a100.x"));
        for bad in ["", "a b", "a;b", "-x\n", &"p".repeat(65)] {
            assert!(!is_partition(bad), "{bad:?}");
        }
    }
}

//! When each waiting job will likely start, from what Slurm's queue shows
//! the helper over time: the running jobs end as the jobs it saw end
//! lately lasted (their typical duration, within each one's time limit),
//! and the waiting jobs in line take the nodes as they free, in Slurm's
//! order, each lasting as long. Slurm's own estimate (`squeue --start`)
//! counts every job as running to its time limit, a latest start that in a
//! rush of short calls is hours off; this one is a likely start.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use delegate_client::slurm::usage::QueuedJob;

/// How many of the latest durations are kept.
const KEEP: usize = 200;
/// How many durations must have been seen before an estimate is made.
const AT_LEAST: usize = 3;

/// The durations of the jobs seen ending, latest last.
#[derive(Debug, Default)]
pub struct Durations {
    recent: VecDeque<u64>,
    /// Each job running at the last read, with how long it had run then.
    running: HashMap<String, u64>,
}

impl Durations {
    /// Learns from one read of the queue: a job running at the last read
    /// and not running now has ended, having lasted (at least) what it had
    /// run then.
    pub fn observe(&mut self, queue: &[QueuedJob]) {
        let now: HashMap<String, u64> = queue
            .iter()
            .filter(|j| j.state == "RUNNING")
            .filter_map(|j| Some((j.job_id.clone(), j.elapsed_secs()?)))
            .collect();
        for (job, lasted) in self.running.drain() {
            if !now.contains_key(&job) {
                if self.recent.len() == KEEP {
                    self.recent.pop_front();
                }
                self.recent.push_back(lasted.max(1));
            }
        }
        self.running = now;
    }

    /// The median of the latest durations; None before [`AT_LEAST`].
    pub fn typical(&self) -> Option<u64> {
        if self.recent.len() < AT_LEAST {
            return None;
        }
        let mut v: Vec<u64> = self.recent.iter().copied().collect();
        v.sort_unstable();
        Some(v[v.len() / 2])
    }
}

/// How much longer a job that has run `elapsed` will likely run, when jobs
/// typically last `typical`: the rest of that, or half of it once it has
/// run longer; never past its time limit.
fn remaining(elapsed: u64, limit: Option<u64>, typical: u64) -> u64 {
    let likely = typical.saturating_sub(elapsed).max(typical / 2);
    limit.map_or(likely, |l| likely.min(l.saturating_sub(elapsed)))
}

/// Seconds from the read of `queue` (Slurm's order) until each waiting
/// job in line (`in_line`) likely starts, when jobs typically last
/// `typical`. Empty without a typical duration or when nothing runs (then
/// nodes are free or down, and only Slurm knows why a job waits).
pub fn likely_starts(
    queue: &[QueuedJob],
    typical: Option<u64>,
    in_line: impl Fn(&QueuedJob) -> bool,
) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    let Some(typical) = typical else {
        return out;
    };
    let mut free: BinaryHeap<Reverse<u64>> = queue
        .iter()
        .filter(|j| matches!(j.state.as_str(), "RUNNING" | "CONFIGURING" | "COMPLETING"))
        .map(|j| match j.state.as_str() {
            "COMPLETING" => Reverse(0),
            _ => Reverse(remaining(j.elapsed_secs().unwrap_or(0), j.limit_secs(), typical)),
        })
        .collect();
    if free.is_empty() {
        return out;
    }
    for j in queue.iter().filter(|j| j.state == "PENDING" && in_line(j)) {
        let Some(Reverse(start)) = free.pop() else {
            break;
        };
        out.insert(j.job_id.clone(), start);
        let lasts = j.limit_secs().map_or(typical, |l| typical.min(l));
        free.push(Reverse(start.saturating_add(lasts)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, state: &str, time: &str, limit: &str) -> QueuedJob {
        QueuedJob {
            job_id: id.into(),
            user: "ann".into(),
            state: state.into(),
            reason: "Priority".into(),
            priority: 1,
            time: time.into(),
            time_limit: limit.into(),
            submitted: String::new(),
        }
    }

    #[test]
    fn a_job_running_at_one_read_and_gone_at_the_next_lasted_what_it_had_run() {
        let mut d = Durations::default();
        d.observe(&[job("1", "RUNNING", "0:50", "5:00"), job("2", "RUNNING", "0:10", "5:00")]);
        assert_eq!(d.typical(), None, "nothing ended yet");
        // 1 ended; 2 completes (no longer running: ended too); 3 started.
        d.observe(&[
            job("2", "COMPLETING", "0:12", "5:00"),
            job("3", "RUNNING", "0:01", "5:00"),
        ]);
        d.observe(&[job("4", "RUNNING", "0:01", "5:00")]);
        // 1: 50 s, 2: 10 s, 3: 1 s; a job not seen running (4 before) is
        // not counted until it ends.
        assert_eq!(d.typical(), Some(10));
        // Only the latest KEEP count.
        for i in 0..KEEP {
            d.observe(&[job(&format!("x{i}"), "RUNNING", "1:40", "5:00")]);
        }
        d.observe(&[]);
        assert_eq!(d.typical(), Some(100));
    }

    #[test]
    fn the_jobs_in_line_take_the_nodes_as_the_running_ones_end() {
        let q = vec![
            // Two nodes: one 20 s into a typical 60 s job, one past it.
            job("1", "RUNNING", "0:20", "10:00"),
            job("2", "RUNNING", "2:00", "10:00"),
            job("3", "PENDING", "0:00", "10:00"),
            job("4", "PENDING", "0:00", "10:00"),
            job("held", "PENDING", "0:00", "10:00"),
            job("5", "PENDING", "0:00", "0:10"),
            job("6", "PENDING", "0:00", "10:00"),
        ];
        let starts = likely_starts(&q, Some(60), |j| j.job_id != "held");
        // Node 2 (past typical: half of it left) frees at 30 s, node 1 at
        // 40 s; 3 takes node 2 until 90, 4 node 1 until 100; 5 (a 10 s
        // limit) takes node 2 at 90 until 100, 6 the first free at 100.
        assert_eq!(starts["3"], 30);
        assert_eq!(starts["4"], 40);
        assert_eq!(starts["5"], 90);
        assert_eq!(starts["6"], 100);
        assert!(!starts.contains_key("held"));
    }

    #[test]
    fn no_estimate_without_durations_or_without_running_jobs() {
        let q = vec![
            job("1", "RUNNING", "0:20", "10:00"),
            job("2", "PENDING", "0:00", "10:00"),
        ];
        assert!(likely_starts(&q, None, |_| true).is_empty());
        let idle = vec![job("2", "PENDING", "0:00", "10:00")];
        assert!(likely_starts(&idle, Some(60), |_| true).is_empty());
    }

    #[test]
    fn a_running_job_never_outlasts_its_time_limit() {
        assert_eq!(remaining(50, Some(60), 600), 10);
        assert_eq!(remaining(0, None, 600), 600);
        assert_eq!(remaining(900, None, 600), 300);
        assert_eq!(remaining(900, Some(60), 600), 0);
    }
}

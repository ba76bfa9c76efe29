//! When each waiting job will likely start, from what Slurm's queue shows
//! the helper over time: the running jobs end as the jobs it saw end
//! lately lasted (their typical duration, within each one's time limit),
//! and the waiting jobs in line take the nodes as they free, in Slurm's
//! order, each lasting as long. Slurm's own estimate (`squeue --start`)
//! counts every job as running to its time limit, a latest start that in a
//! rush of short calls is hours off; this one is a likely start. What the
//! simulation does not see (the node's turnover between two jobs, a
//! requeued map's wait) it learns from its own misses: [`Calibration`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

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

/// How many of the latest misses are kept.
const KEEP_MISSES: usize = 100;
/// How many misses must have been seen before estimates are corrected.
const MISSES_AT_LEAST: usize = 5;
/// An estimate shorter than this says too little of how far off they run.
const MIN_SAID_S: u64 = 10;
/// The correction's bounds: the simulation is never trusted less than this.
const FACTOR_BOUNDS: (f64, f64) = (0.5, 4.0);
/// At most this many waiting jobs' first estimates are remembered.
const MAX_SAID: usize = 20_000;

/// How far off the estimates ran: the first likely start said for each
/// waiting job against when it started (a read's time less the job's
/// elapsed time); the median of the latest ratios scales the next
/// estimates. It absorbs what the simulation leaves out, chiefly each
/// node's turnover between two jobs (epilog, Slurm's scheduling pass,
/// prolog), which adds up over many short jobs in line.
#[derive(Debug, Default)]
pub struct Calibration {
    /// Waiting job → (when its first estimate was said, the estimate), in seconds.
    said: HashMap<String, (u64, u64)>,
    /// Started after / said, latest last.
    misses: VecDeque<f64>,
}

impl Calibration {
    /// Learns from one read of the queue at `now_s` (seconds since the
    /// epoch): a job said to start in `s` seconds that runs now waited
    /// (now less its elapsed time) less when it was said. Jobs no longer
    /// waiting in line (`in_line`: gone without starting, held, requeued to
    /// wait for a begin time) are forgotten: a student who holds or
    /// requeues their own jobs makes no miss of the helper's.
    pub fn observe(&mut self, queue: &[QueuedJob], now_s: u64, in_line: impl Fn(&QueuedJob) -> bool) {
        for j in queue.iter().filter(|j| j.state == "RUNNING") {
            let Some((at, said)) = self.said.remove(&j.job_id) else {
                continue;
            };
            let waited = now_s.saturating_sub(j.elapsed_secs().unwrap_or(0)).saturating_sub(at);
            if said >= MIN_SAID_S {
                if self.misses.len() == KEEP_MISSES {
                    self.misses.pop_front();
                }
                self.misses.push_back(waited as f64 / said as f64);
            }
        }
        let waiting: HashSet<&str> = queue.iter().filter(|j| in_line(j)).map(|j| j.job_id.as_str()).collect();
        self.said.retain(|job, _| waiting.contains(job.as_str()));
    }

    /// Remembers the first estimate said for each job (`starts`, from the
    /// simulation, before [`Calibration::correct`]).
    pub fn remember(&mut self, starts: &HashMap<String, u64>, now_s: u64) {
        for (job, s) in starts {
            if self.said.len() >= MAX_SAID {
                break;
            }
            self.said.entry(job.clone()).or_insert((now_s, *s));
        }
    }

    /// The median of the latest misses, within [`FACTOR_BOUNDS`]; 1 before
    /// [`MISSES_AT_LEAST`] of them.
    pub fn factor(&self) -> f64 {
        if self.misses.len() < MISSES_AT_LEAST {
            return 1.0;
        }
        let mut v: Vec<f64> = self.misses.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2].clamp(FACTOR_BOUNDS.0, FACTOR_BOUNDS.1)
    }

    /// The simulation's estimates scaled by [`Calibration::factor`].
    pub fn correct(&self, starts: &mut HashMap<String, u64>) {
        let f = self.factor();
        for s in starts.values_mut() {
            *s = (*s as f64 * f).round() as u64;
        }
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

    /// Jobs j0..j4 in `state`, each having run `time`.
    fn five(state: &str, time: &str) -> Vec<QueuedJob> {
        (0..5).map(|i| job(&format!("j{i}"), state, time, "5:00")).collect()
    }

    fn pending(j: &QueuedJob) -> bool {
        j.state == "PENDING"
    }

    #[test]
    fn estimates_that_ran_late_are_scaled_by_how_late_they_ran() {
        let mut c = Calibration::default();
        let now = 1_000_000;
        // Five jobs said to start in 20 s each start 40 s later.
        let said: HashMap<String, u64> = (0..5).map(|i| (format!("j{i}"), 20)).collect();
        c.remember(&said, now);
        c.observe(&five("PENDING", "0:00"), now + 20, pending);
        assert_eq!(c.factor(), 1.0, "none started yet");
        // They run at now + 45, each 5 s in: they started at now + 40.
        c.observe(&five("RUNNING", "0:05"), now + 45, pending);
        assert_eq!(c.factor(), 2.0);
        let mut next: HashMap<String, u64> = [("k".to_string(), 30)].into();
        c.correct(&mut next);
        assert_eq!(next["k"], 60);
    }

    #[test]
    fn short_estimates_and_jobs_that_never_started_teach_nothing() {
        let mut c = Calibration::default();
        let said: HashMap<String, u64> = (0..9).map(|i| (format!("j{i}"), if i < 6 { 2 } else { 30 })).collect();
        c.remember(&said, 0);
        // j0..j5 (said 2 s) start late, j6 is cancelled, j7, j8 start.
        let q: Vec<QueuedJob> = (0..6)
            .map(|i| job(&format!("j{i}"), "RUNNING", "0:00", "5:00"))
            .chain([
                job("j7", "RUNNING", "0:00", "5:00"),
                job("j8", "RUNNING", "0:00", "5:00"),
            ])
            .collect();
        c.observe(&q, 60, pending);
        assert_eq!(c.factor(), 1.0, "two misses are not enough");
        assert!(c.said.is_empty(), "j6 left the queue: forgotten");
        // A job its student held (or requeued: waiting for a begin time)
        // is forgotten too, and teaches nothing when it runs at last.
        c.remember(&[("h".to_string(), 20)].into(), 100);
        let mut held = job("h", "PENDING", "0:00", "5:00");
        held.reason = "JobHeldUser".into();
        c.observe(&[held], 110, |j| j.state == "PENDING" && j.reason != "JobHeldUser");
        assert!(c.said.is_empty(), "a held job is forgotten");
        // A second estimate of a job does not replace its first.
        c.remember(&[("a".to_string(), 10)].into(), 100);
        c.remember(&[("a".to_string(), 99)].into(), 200);
        assert_eq!(c.said["a"], (100, 10));
    }

    #[test]
    fn the_correction_stays_within_its_bounds() {
        let mut c = Calibration::default();
        c.misses.extend([100.0; 5]);
        assert_eq!(c.factor(), FACTOR_BOUNDS.1);
        c.misses = [0.0; 5].into();
        assert_eq!(c.factor(), FACTOR_BOUNDS.0);
    }

    #[test]
    fn a_running_job_never_outlasts_its_time_limit() {
        assert_eq!(remaining(50, Some(60), 600), 10);
        assert_eq!(remaining(0, None, 600), 600);
        assert_eq!(remaining(900, None, 600), 300);
        assert_eq!(remaining(900, Some(60), 600), 0);
    }
}

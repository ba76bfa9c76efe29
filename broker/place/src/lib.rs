//! The place helper's logic: from one read of Slurm's queue (every user's
//! jobs, as Slurm's user sees them), where each waiting job of one user
//! stands ([`places`]), and a snapshot of the queue read again at most
//! every few seconds however many students ask ([`Snapshot`]). The binary
//! (`src/main.rs`) only wires it to its socket.

use std::time::{Duration, Instant};

use delegate_client::slurm::usage::QueuedJob;
use delegate_protocol::place::{Place, PlaceAnswer, MAX_PLACES};

/// Reasons of waiting jobs that Slurm will not start by priority alone:
/// held, or waiting for a time or for another job. Not counted ahead.
const NOT_IN_LINE: &[&str] = &[
    "JobHeldUser",
    "JobHeldAdmin",
    "BeginTime",
    "Dependency",
    "DependencyNeverSatisfied",
];

fn in_line(j: &QueuedJob) -> bool {
    j.state == "PENDING" && !NOT_IN_LINE.contains(&j.reason.as_str())
}

/// The waiting jobs of `user` (a name, or a uid as squeue prints one it
/// cannot name) in `queue` (Slurm's order: [`QueuedJob`]s as
/// `Slurm::queue_all` sorts them), each with the number of waiting jobs
/// in line before it. At most [`MAX_PLACES`].
pub fn places(queue: &[QueuedJob], user: &str, uid: u32) -> Vec<Place> {
    let uid = uid.to_string();
    let mut ahead: u32 = 0;
    let mut out = Vec::new();
    for j in queue.iter().filter(|j| j.state == "PENDING") {
        if (j.user == user || j.user == uid) && out.len() < MAX_PLACES {
            out.push(Place { job: j.job_id.clone(), ahead });
        }
        if in_line(j) {
            ahead = ahead.saturating_add(1);
        }
    }
    out
}

/// The last read of Slurm's queue, read again when it is older than
/// `every` (a failed read is kept as long: Slurm is not asked more often
/// when it fails).
pub struct Snapshot<F> {
    read: F,
    every: Duration,
    last: Option<(Instant, u64, Result<Vec<QueuedJob>, String>)>,
}

impl<F> Snapshot<F>
where
    F: FnMut() -> Result<Vec<QueuedJob>, String>,
{
    pub fn new(read: F, every: Duration) -> Self {
        Snapshot { read, every, last: None }
    }

    /// The answer for `user` (`uid`), from a queue at most `every` old.
    pub fn answer(&mut self, user: &str, uid: u32) -> PlaceAnswer {
        let stale = self.last.as_ref().is_none_or(|(at, _, _)| at.elapsed() >= self.every);
        if stale {
            let read = (self.read)();
            self.last = Some((Instant::now(), delegate_protocol::now_ms(), read));
        }
        match &self.last {
            Some((_, ms, Ok(queue))) => PlaceAnswer {
                as_of_ms: *ms,
                places: places(queue, user, uid),
                unavailable: None,
            },
            Some((_, ms, Err(why))) => PlaceAnswer {
                as_of_ms: *ms,
                places: Vec::new(),
                unavailable: Some(why.clone()),
            },
            None => PlaceAnswer::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, user: &str, state: &str, reason: &str) -> QueuedJob {
        QueuedJob {
            job_id: id.into(),
            user: user.into(),
            state: state.into(),
            reason: reason.into(),
            priority: 1,
            time: String::new(),
            time_limit: String::new(),
            submitted: String::new(),
        }
    }

    #[test]
    fn each_waiting_job_counts_the_jobs_in_line_before_it() {
        let q = vec![
            job("1", "ann", "RUNNING", "None"),
            job("2", "ben", "PENDING", "Resources"),
            job("3", "ann", "PENDING", "Priority"),
            job("4", "cid", "PENDING", "JobHeldUser"),
            job("5_0", "ben", "PENDING", "Priority"),
            job("5_1", "ben", "PENDING", "Priority"),
            job("6", "ann", "PENDING", "Priority"),
            job("7", "2001", "PENDING", "Priority"),
        ];
        let ann = places(&q, "ann", 1000);
        assert_eq!(
            ann,
            vec![
                Place { job: "3".into(), ahead: 1 },
                // (ben's held one is not in line; ann's own is)
                Place { job: "6".into(), ahead: 4 },
            ]
        );
        // A user squeue could not name is found by uid; nobody else's
        // jobs are ever listed.
        assert_eq!(places(&q, "dee", 2001), vec![Place { job: "7".into(), ahead: 5 }]);
        assert_eq!(places(&q, "eve", 3000), vec![]);
    }

    #[test]
    fn slurm_is_read_at_most_once_per_interval_however_many_ask() {
        let mut reads = 0;
        let mut snap = Snapshot::new(
            || {
                reads += 1;
                Ok(vec![job("9", "ann", "PENDING", "Priority")])
            },
            Duration::from_secs(60),
        );
        for _ in 0..100 {
            let a = snap.answer("ann", 1000);
            assert_eq!(a.places, vec![Place { job: "9".into(), ahead: 0 }]);
        }
        drop(snap);
        assert_eq!(reads, 1);
    }

    #[test]
    fn a_failed_read_says_why_and_is_not_retried_at_once() {
        let mut reads = 0;
        let mut snap = Snapshot::new(
            || {
                reads += 1;
                Err("squeue failed: Unable to contact slurm controller".to_owned())
            },
            Duration::from_secs(60),
        );
        let a = snap.answer("ann", 1000);
        assert!(a.places.is_empty());
        assert_eq!(
            a.unavailable.as_deref(),
            Some("squeue failed: Unable to contact slurm controller")
        );
        snap.answer("ann", 1000);
        drop(snap);
        assert_eq!(reads, 1);
    }
}

//! The place helper's logic: from one read of Slurm's queue (every user's
//! jobs, as Slurm's user sees them), where each waiting job of one user
//! stands ([`places`]) and when it will likely start ([`estimate`]), read
//! again at most every few seconds however many students ask, in the
//! background while they are answered from the last read ([`latest`]).
//! The binary (`src/main.rs`) only wires it to its socket.

pub mod estimate;
pub mod latest;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use delegate_client::slurm::usage::QueuedJob;
use delegate_protocol::place::{Place, PlaceAnswer, MAX_PLACES};

use crate::estimate::{likely_starts, Calibration, Durations};

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
/// in line before it and its likely start in `starts` (seconds, by job).
/// Root (uid 0, the instructor on the machine and the rush benchmark) is
/// told of every waiting job. At most [`MAX_PLACES`].
pub fn places(queue: &[QueuedJob], starts: &HashMap<String, u64>, user: &str, uid: u32) -> Vec<Place> {
    let everyone = uid == 0;
    let uid = uid.to_string();
    let mut ahead: u32 = 0;
    let mut out = Vec::new();
    for j in queue.iter().filter(|j| j.state == "PENDING") {
        if (everyone || j.user == user || j.user == uid) && out.len() < MAX_PLACES {
            let likely_in_s = starts.get(&j.job_id).map(|&s| u32::try_from(s).unwrap_or(u32::MAX));
            out.push(Place {
                job: j.job_id.clone(),
                ahead,
                likely_in_s,
            });
        }
        if in_line(j) {
            ahead = ahead.saturating_add(1);
        }
    }
    out
}

/// One read of Slurm's queue and the likely starts it gives.
#[derive(Debug)]
pub struct Read {
    at: Instant,
    at_ms: u64,
    queue: Result<Vec<QueuedJob>, String>,
    starts: HashMap<String, u64>,
}

impl Read {
    /// A read that failed for `why`.
    pub fn failed(why: &str) -> Self {
        Read {
            at: Instant::now(),
            at_ms: delegate_protocol::now_ms(),
            queue: Err(why.to_owned()),
            starts: HashMap::new(),
        }
    }

    /// How long ago the queue was read.
    pub fn age(&self) -> Duration {
        self.at.elapsed()
    }

    /// The answer for `user` (`uid`) from this read.
    pub fn answer(&self, user: &str, uid: u32) -> PlaceAnswer {
        match &self.queue {
            Ok(queue) => PlaceAnswer {
                as_of_ms: self.at_ms,
                places: places(queue, &self.starts, user, uid),
                unavailable: None,
            },
            Err(why) => PlaceAnswer {
                as_of_ms: self.at_ms,
                places: Vec::new(),
                unavailable: Some(why.clone()),
            },
        }
    }
}

/// Reads Slurm's queue (`read`) and learns over the reads the durations
/// of the jobs seen ending and how far off the likely starts said ran.
/// Its reads are answered from by [`latest::Latest`], which keeps them off
/// the path of the students' answers.
pub struct Reader<F> {
    read: F,
    durations: Durations,
    calibration: Calibration,
}

impl<F> Reader<F>
where
    F: FnMut() -> Result<Vec<QueuedJob>, String>,
{
    pub fn new(read: F) -> Self {
        Reader {
            read,
            durations: Durations::default(),
            calibration: Calibration::default(),
        }
    }

    /// Reads the queue once and gives each waiting job its likely start.
    pub fn read(&mut self) -> Read {
        // (the time the read began: every job submitted before is in it)
        let at_ms = delegate_protocol::now_ms();
        let queue = (self.read)();
        let starts = match &queue {
            Ok(q) => self.likely_starts(q, at_ms / 1000),
            Err(_) => HashMap::new(),
        };
        Read { at: Instant::now(), at_ms, queue, starts }
    }

    fn likely_starts(&mut self, q: &[QueuedJob], now_s: u64) -> HashMap<String, u64> {
        self.durations.observe(q);
        let before = self.calibration.factor();
        self.calibration.observe(q, now_s, in_line);
        let after = self.calibration.factor();
        if (after - before).abs() >= 0.1 {
            tracing::info!("likely starts now scaled by {after:.2} (how late the last estimated jobs started)");
        }
        let mut starts = likely_starts(q, self.durations.typical(), in_line);
        self.calibration.remember(&starts, now_s);
        self.calibration.correct(&mut starts);
        starts
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
        let none = HashMap::new();
        let ann = places(&q, &none, "ann", 1000);
        assert_eq!(
            ann,
            vec![
                Place {
                    job: "3".into(),
                    ahead: 1,
                    likely_in_s: None
                },
                // (ben's held one is not in line; ann's own is)
                Place {
                    job: "6".into(),
                    ahead: 4,
                    likely_in_s: None
                },
            ]
        );
        // A user squeue could not name is found by uid; nobody else's
        // jobs are ever listed.
        assert_eq!(
            places(&q, &none, "dee", 2001),
            vec![Place {
                job: "7".into(),
                ahead: 5,
                likely_in_s: None
            }]
        );
        assert_eq!(places(&q, &none, "eve", 3000), vec![]);
        // Root is told of every waiting job.
        let all: Vec<String> = places(&q, &none, "root", 0).into_iter().map(|p| p.job).collect();
        assert_eq!(all, ["2", "3", "4", "5_0", "5_1", "6", "7"]);
    }

    #[test]
    fn a_likely_start_comes_once_the_helper_has_seen_jobs_end() {
        let run = |id: &str, user: &str, t: &str| QueuedJob {
            time: t.into(),
            time_limit: "10:00".into(),
            ..job(id, user, "RUNNING", "None")
        };
        let wait = |id: &str, user: &str| QueuedJob {
            time_limit: "10:00".into(),
            ..job(id, user, "PENDING", "Priority")
        };
        // Three jobs of 30 s seen ending, one after the other, while ann's
        // job waits behind ben's.
        let reads = [
            vec![run("1", "ben", "0:30"), wait("9", "ben"), wait("10", "ann")],
            vec![run("2", "ben", "0:30"), wait("9", "ben"), wait("10", "ann")],
            vec![run("3", "ben", "0:30"), wait("9", "ben"), wait("10", "ann")],
            vec![run("4", "ben", "0:10"), wait("9", "ben"), wait("10", "ann")],
        ];
        let mut n = 0;
        let mut reader = Reader::new(|| {
            n += 1;
            Ok(reads[(n - 1).min(reads.len() - 1)].clone())
        });
        let first = reader.read().answer("ann", 1000);
        assert_eq!(
            first.places,
            vec![Place {
                job: "10".into(),
                ahead: 1,
                likely_in_s: None
            }]
        );
        reader.read();
        reader.read();
        // Typical 30 s: 4 ends in 20 s, ben's 9 runs until 50, ann's starts.
        let later = reader.read().answer("ann", 1000);
        assert_eq!(
            later.places,
            vec![Place {
                job: "10".into(),
                ahead: 1,
                likely_in_s: Some(50)
            }]
        );
    }

    #[test]
    fn a_failed_read_says_why() {
        let mut reader = Reader::new(|| Err("squeue failed: Unable to contact slurm controller".to_owned()));
        let a = reader.read().answer("ann", 1000);
        assert!(a.places.is_empty());
        assert_eq!(
            a.unavailable.as_deref(),
            Some("squeue failed: Unable to contact slurm controller")
        );
    }
}

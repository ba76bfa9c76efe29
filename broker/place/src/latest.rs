//! The last read of Slurm's queue, shared between the thread that reads
//! it and the students' answers. In a rush `squeue` over every user's jobs
//! takes seconds, longer than a client waits for its answer (one second);
//! so an answer never waits for a read in progress: it is made from the
//! last read, which it asks to be renewed once that is an interval old.
//! Only the first answer after a quiet spell (no read, or one several
//! intervals old) waits a moment for a fresh read. Slurm is read only
//! while students ask, at most once per interval.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use delegate_client::slurm::usage::QueuedJob;

use crate::{Read, Reader};

/// A read older than this many intervals is too old to answer from
/// without waiting a moment for a fresh one.
const TOO_OLD_INTERVALS: u32 = 3;
/// How long an answer waits for a fresh read when the last one is too old
/// or there is none: well under the client's one second.
pub const WAIT_FOR_FRESH: Duration = Duration::from_millis(400);

/// How long answers trust an old read, and wait for a new one.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    /// A read this old is asked to be renewed.
    pub every: Duration,
    /// A read this old (or none) makes an answer wait for the next read...
    pub too_old: Duration,
    /// ...this long at most.
    pub wait: Duration,
}

impl Patience {
    /// The helper's: renew every `every`, wait [`WAIT_FOR_FRESH`] for a
    /// read [`TOO_OLD_INTERVALS`] intervals old.
    pub fn every(every: Duration) -> Self {
        Patience {
            every,
            too_old: every.saturating_mul(TOO_OLD_INTERVALS),
            wait: WAIT_FOR_FRESH,
        }
    }
}

#[derive(Default)]
struct State {
    read: Option<Arc<Read>>,
    /// An answer wants a newer read than `read`.
    wanted: bool,
    /// Reads published so far.
    reads: u64,
    /// The count of reads at which an answer last waited for a newer one
    /// in vain: the answers after it do not wait again for that read (one
    /// connection at a time is served, and a hung squeue must not make
    /// every caller wait in turn).
    waited_in_vain_at: Option<u64>,
    /// Answers that waited for a read.
    waits: u64,
}

/// The last read, and whether answers want a newer one.
pub struct Latest {
    patience: Patience,
    state: Mutex<State>,
    changed: Condvar,
}

impl Latest {
    pub fn new(patience: Patience) -> Arc<Self> {
        Arc::new(Latest {
            patience,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The read to answer from (None when the queue has not been read
    /// yet); asks for a new one when it is an interval old, and waits for
    /// it a moment when it is too old.
    pub fn for_answer(&self) -> Option<Arc<Read>> {
        let p = self.patience;
        let mut st = self.lock();
        let age = st.read.as_ref().map(|r| r.age());
        if age.is_none_or(|a| a >= p.every) && !st.wanted {
            st.wanted = true;
            self.changed.notify_all();
        }
        if age.is_none_or(|a| a >= p.too_old) && st.waited_in_vain_at != Some(st.reads) {
            let seen = st.reads;
            st.waits += 1;
            st = self
                .changed
                .wait_timeout_while(st, p.wait, |s| s.reads == seen)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if st.reads == seen {
                st.waited_in_vain_at = Some(seen);
            }
        }
        st.read.clone()
    }

    /// For the reading thread: waits until an answer wants a new read.
    fn wait_wanted(&self) {
        let st = self.lock();
        let mut st = self
            .changed
            .wait_while(st, |s| !s.wanted)
            .unwrap_or_else(PoisonError::into_inner);
        st.wanted = false;
    }

    fn publish(&self, read: Read) {
        let mut st = self.lock();
        st.read = Some(Arc::new(read));
        st.reads += 1;
        // (the answers that wanted it while it was read have it)
        st.wanted = false;
        self.changed.notify_all();
    }
}

/// Starts the thread that reads the queue with `reader` whenever answers
/// want a newer read, at most once per interval.
pub fn spawn<F>(latest: Arc<Latest>, mut reader: Reader<F>) -> std::io::Result<JoinHandle<()>>
where
    F: FnMut() -> Result<Vec<QueuedJob>, String> + Send + 'static,
{
    std::thread::Builder::new().name("read-queue".into()).spawn(move || loop {
        latest.wait_wanted();
        let began = Instant::now();
        // A read that panics is a failed read: answered as one, and the
        // next is tried an interval later (a helper whose reading thread
        // died would answer from an ever older read).
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.read())).unwrap_or_else(|_| {
            tracing::error!("reading Slurm's queue failed unexpectedly (a panic); the next read is tried");
            Read::failed("the place helper could not read Slurm's queue")
        });
        let took = began.elapsed();
        if took >= latest.patience.every {
            tracing::info!("reading Slurm's queue took {took:.1?}, longer than the interval; students are answered from the read before");
        }
        latest.publish(read);
        std::thread::sleep(latest.patience.every.saturating_sub(took));
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc;

    fn waiting(id: &str) -> Vec<QueuedJob> {
        vec![QueuedJob {
            job_id: id.into(),
            user: "ann".into(),
            state: "PENDING".into(),
            reason: "Priority".into(),
            priority: 1,
            time: String::new(),
            time_limit: String::new(),
            submitted: String::new(),
        }]
    }

    fn jobs(read: &Read) -> Vec<String> {
        read.answer("ann", 1000).places.into_iter().map(|p| p.job).collect()
    }

    /// Patience that trusts any read (never too old) unless `too_old`.
    fn patience(every: Duration, too_old: Duration) -> Patience {
        Patience {
            every,
            too_old,
            wait: Duration::from_secs(30),
        }
    }

    #[test]
    fn slurm_is_read_at_most_once_per_interval_however_many_ask() {
        let reads = Arc::new(AtomicU32::new(0));
        let counted = reads.clone();
        let reader = Reader::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(waiting("9"))
        });
        let latest = Latest::new(patience(Duration::from_secs(60), Duration::from_secs(60)));
        spawn(latest.clone(), reader).expect("a thread");
        for _ in 0..100 {
            let read = latest.for_answer().expect("the first answer waits for the first read");
            assert_eq!(jobs(&read), ["9"]);
            assert!(!latest.lock().wanted, "a fresh read wants no other");
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_hung_read_makes_one_answer_wait_not_each() {
        // squeue hangs from the first read on.
        let (_keep, never) = mpsc::channel::<()>();
        let reader = Reader::new(move || {
            let _ = never.recv();
            Ok(Vec::new())
        });
        let latest = Latest::new(Patience {
            every: Duration::ZERO,
            too_old: Duration::ZERO,
            wait: Duration::from_millis(20),
        });
        spawn(latest.clone(), reader).expect("a thread");
        for _ in 0..5 {
            assert!(latest.for_answer().is_none(), "no read has ended");
        }
        // (the first answer waited in vain; the ones after, served one at
        // a time behind it, did not wait again for the same read)
        assert_eq!(latest.lock().waits, 1);
    }

    #[test]
    fn a_read_that_panics_is_answered_as_a_failed_read_and_tried_again() {
        let mut n = 0;
        let reader = Reader::new(move || {
            n += 1;
            assert!(n != 1, "a bug in the read");
            Ok(waiting(&n.to_string()))
        });
        let latest = Latest::new(patience(Duration::ZERO, Duration::ZERO));
        spawn(latest.clone(), reader).expect("a thread");
        let first = latest.for_answer().expect("a read").answer("ann", 1000);
        assert_eq!(
            first.unavailable.as_deref(),
            Some("the place helper could not read Slurm's queue")
        );
        assert_eq!(jobs(&latest.for_answer().expect("a read")), ["2"]);
    }

    #[test]
    fn an_answer_is_made_from_the_last_read_while_a_slow_read_runs() {
        let (release, blocked) = mpsc::channel::<()>();
        let (started, read_started) = mpsc::channel::<u32>();
        let mut n = 0;
        let reader = Reader::new(move || {
            n += 1;
            if n == 2 {
                // The second read hangs as a loaded controller's squeue does.
                let _ = started.send(n);
                let _ = blocked.recv();
            }
            Ok(waiting(&n.to_string()))
        });
        // Every answer wants a newer read; none is ever too old to answer from.
        let latest = Latest::new(patience(Duration::ZERO, Duration::from_secs(3600)));
        spawn(latest.clone(), reader).expect("a thread");
        let first = latest.for_answer().expect("the first read");
        assert_eq!(jobs(&first), ["1"]);
        let asking = latest.clone();
        let (answered, answer) = mpsc::channel();
        std::thread::spawn(move || answered.send(asking.for_answer()));
        let during = answer
            .recv_timeout(Duration::from_secs(60))
            .expect("an answer that does not wait for the read in progress")
            .expect("the first read");
        assert_eq!(jobs(&during), ["1"]);
        assert_eq!(
            read_started.recv_timeout(Duration::from_secs(60)),
            Ok(2),
            "the second read began"
        );
        release.send(()).expect("the reader waits");
        let deadline = Instant::now() + Duration::from_secs(60);
        while jobs(&latest.for_answer().expect("a read")) == ["1"] {
            assert!(Instant::now() < deadline, "the second read was never answered from");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_read_too_old_makes_the_answer_wait_a_moment_for_a_fresh_one() {
        let mut n = 0;
        let reader = Reader::new(move || {
            n += 1;
            Ok(waiting(&n.to_string()))
        });
        // Every read is too old at once: each answer waits for the next.
        let latest = Latest::new(patience(Duration::ZERO, Duration::ZERO));
        spawn(latest.clone(), reader).expect("a thread");
        let a = jobs(&latest.for_answer().expect("a read"));
        let b = jobs(&latest.for_answer().expect("a read"));
        assert_ne!(a, b, "the second answer waited for a read newer than the first's");
    }
}

//! Waiting for jobs: inotify where the filesystem gives events, polling
//! with backoff where it does not, and one Slurm query per interval for all
//! the jobs of a delegate root in this process.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use delegate_protocol::{JobId, State};

use crate::{Client, JobStatus, Result};

/// How often `wait` asks Slurm about the jobs still waited for.
pub const SLURM_INTERVAL: Duration = Duration::from_secs(2);

/// When Slurm was last asked by a wait, per delegate root, for the whole
/// process: consecutive waits (the Python waiter's rounds, each with a
/// client of its own) share the one-query-per-interval budget instead of
/// each asking at its start.
fn last_slurm_map() -> MutexGuard<'static, HashMap<PathBuf, Instant>> {
    static LAST: OnceLock<Mutex<HashMap<PathBuf, Instant>>> = OnceLock::new();
    LAST.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

impl Client {
    /// Waits until every job is over or `timeout` passes; returns the last
    /// statuses (some may still be pending or running after a timeout).
    ///
    /// Wakes on inotify events in the job directories, else polls with a
    /// backoff from 50 ms to 1 s (NFS gives no events), and asks Slurm once
    /// every [`SLURM_INTERVAL`] about all jobs still waited for.
    pub fn wait(&self, ids: &[JobId], timeout: Option<Duration>) -> Result<Vec<JobStatus>> {
        self.wait_with(ids, timeout, || false)
    }

    /// [`Client::wait`] that also stops, returning the current statuses, as
    /// soon as `stop` returns true; `stop` is called at least once a second
    /// (e.g. to notice Ctrl-C, or Python's pending signals).
    pub fn wait_with(
        &self,
        ids: &[JobId],
        timeout: Option<Duration>,
        stop: impl FnMut() -> bool,
    ) -> Result<Vec<JobStatus>> {
        self.wait_inner(ids, timeout, stop, false, false)
    }

    /// [`Client::wait_with`] that also returns as soon as any one of the
    /// jobs is over (the Python waiter: each future is resolved when its
    /// own job ends, not when the round does).
    pub fn wait_any_with(
        &self,
        ids: &[JobId],
        timeout: Option<Duration>,
        stop: impl FnMut() -> bool,
    ) -> Result<Vec<JobStatus>> {
        self.wait_inner(ids, timeout, stop, false, true)
    }

    /// Claims this interval's Slurm query: true (and the interval restarts)
    /// when no wait of this process asked about jobs of this root in the
    /// last [`SLURM_INTERVAL`], or when `force`.
    fn slurm_due(&self, force: bool) -> bool {
        let mut map = last_slurm_map();
        let due = force || map.get(&self.root).is_none_or(|t| t.elapsed() >= SLURM_INTERVAL);
        if due {
            map.insert(self.root.clone(), Instant::now());
        }
        due
    }

    fn last_slurm(&self) -> Option<Instant> {
        last_slurm_map().get(&self.root).copied()
    }

    /// The wait loop; `fresh`: ask Slurm in the first round whatever the
    /// interval (after a scancel, to see the cancellation at once).
    pub(crate) fn wait_inner(
        &self,
        ids: &[JobId],
        timeout: Option<Duration>,
        mut stop: impl FnMut() -> bool,
        fresh: bool,
        any: bool,
    ) -> Result<Vec<JobStatus>> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut jobs = ids.iter().map(|id| self.load(id)).collect::<Result<Vec<_>>>()?;
        let inotify = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::debug!(error = %e, "no inotify; polling only");
                None
            }
        };
        if let Some(ino) = &inotify {
            let mask = AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CREATE | AddWatchFlags::IN_CLOSE_WRITE;
            for j in &jobs {
                if let Err(e) = ino.add_watch(&j.dir, mask) {
                    tracing::debug!(dir = %j.dir.display(), error = %e, "cannot watch; polling");
                }
            }
        }
        let mut statuses: Vec<Option<JobStatus>> = vec![None; jobs.len()];
        let mut first = true;
        let mut backoff = Duration::from_millis(50);
        loop {
            let ask = self.slurm_due(fresh && first);
            first = false;
            // Re-read the jobs not over yet, then reconcile them together.
            let open: Vec<usize> = (0..jobs.len())
                .filter(|&i| !statuses[i].as_ref().is_some_and(JobStatus::is_terminal))
                .collect();
            let mut batch = Vec::with_capacity(open.len());
            for &i in &open {
                batch.push(self.load(&jobs[i].id)?);
            }
            let fresh = self.reconcile(&mut batch, ask)?;
            for ((&i, s), f) in open.iter().zip(fresh).zip(batch) {
                // A file-only check knows less than the last Slurm answer:
                // keep that one unless the files show progress.
                let keep_previous = !ask
                    && !s.is_terminal()
                    && statuses[i]
                        .as_ref()
                        .is_some_and(|p| !(p.state == State::Pending && s.state == State::Running));
                if !keep_previous {
                    statuses[i] = Some(s);
                }
                jobs[i] = f;
            }
            let done = statuses.iter().all(|s| s.as_ref().is_some_and(JobStatus::is_terminal));
            let one_over = any && open.iter().any(|&i| statuses[i].as_ref().is_some_and(JobStatus::is_terminal));
            let now = Instant::now();
            if done || one_over || deadline.is_some_and(|d| now >= d) || stop() {
                return Ok(statuses.into_iter().flatten().collect());
            }
            let mut sleep = backoff;
            if let Some(t) = self.last_slurm() {
                sleep = sleep.min((t + SLURM_INTERVAL).saturating_duration_since(now));
            }
            if let Some(d) = deadline {
                sleep = sleep.min(d.saturating_duration_since(now));
            }
            let sleep = sleep.max(Duration::from_millis(1));
            let woke = match &inotify {
                Some(ino) => wait_readable(ino, sleep),
                None => {
                    std::thread::sleep(sleep);
                    false
                }
            };
            if woke {
                if let Some(ino) = &inotify {
                    while matches!(ino.read_events(), Ok(ev) if !ev.is_empty()) {}
                }
                backoff = Duration::from_millis(50);
            } else {
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Waits until the inotify descriptor is readable or `timeout` passes.
fn wait_readable(fd: &impl AsFd, timeout: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let t = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    matches!(poll(&mut fds, t), Ok(n) if n > 0)
}

//! Waiting for jobs: inotify where the filesystem gives events, polling
//! with backoff where it does not, and one Slurm query per interval for all
//! the jobs of a delegate root in this process.

use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use delegate_protocol::{JobId, State};

use crate::job_files::JobFiles;
use crate::{Client, JobStatus, Result};

/// How often `wait` first asks Slurm about the jobs still waited for.
pub const SLURM_INTERVAL: Duration = Duration::from_secs(2);
/// The longest interval between two Slurm queries of a wait: while no new
/// job is waited for, the interval doubles from [`SLURM_INTERVAL`] up to
/// this. Results still come at once (inotify or
/// polling of the job directories; the runner writes them); only what Slurm
/// alone can tell (a job gone without an outcome: `lost`; a pending
/// reason) is learned later. 60 waiting students then ask slurmctld about 2
/// times a second together, not 30.
pub const SLURM_INTERVAL_MAX: Duration = Duration::from_secs(30);

/// One delegate root's Slurm polling in this process.
#[derive(Clone, Debug)]
struct Pace {
    /// None: not asked yet.
    last: Option<Instant>,
    interval: Duration,
    /// The open jobs of the last answer.
    seen: HashSet<JobId>,
}

/// The pace of Slurm queries per delegate root, for the whole process:
/// consecutive waits (the Python waiter's rounds, each with a client of its
/// own) share one query per interval instead of each asking at its start,
/// and share the backoff.
fn pace_map() -> MutexGuard<'static, HashMap<PathBuf, Pace>> {
    static PACE: OnceLock<Mutex<HashMap<PathBuf, Pace>>> = OnceLock::new();
    PACE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// The next interval after a Slurm answer: back to the start when a job
/// is waited for that the previous answer did not cover (a new
/// submission), else doubled up to [`SLURM_INTERVAL_MAX`]. A known job's
/// change of state or pending reason is no reason to ask sooner: a start
/// and a result come from the job directory at once, and restarting on
/// each start kept a long map's waiter (every call's start a change)
/// asking every 2 s for its whole run.
fn next_interval(previous: Duration, changed: bool) -> Duration {
    if changed {
        SLURM_INTERVAL
    } else {
        (previous * 2).clamp(SLURM_INTERVAL, SLURM_INTERVAL_MAX)
    }
}

/// Whether a wait's first round asks Slurm whatever the pace of the
/// process's waits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstRound {
    /// As the pace says (once per interval for all waits of a root).
    Paced,
    /// At once (after a scancel, to see the cancellation at once).
    AskSlurm,
}

/// When a wait ends (besides its timeout and its `stop`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Every job is over.
    AllOver,
    /// Any job is over, or one that was pending runs (the Python waiter).
    AnyProgress,
}

impl Client {
    /// Waits until every job is over or `timeout` passes; returns the last
    /// statuses (some may still be pending or running after a timeout).
    ///
    /// Wakes on inotify events in the job directories, else polls with a
    /// backoff from 50 ms to 1 s (NFS gives no events), and asks Slurm
    /// about all jobs still waited for once every [`SLURM_INTERVAL`] at
    /// first, less often (up to [`SLURM_INTERVAL_MAX`]) while no new job
    /// is waited for.
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
        self.wait_inner(ids, timeout, stop, FirstRound::Paced, Until::AllOver)
    }

    /// [`Client::wait_with`] that also returns as soon as any one of the
    /// jobs is over, or one that was pending starts running (the Python
    /// waiter: each future is resolved when its own job ends, not when the
    /// round does, and its live line sees the call start).
    pub fn wait_any_with(
        &self,
        ids: &[JobId],
        timeout: Option<Duration>,
        stop: impl FnMut() -> bool,
    ) -> Result<Vec<JobStatus>> {
        self.wait_inner(ids, timeout, stop, FirstRound::Paced, Until::AnyProgress)
    }

    /// Claims this interval's Slurm query: true (and the interval restarts)
    /// when no wait of this process asked about jobs of this root within
    /// the current interval, or when `force`.
    /// A job the last answer did not cover (`open`) makes it due after
    /// [`SLURM_INTERVAL`] whatever the backoff (a new submission's pending
    /// reason, e.g. a worker powering up, is shown within seconds).
    fn slurm_due(&self, force: bool, open: &[&JobId]) -> bool {
        let mut map = pace_map();
        let pace = map.entry(self.root.clone()).or_insert_with(|| Pace {
            last: None,
            interval: SLURM_INTERVAL,
            seen: HashSet::new(),
        });
        let interval = if new_job_waited_for(&pace.seen, open) {
            SLURM_INTERVAL
        } else {
            pace.interval
        };
        let due = force || pace.last.is_none_or(|t| t.elapsed() >= interval);
        if due {
            pace.last = Some(Instant::now());
        }
        due
    }

    /// After a Slurm answer: the jobs that are still open set the next
    /// interval ([`next_interval`], [`new_job_waited_for`]).
    fn slurm_answered(&self, open: &[&JobStatus]) {
        let mut map = pace_map();
        let Some(pace) = map.get_mut(&self.root) else { return };
        let ids: Vec<&JobId> = open.iter().map(|s| &s.id).collect();
        let news = new_job_waited_for(&pace.seen, &ids);
        pace.interval = next_interval(pace.interval, news);
        pace.seen = ids.into_iter().cloned().collect();
    }

    /// When the next Slurm query of this root is due.
    fn next_slurm(&self) -> Option<Instant> {
        let map = pace_map();
        let pace = map.get(&self.root)?;
        pace.last.map(|t| t + pace.interval)
    }

    /// The wait loop: its first round asks Slurm or keeps the pace
    /// (`first`), and it ends when every job is over or at the first
    /// progress (`until`), or at `timeout`, or when `stop` says so.
    pub(crate) fn wait_inner(
        &self,
        ids: &[JobId],
        timeout: Option<Duration>,
        mut stop: impl FnMut() -> bool,
        first_round: FirstRound,
        until: Until,
    ) -> Result<Vec<JobStatus>> {
        let (fresh, any) = (first_round == FirstRound::AskSlurm, until == Until::AnyProgress);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut jobs = ids.iter().map(|id| self.load(id)).collect::<Result<Vec<_>>>()?;
        let inotify = watch_dirs(jobs.iter().map(|j| j.dir.as_path()));
        let mut statuses: Vec<Option<JobStatus>> = vec![None; jobs.len()];
        // Each job's state at the first round: in `any` mode a job that
        // starts running ends the wait too (a live line says "running on
        // worker2" even for a call shorter than the caller's poll).
        let mut at_first: Vec<Option<State>> = Vec::new();
        let mut first = true;
        let mut backoff = Duration::from_millis(50);
        loop {
            let open = self.round(&mut jobs, &mut statuses, fresh && first)?;
            first = false;
            let states: Vec<Option<State>> = statuses.iter().map(|s| s.as_ref().map(|s| s.state)).collect();
            if at_first.is_empty() {
                at_first = states.clone();
            }
            let done = statuses.iter().all(|s| s.as_ref().is_some_and(JobStatus::is_terminal));
            let ended = open.iter().any(|&i| statuses[i].as_ref().is_some_and(JobStatus::is_terminal));
            let now = Instant::now();
            if done || any && progressed(&states, &at_first, ended) || deadline.is_some_and(|d| now >= d) || stop() {
                return Ok(statuses.into_iter().flatten().collect());
            }
            let mut sleep = backoff;
            if let Some(t) = self.next_slurm() {
                sleep = sleep.min(t.saturating_duration_since(now));
            }
            if let Some(d) = deadline {
                sleep = sleep.min(d.saturating_duration_since(now));
            }
            backoff = if pause(inotify.as_ref(), sleep.max(Duration::from_millis(1))) {
                Duration::from_millis(50)
            } else {
                (backoff * 2).min(Duration::from_secs(1))
            };
        }
    }

    /// One round of a wait: re-reads the jobs not over yet, reconciles them
    /// together (with Slurm when it is due, or `ask_now`), and updates
    /// `statuses`; returns the indexes of the jobs that were open.
    fn round(&self, jobs: &mut [JobFiles], statuses: &mut [Option<JobStatus>], ask_now: bool) -> Result<Vec<usize>> {
        let open: Vec<usize> = (0..jobs.len())
            .filter(|&i| !statuses[i].as_ref().is_some_and(JobStatus::is_terminal))
            .collect();
        let open_ids: Vec<&JobId> = open.iter().map(|&i| &jobs[i].id).collect();
        let ask = self.slurm_due(ask_now, &open_ids);
        let mut batch = Vec::with_capacity(open.len());
        for &i in &open {
            batch.push(self.load(&jobs[i].id)?);
        }
        let fresh = self.reconcile(&mut batch, ask)?;
        for ((&i, s), f) in open.iter().zip(fresh).zip(batch) {
            statuses[i] = Some(shown(s, ask));
            jobs[i] = f;
        }
        if ask {
            let still_open: Vec<&JobStatus> = open
                .iter()
                .filter_map(|&i| statuses[i].as_ref())
                .filter(|s| !s.is_terminal())
                .collect();
            self.slurm_answered(&still_open);
        }
        Ok(open)
    }
}

/// Whether the last Slurm-informed status `prev` knows more than `now`, a
/// file-only check: it does unless the job ended or its files show
/// progress (a start record that `prev` did not have: a call whose node
/// was lost keeps its old one until its new attempt starts, and stays
/// "pending: its node ... was lost" meanwhile).
fn knows_more(prev: &JobStatus, now: &JobStatus) -> bool {
    let started = prev.state == State::Pending && now.state == State::Running && prev.started_ms != now.started_ms;
    !now.is_terminal() && !started
}

/// Whether a wait for any of the jobs is over: one of them ended this
/// round, or went from pending (at the first round) to running.
fn progressed(states: &[Option<State>], at_first: &[Option<State>], ended: bool) -> bool {
    ended
        || states
            .iter()
            .zip(at_first)
            .any(|(now, was)| *was == Some(State::Pending) && *now == Some(State::Running))
}

/// An inotify instance watching the job directories (files created, moved
/// in or written there), or none: then the wait polls.
fn watch_dirs<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> Option<nix::sys::inotify::Inotify> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(|e| tracing::debug!(error = %e, "no inotify; polling only"))
        .ok()?;
    let mask = AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CREATE | AddWatchFlags::IN_CLOSE_WRITE;
    for dir in dirs {
        if let Err(e) = ino.add_watch(dir, mask) {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot watch; polling");
        }
    }
    Some(ino)
}

/// Sleeps up to `sleep`, woken early by a change in a watched directory
/// (the events are consumed); true when woken.
fn pause(inotify: Option<&nix::sys::inotify::Inotify>, sleep: Duration) -> bool {
    let Some(ino) = inotify else {
        std::thread::sleep(sleep);
        return false;
    };
    let woke = wait_readable(ino, sleep);
    if woke {
        while matches!(ino.read_events(), Ok(ev) if !ev.is_empty()) {}
    }
    woke
}

/// What a round shows of a job, for this process: Slurm's last answer
/// stands over the rounds that do not ask Slurm (most of them: they know
/// only the job directory, which says "submitted" for a job Slurm said
/// waits for a worker to start, and "running on worker1" for a call whose
/// node was lost, from the lost attempt's start record) unless the files
/// show progress ([`knows_more`]). Kept across waits: the notebook's waiter
/// waits again and again, a few rounds each time. Forgotten when the job
/// ends.
fn shown(s: JobStatus, asked: bool) -> JobStatus {
    static MEMO: OnceLock<Mutex<HashMap<JobId, JobStatus>>> = OnceLock::new();
    let mut memo = MEMO.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if s.is_terminal() {
        memo.remove(&s.id);
        return s;
    }
    if asked {
        if memo.len() >= 100_000 {
            memo.clear();
        }
        memo.insert(s.id.clone(), s.clone());
        return s;
    }
    match memo.get(&s.id) {
        Some(prev) if knows_more(prev, &s) => prev.clone(),
        Some(_) => {
            memo.remove(&s.id);
            s
        }
        None => s,
    }
}

/// Whether an answer covers a job the previous one did not.
fn new_job_waited_for(seen: &HashSet<JobId>, open: &[&JobId]) -> bool {
    open.iter().any(|id| !seen.contains(*id))
}

/// Waits until the inotify descriptor is readable or `timeout` passes.
fn wait_readable(fd: &impl AsFd, timeout: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let t = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    matches!(poll(&mut fds, t), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait wakes on the runner's records through inotify, not by
    /// polling: a pause as long as a test run ends on the file's arrival,
    /// and says it was woken; with nothing written it sleeps its time out
    /// and says it was not.
    #[test]
    fn a_record_written_in_a_watched_directory_wakes_the_wait() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ino = watch_dirs([dir.path()]).expect("inotify on this kernel");
        assert!(!pause(Some(&ino), Duration::from_millis(50)), "woken with nothing written");
        for (name, how) in [("outcome", "written"), ("started", "moved in")] {
            let path = dir.path().join(name);
            match how {
                "written" => std::fs::write(&path, b"x").expect("write"),
                _ => {
                    let tmp = dir.path().join(format!(".{name}.new"));
                    std::fs::write(&tmp, b"x").expect("write");
                    pause(Some(&ino), Duration::ZERO); // (the temporary file's own events)
                    std::fs::rename(&tmp, &path).expect("rename");
                }
            }
            // (polling alone would sleep the 30 s out and say false)
            let woken = pause(Some(&ino), Duration::from_secs(30));
            assert!(woken, "the {name} record {how} did not wake the wait");
        }
    }

    #[test]
    fn a_wait_for_any_ends_when_one_ends_or_one_starts() {
        let (p, r, c) = (Some(State::Pending), Some(State::Running), Some(State::Completed));
        assert!(!progressed(&[p, r], &[p, r], false), "nothing changed");
        assert!(progressed(&[r, r], &[p, r], false), "one started");
        assert!(progressed(&[p, c], &[p, r], true), "one ended");
        assert!(!progressed(&[r], &[r], false), "running since the first round is no progress");
    }

    #[test]
    fn the_interval_doubles_while_nothing_changes_and_restarts_on_news() {
        let mut i = SLURM_INTERVAL;
        let mut seen = vec![i];
        for _ in 0..6 {
            i = next_interval(i, false);
            seen.push(i);
        }
        let secs: Vec<u64> = seen.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, vec![2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(next_interval(SLURM_INTERVAL_MAX, true), SLURM_INTERVAL);
    }

    #[test]
    fn only_a_newly_waited_for_job_is_news() {
        let (a, b) = (JobId::new(), JobId::new());
        let seen: HashSet<JobId> = [a.clone()].into_iter().collect();
        // The same job again (whatever its state or reason now): no news.
        assert!(!new_job_waited_for(&seen, &[&a]));
        // A job finished and left the open set: no news either.
        assert!(!new_job_waited_for(&seen, &[]));
        // A job the last answer did not cover: news.
        assert!(new_job_waited_for(&seen, &[&a, &b]));
        assert!(new_job_waited_for(&HashSet::new(), &[&a]));
    }

    #[test]
    fn sixty_waiting_clients_stay_within_the_slurm_budget() {
        // Each squeue is two slurmctld RPCs with --local (the job query and
        // the partition query squeue always makes).
        let per_client = 2.0 / SLURM_INTERVAL_MAX.as_secs_f64();
        assert!(60.0 * per_client <= 5.0, "{}", 60.0 * per_client);
    }
}

#[cfg(test)]
mod memo_tests {
    use super::*;

    fn st(id: &JobId, state: State, reason: &str) -> JobStatus {
        JobStatus {
            id: id.clone(),
            slurm_id: Some("1".into()),
            state,
            reason: reason.into(),
            exit_code: None,
            refused: false,
            oom_killed: false,
            host: None,
            submitted_ms: None,
            started_ms: None,
            finished_ms: None,
            elapsed_secs: None,
        }
    }

    #[test]
    fn slurms_last_answer_outlives_file_only_rounds_across_waits() {
        let id = JobId::new();
        shown(st(&id, State::Pending, "waiting for a worker to start"), true);
        assert_eq!(
            shown(st(&id, State::Pending, "submitted"), false).reason,
            "waiting for a worker to start"
        );
        // Issue 52, seen in the hub: a call whose node was lost, queued
        // again; the notebook's waiter calls wait once a second, and the
        // rounds between Slurm's answers read the lost attempt's start.
        let lost = JobStatus {
            started_ms: Some(5),
            ..st(&id, State::Pending, "its node worker1 was lost: Slurm queued it again")
        };
        shown(lost, true);
        let old_start = JobStatus {
            started_ms: Some(5),
            ..st(&id, State::Running, "running on worker1")
        };
        for _ in 0..3 {
            assert_eq!(shown(old_start.clone(), false).state, State::Pending);
        }
        // Its new attempt's start is progress; then the files speak.
        let new_start = JobStatus {
            started_ms: Some(90),
            ..st(&id, State::Running, "running on worker2")
        };
        assert_eq!(shown(new_start.clone(), false).reason, "running on worker2");
        assert_eq!(shown(new_start, false).reason, "running on worker2");
        // Over: forgotten.
        assert_eq!(shown(st(&id, State::Completed, "done"), false).state, State::Completed);
        assert_eq!(shown(st(&id, State::Pending, "submitted"), false).reason, "submitted");
    }
}

#[cfg(test)]
mod knows_more_tests {
    use super::*;

    fn st(state: State, started_ms: Option<u64>) -> JobStatus {
        JobStatus {
            id: JobId::new(),
            slurm_id: Some("1".into()),
            state,
            reason: String::new(),
            exit_code: None,
            refused: false,
            oom_killed: false,
            host: None,
            submitted_ms: None,
            started_ms,
            finished_ms: None,
            elapsed_secs: None,
        }
    }

    /// Issue 52: Slurm's answer that a started call was queued again (its
    /// node was lost) outlives the file-only rounds in between, which
    /// still see the lost attempt's start record; a new start, or an end,
    /// is progress.
    #[test]
    fn a_call_queued_again_stays_pending_until_its_new_attempt_starts() {
        let requeued = st(State::Pending, Some(5));
        assert!(knows_more(&requeued, &st(State::Running, Some(5))));
        assert!(!knows_more(&requeued, &st(State::Running, Some(90))));
        assert!(!knows_more(&st(State::Pending, None), &st(State::Running, Some(5))));
        assert!(!knows_more(&requeued, &st(State::Completed, Some(90))));
        assert!(knows_more(&st(State::Running, Some(5)), &st(State::Running, Some(5))));
    }
}

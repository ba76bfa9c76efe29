//! From the files of jobs (and one Slurm query for all) to their statuses;
//! the client's outcome for a job that ended without the runner's.

use std::os::fd::OwnedFd;
use std::path::Path;

use delegate_protocol::{
    self as protocol, atomic_write_at, encode, now_ms, read_record_at, JobId, Outcome, ProtocolError, Spec, State,
    Writer,
};
use nix::errno::Errno;
use nix::fcntl::AtFlags;

use crate::client::optional;
use crate::job_files::JobFiles;
use crate::slurm;
use crate::state::{decide, Facts, SlurmView, Verdict};
use crate::{Client, JobStatus, Result};
use delegate_protocol::attempt::Attempt;

/// Why a verdict cannot be written into the job directory, in the words a
/// student acts on, for the errors that mean "the disk, not delegate"; `None`
/// for any other error (which is then reported as it is).
fn unrecordable_hint(errno: i32) -> Option<&'static str> {
    match errno {
        libc::EDQUOT => Some(
            "your disk quota is used up, so the job's output and outcome could not be written to its directory: \
             free space (files your jobs wrote, old job directories under the delegate root) and run it again",
        ),
        libc::ENOSPC => Some(
            "the filesystem of the job directory is full, so the job's output and outcome could not be written: \
             free space or ask the course staff, then run it again",
        ),
        libc::EROFS => Some("the job directory is on a read-only filesystem, so this verdict could not be recorded"),
        _ => None,
    }
}

/// A reason with the call's history of attempts, when it ran again:
/// "...; ran again on worker1 (attempt 2): worker2 was lost".
fn with_history(reason: &str, attempts: &[Attempt], host: Option<&str>) -> String {
    match protocol::attempt::history_line(attempts, host) {
        Some(h) if reason.is_empty() => h,
        Some(h) => format!("{reason}; {h}"),
        None => reason.to_owned(),
    }
}

/// The host and start time a call's status gives: its start record's,
/// unless Slurm ran the job on other nodes (`slurm_nodes`): the record is
/// then an earlier attempt's, the new one's not visible yet through a
/// network home, and Slurm's node is given with no start time. No record
/// at all (a caching home hides it): Slurm's node too.
fn shown_start<'a>(f: &'a JobFiles, slurm_nodes: &'a str) -> (Option<&'a str>, Option<u64>) {
    let recorded = f.started.as_ref().map(|s| s.host.as_str());
    match crate::state::running_on(recorded, slurm_nodes) {
        Some(h) if Some(h) != recorded => (Some(h), None),
        _ => (recorded, f.started.as_ref().map(|s| s.started_ms)),
    }
}

/// The user's jobs `q` with each waiting one's place in Slurm's queue,
/// asked of the place helper when one of them waits and a helper listens
/// here (else as they are).
fn with_places(
    mut q: std::collections::HashMap<String, slurm::SlurmJob>,
) -> std::collections::HashMap<String, slurm::SlurmJob> {
    let waiting = q.values().any(|j| j.state.phase() == slurm::SlurmPhase::Queued);
    let Some(path) = waiting.then(crate::place::socket_path).flatten() else {
        return q;
    };
    match crate::place::ask(&path) {
        Ok(places) => placed(&mut q, &places, protocol::now_ms() / 1000),
        Err(e) => tracing::debug!(error = %e, "no place in Slurm's queue"),
    }
    q
}

/// A helper's read of the queue at most this old is trusted to come again
/// soon (seconds).
const PLACES_FRESH_S: u64 = 30;
/// squeue's submit times and the helper's read time are whole seconds.
const SUBMIT_SLACK_S: u64 = 2;

/// Each waiting job of `q` with its place in `places`. A pending job the
/// helper's fresh read does not list because it was submitted (or
/// requeued) after the read began is told its place comes; any other job
/// it does not list (held for a requeue, past its bound) is left to
/// Slurm's own estimate.
fn placed(q: &mut std::collections::HashMap<String, slurm::SlurmJob>, places: &crate::place::Places, now_s: u64) {
    let fresh = now_s.saturating_sub(places.read_at) <= PLACES_FRESH_S;
    for (id, j) in q.iter_mut() {
        if j.state.phase() != slurm::SlurmPhase::Queued {
            continue;
        }
        match places.jobs.get(id) {
            Some(standing) => {
                j.ahead = Some(standing.ahead);
                j.likely_start = standing.likely_start;
            }
            None => {
                let since_read = j.submitted.is_some_and(|t| t + SUBMIT_SLACK_S >= places.read_at);
                j.place_coming = fresh && j.state == slurm::SlurmState::Pending && since_read;
            }
        }
    }
}

/// The nodes Slurm names for a job ("" when it does not).
fn nodes_of<'a>(view: SlurmView<'a>) -> &'a str {
    match view {
        SlurmView::Present(j) => j.nodes.as_str(),
        _ => "",
    }
}

/// What a call whose directory shows replaced says.
pub const REPLACED_VIEW: &str =
    "it runs again; its new attempt's directory is not visible here yet (the home's caches), it shows within a minute";

/// How a job without a visible outcome ends ([`Client::end`]).
struct Ending {
    state: State,
    reason: String,
    refused: bool,
    /// Slurm reports it `COMPLETED` ([`Verdict::Finished`]).
    finished: bool,
}

/// Whether the job directory `dir` is one a new attempt replaced (kept
/// beside the job as a lost attempt's): its inputs, the spec first, were
/// moved out of it. Asked of the filesystem, not of a network home's cache:
/// a link to the name `spec` is refused where a spec is (`EEXIST`, which the
/// kernel checks with the server); a link that is made (no spec there) is
/// removed at once.
fn replaced(dir: &OwnedFd) -> bool {
    use nix::unistd::{linkat, unlinkat, UnlinkatFlags};
    let mut rnd = [0u8; 4];
    let _ = getrandom::fill(&mut rnd);
    let probe = format!(".probe.client-{}-{:08x}", std::process::id(), u32::from_le_bytes(rnd));
    if atomic_write_at(dir, Path::new("."), &probe, b"", 0o600).is_err() {
        return false;
    }
    let made = linkat(dir, probe.as_str(), dir, protocol::SPEC, AtFlags::empty());
    let _ = unlinkat(dir, probe.as_str(), UnlinkatFlags::NoRemoveDir);
    match made {
        Ok(()) => {
            let _ = unlinkat(dir, protocol::SPEC, UnlinkatFlags::NoRemoveDir);
            true
        }
        Err(_) => false,
    }
}

impl Client {
    /// A job over whose outcome this view does not show: the runner's when
    /// it shows now (it writes its outcome before it exits); a finished
    /// call whose directory a new attempt replaced, live until the new one
    /// shows; else the client's outcome (the runner's, should it appear
    /// meanwhile). Returns its status and the outcome in effect.
    fn end(&self, f: &JobFiles, fd: &OwnedFd, nodes: &str, e: Ending) -> Result<(JobStatus, Option<Outcome>)> {
        // The user's own words of why, when the marker has them.
        let reason = match (&f.cancel_reason, e.state) {
            (Some(why), State::Cancelled) if e.reason.starts_with("cancelled by the user") => {
                protocol::cancel::cancelled_by(Some(why))
            }
            _ => e.reason,
        };
        if let Some(o) = optional(read_record_at::<Outcome>(fd, &f.dir, None))? {
            return Ok((self.status_of(f, &o), Some(o)));
        }
        if e.finished && replaced(fd) {
            self.look_again_at_the_jobs();
            let host = Some(nodes).filter(|n| !n.is_empty());
            let (state, reason) = crate::state::outcome_on_its_way_on(host);
            return Ok((self.live_status_on(f, state, reason, nodes), None));
        }
        let o = self.write_client_outcome(fd, &f.dir, e.state, &reason, e.refused, shown_start(f, nodes))?;
        Ok((self.status_of(f, &o), Some(o)))
    }

    /// The status of a call whose directory, as this view shows it, is one
    /// a new attempt replaced: running again, nowhere named yet.
    fn replaced_status(&self, f: &JobFiles) -> JobStatus {
        self.look_again_at_the_jobs();
        let mut st = self.live_status(f, State::Running, REPLACED_VIEW.to_owned());
        st.host = None;
        st.started_ms = None;
        st.elapsed_secs = None;
        st
    }

    /// Lists the delegate root, so that a network home's client looks its
    /// job directories up again: found on the machines' home, a name whose
    /// directory a new attempt replaced kept resolving to the replaced one
    /// for minutes in a waiting notebook; a listing replaces the cache's
    /// entry of each name it lists. Bounded; only when a replaced
    /// directory was read.
    fn look_again_at_the_jobs(&self) {
        use nix::fcntl::OFlag;
        const MAX_NAMES: usize = 1_000_000;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        if let Ok(mut d) = nix::dir::Dir::openat(&self.root_fd, ".", flags, nix::sys::stat::Mode::empty()) {
            let n = d.iter().take(MAX_NAMES).count();
            tracing::debug!(names = n, "listed the delegate root: a replaced job directory was read");
        }
    }

    /// Writes an outcome unless one exists (link of a complete temporary file,
    /// so two writers never clobber each other, also on NFS). Returns the
    /// outcome in effect.
    pub(crate) fn write_client_outcome(
        &self,
        fd: &OwnedFd,
        dir: &Path,
        state: State,
        reason: &str,
        refused: bool,
        (host, started_ms): (Option<&str>, Option<u64>),
    ) -> Result<Outcome> {
        let outcome = Outcome {
            refused,
            started_ms,
            ..Outcome::ended(state, reason, host.unwrap_or_default().to_owned(), Writer::Client)
        };
        let bytes = encode(&outcome)?;
        let mut rnd = [0u8; 4];
        let _ = getrandom::fill(&mut rnd);
        let tmp = format!(".outcome.client-{}-{:08x}", std::process::id(), u32::from_le_bytes(rnd));
        if let Err(e) = atomic_write_at(fd, dir, &tmp, &bytes, 0o644) {
            // A full (or read-only) delegate root: the verdict still stands,
            // it just cannot be recorded; say so instead of failing the
            // status of the job (the next reader derives it again).
            let errno = match &e {
                ProtocolError::Io { source, .. } => source.raw_os_error(),
                _ => None,
            };
            let Some(hint) = errno.and_then(unrecordable_hint) else {
                return Err(e.into());
            };
            let _ = nix::unistd::unlinkat(fd, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
            let why = match &e {
                ProtocolError::Io { source, .. } => source.to_string(),
                e => e.to_string(),
            };
            tracing::warn!(dir = %dir.display(), "cannot record the client outcome: {why}");
            let mut outcome = outcome;
            outcome.reason = format!("{hint} ({why}); {}", outcome.reason);
            return Ok(outcome);
        }
        let linked = nix::unistd::linkat(fd, tmp.as_str(), fd, protocol::OUTCOME, AtFlags::empty());
        let _ = nix::unistd::unlinkat(fd, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        match linked {
            Ok(()) => {
                let _ = nix::unistd::fsync(fd);
                tracing::info!(dir = %dir.display(), state = %state, reason, "wrote a client outcome");
                Ok(outcome)
            }
            Err(Errno::EEXIST) => Ok(read_record_at::<Outcome>(fd, dir, None)?),
            Err(e) => Err(ProtocolError::io(dir.join(protocol::OUTCOME).display(), e).into()),
        }
    }

    fn status_of(&self, f: &JobFiles, outcome: &Outcome) -> JobStatus {
        let started_ms = outcome.started_ms.or(f.started.as_ref().map(|s| s.started_ms));
        let host = Some(outcome.host.clone())
            .filter(|h| !h.is_empty())
            .or_else(|| f.started.as_ref().map(|s| s.host.clone()));
        JobStatus {
            id: f.id.clone(),
            slurm_id: f.slurm_id.clone(),
            state: outcome.state,
            reason: with_history(&outcome.reason, &f.attempts, host.as_deref()),
            exit_code: outcome.exit_code,
            refused: outcome.refused,
            oom_killed: outcome.oom_killed,
            host,
            submitted_ms: Some(f.created_ms),
            started_ms,
            finished_ms: Some(outcome.finished_ms),
            elapsed_secs: started_ms.map(|s| outcome.finished_ms.saturating_sub(s) as f64 / 1000.0),
        }
    }

    fn live_status(&self, f: &JobFiles, state: State, reason: String) -> JobStatus {
        self.live_status_on(f, state, reason, "")
    }

    /// A live job's status; `slurm_nodes`: the nodes Slurm runs it on, which
    /// a start record on none of them (an earlier attempt's) yields to.
    fn live_status_on(&self, f: &JobFiles, state: State, reason: String, slurm_nodes: &str) -> JobStatus {
        let recorded = f.started.as_ref().map(|s| s.host.as_str());
        let (host, started_ms) = match state {
            State::Running => shown_start(f, slurm_nodes),
            _ => (recorded, f.started.as_ref().map(|s| s.started_ms)),
        };
        // A start record Slurm no longer runs the job by is an attempt lost
        // since, whose record in `attempts` may not be visible yet either (a
        // caching home): the history counts it.
        let attempts = match (f.started.as_ref(), host != recorded) {
            (Some(s), true) if !f.start_recorded_lost() => {
                let mut all = f.attempts.clone();
                all.push(Attempt {
                    n: all.last().map_or(1, |a| a.n + 1),
                    node: s.host.clone(),
                    started_ms: s.started_ms,
                    ended_ms: 0,
                    why: String::new(),
                });
                std::borrow::Cow::Owned(all)
            }
            _ => std::borrow::Cow::Borrowed(f.attempts.as_slice()),
        };
        JobStatus {
            id: f.id.clone(),
            slurm_id: f.slurm_id.clone(),
            state,
            reason: with_history(&reason, &attempts, host),
            exit_code: None,
            refused: false,
            oom_killed: false,
            host: host.map(str::to_owned),
            submitted_ms: Some(f.created_ms),
            started_ms,
            finished_ms: None,
            elapsed_secs: started_ms.map(|s| now_ms().saturating_sub(s) as f64 / 1000.0),
        }
    }

    /// Reconciles loaded jobs; asks Slurm once (when `ask_slurm`) about all
    /// the jobs that have no outcome yet.
    pub(crate) fn reconcile(&self, jobs: &mut [JobFiles], ask_slurm: bool) -> Result<Vec<JobStatus>> {
        let need_slurm = ask_slurm && jobs.iter().any(|j| j.outcome.is_none() && j.slurm_id.is_some());
        let queue = if need_slurm {
            match self.config.slurm.query_user(self.uid) {
                Ok(q) => Some(with_places(q)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot ask Slurm about the jobs");
                    None
                }
            }
        } else {
            None
        };
        let mut out = Vec::with_capacity(jobs.len());
        for f in jobs.iter_mut() {
            if let Some(o) = &f.outcome {
                out.push(self.status_of(f, o));
                continue;
            }
            let fd = match (&f.fd, &f.unreadable) {
                (Some(fd), _) => fd,
                (None, why) => {
                    let why = why.clone().unwrap_or_default();
                    out.push(match self.log_facts(&f.id).refusal {
                        Some(reason) => {
                            let mut st = self.live_status(f, State::Failed, format!("refused: {reason}"));
                            st.refused = true;
                            st.finished_ms = Some(now_ms());
                            st
                        }
                        None => self.live_status(
                            f,
                            State::Pending,
                            format!("the job directory cannot be read ({why}); waiting for the runner's verdict"),
                        ),
                    });
                    continue;
                }
            };
            // A directory a new attempt replaced, read through a network
            // home's stale view (its inputs moved out, its lost attempt's
            // start record left): the call runs again elsewhere.
            if f.slurm_id.is_none() && !f.has_spec && f.started.is_some() && replaced(fd) {
                out.push(self.replaced_status(f));
                continue;
            }
            // A map's call that an allocation claimed: that allocation.
            let claimer = match &f.claimed_by {
                Some(by) if f.shared.is_some() => Some(by.as_str()),
                _ => None,
            };
            let view = match (&f.slurm_id, ask_slurm, &queue) {
                (_, false, _) => SlurmView::NotAsked,
                (None, true, _) => SlurmView::NotAsked,
                (Some(_), true, None) => SlurmView::Unavailable,
                (Some(sid), true, Some(q)) => {
                    slurm::lookup(q, claimer.unwrap_or(sid)).map_or(SlurmView::Absent, SlurmView::Present)
                }
            };
            let facts = Facts {
                submitted: f.slurm_id.is_some(),
                age_secs: now_ms().saturating_sub(f.created_ms) / 1000,
                started: f.started.as_ref().map(|s| s.host.as_str()),
                cancel_requested: f.cancel,
                shared: f.shared.is_some(),
                by_claimer: claimer.is_some(),
                run_again: f.run_again,
                started_secs: f.started.as_ref().map_or(0, |s| now_ms().saturating_sub(s.started_ms) / 1000),
                now_secs: now_ms() / 1000,
                start_recorded_lost: f.start_recorded_lost(),
                slurm: view,
            };
            match decide(&facts, || self.log_facts(&f.id)) {
                Verdict::Live { state, reason } => out.push(self.live_status_on(f, state, reason, nodes_of(view))),
                Verdict::Ended { state, reason, refused } => {
                    let nodes = nodes_of(view);
                    let ending = Ending { state, reason, refused, finished: false };
                    let (st, outcome) = self.end(f, fd, nodes, ending)?;
                    out.push(st);
                    f.outcome = outcome;
                }
                Verdict::Finished { reason } => {
                    let ending = Ending {
                        state: State::Lost,
                        reason,
                        refused: false,
                        finished: true,
                    };
                    let (st, outcome) = self.end(f, fd, nodes_of(view), ending)?;
                    out.push(st);
                    f.outcome = outcome;
                }
            }
        }
        Ok(out)
    }

    /// The state of each job, asking Slurm once for all of them.
    pub fn status(&self, ids: &[JobId]) -> Result<Vec<JobStatus>> {
        let mut jobs = ids.iter().map(|id| self.load(id)).collect::<Result<Vec<_>>>()?;
        self.reconcile(&mut jobs, true)
    }

    /// The spec of a job.
    pub fn spec(&self, id: &JobId) -> Result<Spec> {
        let fd = self.open_job_dir(id)?;
        Ok(read_record_at(&fd, &self.job_dir(id), None)?)
    }
}

#[cfg(test)]
mod tests {
    use super::{placed, replaced, unrecordable_hint};
    use crate::place::{Places, Standing};
    use crate::slurm::parse_squeue;

    #[test]
    fn a_waiting_job_newer_than_the_helpers_read_is_told_its_place_comes() {
        // (submitted at 990, before the read at 1,000, but for 9 at 1,005;
        // 8 held for a requeue: the helper does not list it)
        let squeue = "7_0|RUNNING|w1|None||990\n7_1|PENDING||Priority||990\n9|PENDING||Priority||1005\n\
                      8|REQUEUE_HOLD||JobHeldUser||990\n6|PENDING||Priority||990\n";
        let places = Places {
            read_at: 1_000,
            jobs: [("7_1".to_owned(), Standing { ahead: 3, likely_start: Some(1_060) })].into(),
        };
        let mut q = parse_squeue(squeue);
        placed(&mut q, &places, 1_010);
        assert_eq!(
            (q["7_1"].ahead, q["7_1"].likely_start, q["7_1"].place_coming),
            (Some(3), Some(1_060), false)
        );
        // (9 was submitted after the read; a running one is not placed)
        assert_eq!((q["9"].ahead, q["9"].place_coming), (None, true));
        assert_eq!((q["7_0"].ahead, q["7_0"].place_coming), (None, false));
        // Not listed though older than the read: Slurm's estimate, not a
        // place said to come forever.
        assert!(!q["8"].place_coming && !q["6"].place_coming);
        // A read too old to list every waiting job says nothing of 9.
        let mut q = parse_squeue(squeue);
        placed(&mut q, &places, 1_100);
        assert!(!q["9"].place_coming);
    }

    /// Stop 63's CI: a directory a new attempt replaced, read through a
    /// stale view, is told from the call's own by its spec, asked of the
    /// filesystem; the probe leaves nothing behind either way.
    #[test]
    fn a_replaced_directory_is_told_by_its_missing_spec() {
        let d = tempfile::tempdir().expect("tempdir");
        let fd = |p: &std::path::Path| -> std::os::fd::OwnedFd { std::fs::File::open(p).expect("open").into() };
        std::fs::write(d.path().join("spec"), b"the call's spec").expect("write");
        assert!(!replaced(&fd(d.path())));
        assert_eq!(std::fs::read(d.path().join("spec")).expect("read"), b"the call's spec");
        std::fs::remove_file(d.path().join("spec")).expect("remove");
        assert!(replaced(&fd(d.path())));
        let left: Vec<_> = std::fs::read_dir(d.path()).expect("list").collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_full_disk_is_explained_and_other_errors_are_not() {
        let quota = unrecordable_hint(libc::EDQUOT).unwrap_or_default();
        assert!(quota.contains("quota") && quota.contains("free space"), "{quota}");
        assert!(unrecordable_hint(libc::ENOSPC).unwrap_or_default().contains("full"));
        assert!(unrecordable_hint(libc::EROFS).is_some());
        assert_eq!(unrecordable_hint(libc::EACCES), None);
        assert_eq!(unrecordable_hint(libc::EIO), None);
    }
}

//! The reconciliation decision, pure: what the job directory and Slurm say
//! about a job without an outcome file ([`Facts`]) decide its state
//! ([`decide`]). Shared by status, wait, cancel and list.

use delegate_protocol::{parse_lost_line, parse_refused_line, State};

use crate::slurm::{SlurmJob, SlurmPhase, SlurmState};

/// A job directory without a `slurm-id` after this long was never submitted.
pub const SUBMIT_GRACE_SECS: u64 = 60;

/// What Slurm says about a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlurmView<'a> {
    /// Slurm was not asked this time (a file-only check).
    NotAsked,
    /// Slurm could not be asked (squeue failed); the job's fate is unknown.
    Unavailable,
    /// squeue does not list the job any more.
    Absent,
    Present(&'a SlurmJob),
}

/// What the job directory and Slurm say about a job without an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts<'a> {
    /// A `slurm-id` file exists.
    pub submitted: bool,
    /// Seconds since the job was created.
    pub age_secs: u64,
    /// A `started` file exists; the host it names.
    pub started: Option<&'a str>,
    /// The `cancel` marker exists.
    pub cancel_requested: bool,
    /// The call is one of a map's, whose allocations claim its calls one
    /// after another (`slurm` is then the map's job: its liveliest
    /// element, or, once the call started, the element that claimed it).
    pub shared: bool,
    /// `slurm` is the allocation that claimed this call of a map (its
    /// `claim` file was read), not the map's job as a whole.
    pub by_claimer: bool,
    /// The call has retries left: when Slurm queues its allocation again
    /// (its node was lost), a new attempt runs it.
    pub run_again: bool,
    /// Seconds since the `started` record was written (0 without one).
    pub started_secs: u64,
    /// The `started` record is one of an attempt the runner already
    /// recorded lost (the newer attempt's record not visible yet).
    pub start_recorded_lost: bool,
    /// Now, in seconds since the epoch (for Slurm's expected start).
    pub now_secs: u64,
    pub slurm: SlurmView<'a>,
}

/// What a map's waiting call says while one of the map's allocations runs.
pub const WAITING_FOR_AN_ALLOCATION: &str = "waiting for an allocation of its map to claim it";

/// What Slurm's log of the batch script says, read only when needed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogFacts {
    /// The text after [`delegate_protocol::REFUSED_PREFIX`] on the last such line.
    pub refusal: Option<String>,
    /// The last non-empty line, for a lost job's reason.
    pub last_line: Option<String>,
    /// Seconds since the log was last written (the runner's end, once the
    /// job is over), when the log can be seen.
    pub age_secs: Option<u64>,
}

/// How long after its end a call Slurm reports `COMPLETED` may still show
/// no outcome here: the runner exits 0 only once its outcome is written,
/// so that outcome is on its way through a network home's caches (30 s
/// of entries and negative lookups on the course's home, the directory
/// its new attempt replaced included). Past this, it is lost.
pub const OUTCOME_SHOWS_WITHIN_SECS: u64 = 90;

/// What a [`Verdict::Finished`] call whose directory a new attempt
/// replaced says: "finished on worker2; its result ...".
pub const OUTCOME_ON_ITS_WAY: &str = "its result is not visible here yet (the home's caches), it shows within a minute";

/// The live state of that call (`host`: where Slurm ran it).
pub fn outcome_on_its_way_on(host: Option<&str>) -> (State, String) {
    let on = host.map(|h| format!(" on {h}")).unwrap_or_default();
    (State::Running, format!("finished{on}; {OUTCOME_ON_ITS_WAY}"))
}

/// The decision for a job without an outcome file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Still pending or running.
    Live { state: State, reason: String },
    /// Over without an outcome from the runner: one must be derived and
    /// written (unless the runner's appears meanwhile).
    Ended {
        state: State,
        reason: String,
        refused: bool,
    },
    /// Over, `COMPLETED` by Slurm: the runner wrote an outcome (it exits 0
    /// only once it is written), which this view of the directory does not
    /// show (a network home's caches). Read it; a directory that a new
    /// attempt replaced is not the call's any more (wait for the new one
    /// to show); else `reason` (lost), unless the runner's appears.
    Finished { reason: String },
}

/// The reason of a job whose node is being powered up (elastic workers,
/// docs/elastic.md); the figure is the cold start measured on the stack.
pub const COLD_START: &str = "waiting for a worker to start (it was powered down; usually 5-25 s)";

/// Decides the state of a job that has no outcome file. `log` is called
/// only when the job is over according to Slurm.
pub fn decide(f: &Facts<'_>, log: impl FnOnce() -> LogFacts) -> Verdict {
    let note = if f.cancel_requested {
        "; cancellation requested"
    } else {
        ""
    };
    if !f.submitted {
        return unsubmitted(f, note);
    }
    if f.shared && f.started.is_none() && f.cancel_requested {
        // Its allocation runs other calls too, so Slurm is not asked to
        // cancel it: the call is over now. (A runner reaching it later
        // skips it; one starting it at this moment sees the marker and
        // stops it.)
        return ended(State::Cancelled, "cancelled by the user before it started".into());
    }
    let (slurm_state, slurm_reason) = match f.slurm {
        SlurmView::NotAsked | SlurmView::Unavailable if f.started.is_some() => return running(f, note, ""),
        SlurmView::NotAsked => return live(State::Pending, format!("submitted{note}")),
        SlurmView::Unavailable => {
            return live(State::Pending, format!("submitted; Slurm could not be asked about it{note}"))
        }
        SlurmView::Present(j) if j.state.phase() != SlurmPhase::Ended => return in_slurm(f, j, note),
        SlurmView::Present(j) => (Some(&j.state), j.reason.as_str()),
        // Gone from Slurm's queue: no state at all.
        SlurmView::Absent => (None, ""),
    };
    // Over according to Slurm, and the runner wrote no outcome.
    if f.cancel_requested {
        return ended(State::Cancelled, "cancelled by the user".into());
    }
    let before_start = f.shared && f.started.is_none();
    if let Some(v) = slurm_ended(slurm_state, before_start) {
        return v;
    }
    let log = log();
    if let Some(r) = log.refusal {
        return Verdict::Ended {
            state: State::Failed,
            reason: r,
            refused: true,
        };
    }
    let said_lost = log.last_line.as_deref().and_then(parse_lost_line).is_some();
    if !said_lost && outcome_on_its_way(slurm_state, before_start || f.shared, log.age_secs) {
        return Verdict::Finished {
            reason: lost_reason(slurm_state, slurm_reason, before_start, log.last_line),
        };
    }
    lost(slurm_state, slurm_reason, before_start, log.last_line)
}

fn live(state: State, reason: String) -> Verdict {
    Verdict::Live { state, reason }
}

fn ended(state: State, reason: String) -> Verdict {
    Verdict::Ended { state, reason, refused: false }
}

/// Running, on the host its start record names, else on the node Slurm
/// gave it (a home whose caches still hide the start record).
fn running(f: &Facts<'_>, note: &str, slurm_nodes: &str) -> Verdict {
    match running_on(f.started, slurm_nodes) {
        Some(h) => live(State::Running, format!("running on {h}{note}")),
        None => live(State::Running, format!("running{note}")),
    }
}

/// The node a running call is shown on: its start record's, unless Slurm
/// runs the job on other nodes (the record is then an earlier attempt's,
/// the new one's not visible yet through a network home): Slurm's then.
pub fn running_on<'a>(started: Option<&'a str>, slurm_nodes: &'a str) -> Option<&'a str> {
    // (a compressed list, `worker[1-2]`, cannot be compared by name)
    let stale = |h: &str| !slurm_nodes.contains('[') && elsewhere(slurm_nodes, h);
    match started {
        Some(h) if !h.is_empty() && !stale(h) => Some(h),
        _ if !slurm_nodes.is_empty() => Some(slurm_nodes),
        _ => None,
    }
}

/// A job whose Slurm id was never recorded: being submitted, or never was.
fn unsubmitted(f: &Facts<'_>, note: &str) -> Verdict {
    if f.age_secs <= SUBMIT_GRACE_SECS {
        return live(State::Pending, format!("being submitted to Slurm{note}"));
    }
    if f.cancel_requested {
        return ended(
            State::Cancelled,
            "cancelled by the user before it was submitted to Slurm".into(),
        );
    }
    ended(
        State::Failed,
        format!("the job was never submitted (no Slurm job id was recorded within {SUBMIT_GRACE_SECS} s)"),
    )
}

/// A job Slurm still holds (queued or active).
fn in_slurm(f: &Facts<'_>, j: &SlurmJob, note: &str) -> Verdict {
    let slurm_says = || match j.reason.as_str() {
        "" | "None" => j.state.to_string(),
        r => format!("{}, {r}", j.state),
    };
    match j.state.phase() {
        // Claimed, and its allocation queued again (its node was lost):
        // the allocation runs it again when it starts, within its retries.
        SlurmPhase::Queued if f.by_claimer && f.run_again => live(
            State::Pending,
            format!("{}; it runs again when its allocation starts again{note}", lost_node(f, j)),
        ),
        // A one-node call whose job Slurm queued again, long after it
        // started (not a start that squeue's answer predates): a new
        // attempt, or, its retries spent, the runner's word that it is lost.
        SlurmPhase::Queued if !f.shared && f.started.is_some() && f.started_secs >= REQUEUE_SEEN_SECS => {
            let next = if f.run_again {
                "a new attempt runs it afresh"
            } else {
                "its retries are spent: it ends lost when Slurm starts it again"
            };
            live(State::Pending, format!("{}; {next}{note}", lost_node(f, j)))
        }
        // Claimed, not started, and its allocation queued again (its node
        // failed) with no retries left: no allocation runs it again.
        SlurmPhase::Queued if f.by_claimer && f.started.is_none() => ended(
            State::Lost,
            format!(
                "its allocation claimed it and was requeued (Slurm: {}) before it started",
                slurm_says()
            ),
        ),
        SlurmPhase::Active if f.by_claimer && f.started.is_none() => {
            live(State::Pending, format!("claimed by an allocation of its map, starting{note}"))
        }
        // Slurm gave it a node that is being powered up.
        SlurmPhase::Queued if f.started.is_none() && j.state == SlurmState::Configuring => {
            live(State::Pending, format!("{COLD_START}{note}"))
        }
        SlurmPhase::Queued if f.started.is_none() => {
            let why = match j.reason.as_str() {
                "" | "None" => String::new(),
                // (the agent of a node releases it within a minute:
                // sandbox-agent's failed_launch)
                "launch failed requeued held" | "launch_failed_requeued_held" => {
                    " (Slurm held it after its launch on a node failed; it is released to run again)".to_owned()
                }
                r => format!(" ({r})"),
            };
            let what = if f.shared {
                "waiting for an allocation of its map, in Slurm's queue"
            } else {
                "waiting in Slurm's queue"
            };
            let when = match (j.likely_start, j.place_coming) {
                (Some(t), _) => likely_start_of_the_helper(t, f.now_secs),
                (None, true) => PLACE_COMING.to_owned(),
                (None, false) => likely_start(j.expected_start, f.now_secs),
            };
            let place = j.ahead.map(place_words).unwrap_or_default();
            live(State::Pending, format!("{what}{why}{place}; {when}{note}"))
        }
        SlurmPhase::Active if f.shared && f.started.is_none() => {
            live(State::Pending, format!("{WAITING_FOR_AN_ALLOCATION}{note}"))
        }
        // The allocation that started it runs again (requeued: its node
        // failed) or elsewhere: this call's run is over.
        _ if f.by_claimer && f.run_again && f.started.is_some_and(|host| moved(j, host)) => live(
            State::Pending,
            format!("{}; its allocation runs it again{note}", lost_node(f, j)),
        ),
        _ if f.by_claimer && f.started.is_some_and(|host| moved(j, host)) => ended(
            State::Lost,
            format!(
                "its allocation was requeued (Slurm: {}) before the runner wrote an outcome",
                slurm_says()
            ),
        ),
        // A one-node call whose last allowed attempt was lost, which Slurm
        // started again elsewhere: that start ends lost at once (the
        // runner's word), it never runs.
        SlurmPhase::Active
            if !f.shared && !f.run_again && !f.start_recorded_lost && f.started.is_some_and(|host| moved(j, host)) =>
        {
            live(
                State::Pending,
                format!(
                    "its node {} was lost: Slurm started it again on {}; \
                     its retries are spent: it ends lost there{note}",
                    f.started.unwrap_or_default(),
                    j.nodes
                ),
            )
        }
        _ => running(f, note, &j.nodes),
    }
}

/// When a waiting job will likely start, from Slurm's backfill estimate
/// (which counts every job ahead as running to its time limit, so it is a
/// latest start unless jobs of higher priority arrive), or why there is none.
pub fn likely_start(expected: Option<u64>, now: u64) -> String {
    match expected {
        Some(t) if t > now + 60 => format!(
            "{LIKELY} within {} (Slurm's estimate from the time limits of the jobs ahead)",
            in_words(t - now)
        ),
        Some(_) => format!("{LIKELY} within a minute (Slurm's estimate)"),
        None => "no estimate of its start yet (Slurm's scheduler has not placed it)".to_owned(),
    }
}

/// When a waiting job will likely start, from the place helper's estimate
/// (the running jobs ending as the jobs it saw end lately lasted, the jobs
/// ahead each lasting as long): a likely start, not a bound.
pub fn likely_start_of_the_helper(t: u64, now: u64) -> String {
    if t <= now + 60 {
        return format!("{LIKELY} within a minute ({HELPERS_BASIS})");
    }
    format!("{LIKELY} in about {} ({HELPERS_BASIS})", in_words(t - now))
}

/// A waiting job newer than the place helper's last read of the queue.
const PLACE_COMING: &str = "its place in line comes within seconds (the queue is read every few seconds)";

/// What the helper's estimate is made of, in the line's words.
const HELPERS_BASIS: &str = "from the running calls and how long calls lasted lately";

/// Where a waiting job stands, after "waiting in Slurm's queue": its
/// number of waiting jobs ahead (the place helper's count).
fn place_words(ahead: u32) -> String {
    match ahead {
        0 => ", next in line".to_owned(),
        1 => ", 1 job ahead".to_owned(),
        n => format!(", {n} jobs ahead"),
    }
}

/// The words a waiting job's reason has before its likely start.
pub const LIKELY: &str = "likely to start";

/// A wait in minutes (rounded up) or hours and minutes.
fn in_words(secs: u64) -> String {
    let min = secs.div_ceil(60);
    match min {
        0..=89 => format!("{min} min"),
        _ => format!("{} h {} min", min / 60, min % 60),
    }
}

/// A started call Slurm lists as queued this long after its start was
/// queued again (below it, squeue's answer may predate the start).
pub const REQUEUE_SEEN_SECS: u64 = 5;

/// What a call whose allocation Slurm queued again says of it.
fn lost_node(f: &Facts<'_>, j: &SlurmJob) -> String {
    let node = match f.started {
        Some(h) if !h.is_empty() => format!("its node {h} was lost"),
        _ => "its node was lost".to_owned(),
    };
    match j.reason.as_str() {
        "" | "None" => format!("{node}: Slurm queued it again ({})", j.state),
        r => format!("{node}: Slurm queued it again ({}, {r})", j.state),
    }
}

/// Whether the allocation `j` that started a map's call on `host` is no
/// longer that run: queued again, or running on another node.
fn moved(j: &SlurmJob, host: &str) -> bool {
    match j.state.phase() {
        SlurmPhase::Queued => true,
        SlurmPhase::Active => elsewhere(&j.nodes, host),
        SlurmPhase::Ended => false,
    }
}

/// Slurm names nodes for the job (`a,b`), and `host` is none of them.
fn elsewhere(nodes: &str, host: &str) -> bool {
    !nodes.is_empty() && !nodes.split(',').any(|n| n == host)
}

/// A call Slurm reports `COMPLETED` (its runner wrote an outcome, then
/// exited 0) whose outcome is not visible here yet, within
/// [`OUTCOME_SHOWS_WITHIN_SECS`] of the end of its log. (A map's allocation
/// completes whatever its calls did: not for them.)
fn outcome_on_its_way(state: Option<&SlurmState>, shared: bool, log_age: Option<u64>) -> bool {
    state == Some(&SlurmState::Completed) && !shared && log_age.is_some_and(|a| a < OUTCOME_SHOWS_WITHIN_SECS)
}

/// Slurm's own end of a job the runner wrote no outcome for, when it
/// explains it (cancelled, timed out).
fn slurm_ended(state: Option<&SlurmState>, before_start: bool) -> Option<Verdict> {
    Some(match state? {
        SlurmState::Cancelled if before_start => ended(
            State::Cancelled,
            "cancelled by Slurm: its allocation was cancelled before this call started".into(),
        ),
        SlurmState::Timeout if before_start => ended(
            State::Cancelled,
            "its allocation reached Slurm's time limit before this call started".into(),
        ),
        SlurmState::Cancelled => ended(State::Cancelled, "cancelled by Slurm".into()),
        SlurmState::Timeout => ended(
            State::TimedOut,
            "Slurm's time limit was reached before the runner wrote an outcome".into(),
        ),
        _ => return None,
    })
}

/// Over, with no outcome and no explanation from Slurm: lost, with what
/// Slurm and its log of the job say.
fn lost(state: Option<&SlurmState>, slurm_reason: &str, before_start: bool, last_line: Option<String>) -> Verdict {
    ended(State::Lost, lost_reason(state, slurm_reason, before_start, last_line))
}

/// Why [`lost`].
fn lost_reason(
    state: Option<&SlurmState>,
    slurm_reason: &str,
    before_start: bool,
    last_line: Option<String>,
) -> String {
    // The runner said so itself (its retries spent), and its outcome is
    // not visible here yet (a network home's cache of the directory it
    // replaced): its words.
    if let Some(why) = last_line.as_deref().and_then(parse_lost_line) {
        return why.to_owned();
    }
    let why = match slurm_reason {
        "" if state.is_none() => "it is no longer in Slurm's queue",
        "" | "None" => "Slurm gives no reason",
        r => r,
    };
    let slurm_state = state.map_or("gone", SlurmState::as_str);
    let mut reason = if before_start {
        format!("Slurm reports its allocation {slurm_state} and this call never started ({why})")
    } else {
        format!("Slurm reports the job {slurm_state} and the runner wrote no outcome ({why})")
    };
    if let Some(l) = last_line {
        reason.push_str(&format!("; Slurm's log of the job ends with: {l}"));
    }
    reason
}

/// Extracts the refusal and the last line from the tail of a Slurm log.
pub fn scan_log(tail: &str) -> LogFacts {
    let mut facts = LogFacts::default();
    for line in tail.lines() {
        let line = line.trim_end();
        if let Some(r) = parse_refused_line(line) {
            facts.refusal = Some(r.trim().chars().take(1000).collect());
        }
        if !line.trim().is_empty() {
            facts.last_line = Some(line.trim().chars().take(300).collect());
        }
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(slurm: SlurmView<'a>) -> Facts<'a> {
        Facts {
            submitted: true,
            age_secs: 5,
            started: None,
            cancel_requested: false,
            shared: false,
            by_claimer: false,
            run_again: false,
            started_secs: 0,
            start_recorded_lost: false,
            now_secs: 1_000_000,
            slurm,
        }
    }

    fn facts_shared<'a>(slurm: SlurmView<'a>) -> Facts<'a> {
        Facts { shared: true, ..facts(slurm) }
    }

    fn sj(state: &str, reason: &str) -> SlurmJob {
        SlurmJob {
            state: SlurmState::parse(state),
            reason: reason.into(),
            nodes: String::new(),
            expected_start: None,
            ahead: None,
            likely_start: None,
            place_coming: false,
            submitted: None,
        }
    }

    fn no_log() -> LogFacts {
        LogFacts::default()
    }

    fn state_of(v: &Verdict) -> State {
        match v {
            Verdict::Live { state, .. } | Verdict::Ended { state, .. } => *state,
            Verdict::Finished { .. } => State::Completed,
        }
    }

    /// Stop 63's CI, in the hub over the caching home: a call that ran
    /// again on worker2 completed there, and the notebook, still shown the
    /// directory its new attempt replaced, ended it lost. A call Slurm
    /// reports COMPLETED has an outcome (the runner exits 0 only once it is
    /// written): the reader waits for it, then, long past the end of the
    /// job's log, says lost.
    #[test]
    fn a_completed_call_whose_outcome_is_not_visible_yet_waits_for_it() {
        let mut done = sj("COMPLETED", "None");
        done.nodes = "worker2".into();
        let f = Facts {
            started: Some("worker1"),
            ..facts(SlurmView::Present(&done))
        };
        let log = |age| {
            move || LogFacts {
                age_secs: age,
                ..scan_log("INFO job x: completed: exited with code 0\n")
            }
        };
        match decide(&f, log(Some(5))) {
            Verdict::Finished { reason } => assert!(reason.contains("COMPLETED"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            outcome_on_its_way_on(Some("worker2")),
            (State::Running, format!("finished on worker2; {OUTCOME_ON_ITS_WAY}"))
        );
        for late in [Some(OUTCOME_SHOWS_WITHIN_SECS), None] {
            assert_eq!(state_of(&decide(&f, log(late))), State::Lost, "{late:?}");
        }
        // A map's allocation completes whatever its calls did.
        let shared = Facts { shared: true, ..f };
        assert_eq!(state_of(&decide(&shared, log(Some(5)))), State::Lost);
        // The runner's own word that it is lost stands.
        let said = decide(&f, || LogFacts {
            age_secs: Some(5),
            ..scan_log("delegate: lost: its node was lost on every attempt (attempt 1 on worker1)\n")
        });
        assert_eq!(state_of(&said), State::Lost);
    }

    /// Issue 56: a waiting call says where it stands when the place helper
    /// told the client, and nothing of it otherwise.
    #[test]
    fn a_waiting_call_says_how_many_jobs_are_ahead() {
        let mut j = sj("PENDING", "Priority");
        let reason = |j: &SlurmJob| match decide(&facts(SlurmView::Present(j)), no_log) {
            Verdict::Live { state: State::Pending, reason } => reason,
            other => panic!("{other:?}"),
        };
        assert!(
            reason(&j).starts_with("waiting in Slurm's queue (Priority); "),
            "{}",
            reason(&j)
        );
        for (ahead, words) in [
            (37, ", 37 jobs ahead; "),
            (1, ", 1 job ahead; "),
            (0, ", next in line; "),
        ] {
            j.ahead = Some(ahead);
            let r = reason(&j);
            assert!(r.starts_with(&format!("waiting in Slurm's queue (Priority){words}")), "{r}");
        }
    }

    #[test]
    fn a_job_whose_worker_is_powering_up_says_so() {
        let cf = sj("CONFIGURING", "None");
        let f = Facts {
            submitted: true,
            age_secs: 3,
            started: None,
            cancel_requested: false,
            shared: false,
            by_claimer: false,
            run_again: false,
            started_secs: 0,
            start_recorded_lost: false,
            now_secs: 1_000_000,
            slurm: SlurmView::Present(&cf),
        };
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Pending,
                reason: COLD_START.into()
            }
        );
    }

    #[test]
    fn a_waiting_call_says_when_it_likely_starts() {
        let now = 1_000_000;
        let mut p = sj("PENDING", "Resources");
        p.expected_start = Some(now + 150);
        let f = Facts {
            now_secs: now,
            ..facts(SlurmView::Present(&p))
        };
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Pending,
                reason: "waiting in Slurm's queue (Resources); likely to start within 3 min \
                         (Slurm's estimate from the time limits of the jobs ahead)"
                    .into()
            }
        );
        assert_eq!(
            likely_start(Some(now + 30), now),
            "likely to start within a minute (Slurm's estimate)"
        );
        assert_eq!(
            likely_start(Some(now - 5), now),
            "likely to start within a minute (Slurm's estimate)"
        );
        assert!(likely_start(Some(now + 2 * 3600 + 61), now).contains("within 2 h 2 min"));
        // The place helper's likely start, when it made one, comes first.
        p.likely_start = Some(now + 400);
        p.ahead = Some(12);
        let f = Facts {
            now_secs: now,
            ..facts(SlurmView::Present(&p))
        };
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Pending,
                reason: "waiting in Slurm's queue (Resources), 12 jobs ahead; likely to start in about 7 min \
                         (from the running calls and how long calls lasted lately)"
                    .into()
            }
        );
        assert_eq!(
            likely_start_of_the_helper(now + 20, now),
            "likely to start within a minute (from the running calls and how long calls lasted lately)"
        );
        // Newer than the helper's last read: its place comes, and Slurm's
        // latest start (hours, in a rush) is not said meanwhile.
        let mut new = sj("PENDING", "Priority");
        new.expected_start = Some(now + 3 * 3600);
        new.place_coming = true;
        let f = Facts {
            now_secs: now,
            ..facts(SlurmView::Present(&new))
        };
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Pending,
                reason: "waiting in Slurm's queue (Priority); its place in line comes within seconds \
                         (the queue is read every few seconds)"
                    .into()
            }
        );
    }

    #[test]
    fn live_states() {
        let p = sj("PENDING", "Priority");
        let v = decide(&facts(SlurmView::Present(&p)), || panic!("log read for a live job"));
        assert_eq!(
            v,
            Verdict::Live {
                state: State::Pending,
                reason: "waiting in Slurm's queue (Priority); \
                         no estimate of its start yet (Slurm's scheduler has not placed it)"
                    .into()
            }
        );
        let held = sj("PENDING", "launch failed requeued held");
        match decide(&facts(SlurmView::Present(&held)), no_log) {
            Verdict::Live { state: State::Pending, reason } => {
                assert!(reason.contains("its launch on a node failed; it is released"), "{reason}")
            }
            v => panic!("a call held after a failed launch: {v:?}"),
        }
        let c = sj("CONFIGURING", "None");
        assert_eq!(state_of(&decide(&facts(SlurmView::Present(&c)), no_log)), State::Pending);
        for s in ["RUNNING", "COMPLETING"] {
            let r = sj(s, "None");
            assert_eq!(state_of(&decide(&facts(SlurmView::Present(&r)), no_log)), State::Running);
        }
        // A started file makes a job running whatever Slurm's queue says.
        let mut f = facts(SlurmView::Present(&p));
        f.started = Some("node1");
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Running,
                reason: "running on node1".into()
            }
        );
        // Its start record still hidden (a caching home), or (issue 52,
        // seen in the hub) only attempt 1's visible, on the machine lost
        // since, while Slurm runs attempt 2 on worker2: the node Slurm gave
        // it.
        let mut r = sj("RUNNING", "None");
        r.nodes = "worker2".into();
        let hidden = facts(SlurmView::Present(&r));
        let earlier = Facts {
            started: Some("worker1"),
            start_recorded_lost: true,
            ..hidden
        };
        for f in [hidden, earlier] {
            assert_eq!(
                decide(&f, no_log),
                Verdict::Live {
                    state: State::Running,
                    reason: "running on worker2".into()
                },
                "{f:?}"
            );
        }
        // (seen in the hub) its last allowed attempt, on worker1, lost, and
        // Slurm starting it again on worker2 when that machine came back:
        // that start ends lost, it never runs.
        let spent = Facts { started: Some("worker1"), ..hidden };
        assert_eq!(
            decide(&spent, no_log),
            Verdict::Live {
                state: State::Pending,
                reason: "its node worker1 was lost: Slurm started it again on worker2; \
                         its retries are spent: it ends lost there"
                    .into()
            }
        );
        // Slurm unreachable or not asked: never a terminal verdict.
        for view in [SlurmView::Unavailable, SlurmView::NotAsked] {
            assert_eq!(state_of(&decide(&facts(view), || panic!())), State::Pending);
            let mut f = facts(view);
            f.started = Some("n");
            assert_eq!(state_of(&decide(&f, || panic!())), State::Running);
        }
    }

    #[test]
    fn ended_without_outcome() {
        let gone = decide(&facts(SlurmView::Absent), no_log);
        assert_eq!(
            gone,
            Verdict::Ended {
                state: State::Lost,
                reason: "Slurm reports the job gone and the runner wrote no outcome (it is no longer in Slurm's queue)"
                    .into(),
                refused: false
            }
        );
        let nf = sj("NODE_FAIL", "NodeDown");
        match decide(&facts(SlurmView::Present(&nf)), no_log) {
            Verdict::Ended { state: State::Lost, reason, .. } => assert_eq!(
                reason,
                "Slurm reports the job NODE_FAIL and the runner wrote no outcome (NodeDown)"
            ),
            other => panic!("{other:?}"),
        }
        let failed = sj("FAILED", "NonZeroExitCode");
        let v = decide(&facts(SlurmView::Present(&failed)), || LogFacts {
            refusal: None,
            last_line: Some("exec: /usr/local/bin/sandbox-runner: not found".into()),
            age_secs: Some(1),
        });
        match v {
            Verdict::Ended { state: State::Lost, reason, .. } => {
                assert!(
                    reason.ends_with("ends with: exec: /usr/local/bin/sandbox-runner: not found"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
        // Issue 52, seen in the hub over a network home: the runner ended
        // the call lost (its retries spent) in the new attempt's directory,
        // which the reader's cache did not show yet; its log says why.
        let spent = sj("COMPLETED", "None");
        let v = decide(&facts(SlurmView::Present(&spent)), || LogFacts {
            refusal: None,
            last_line: Some("delegate: lost: its node was lost on every attempt (attempt 1 on worker1)".into()),
            age_secs: Some(2),
        });
        assert_eq!(
            v,
            Verdict::Ended {
                state: State::Lost,
                reason: "its node was lost on every attempt (attempt 1 on worker1)".into(),
                refused: false
            }
        );
        // A refusal in the log.
        let done = sj("COMPLETED", "None");
        assert_eq!(
            decide(&facts(SlurmView::Present(&done)), || scan_log(
                "noise\ndelegate: refused: image \"x\" is not allowed\nmore\n"
            )),
            Verdict::Ended {
                state: State::Failed,
                reason: "image \"x\" is not allowed".into(),
                refused: true
            }
        );
        let to = sj("TIMEOUT", "TimeLimit");
        assert_eq!(state_of(&decide(&facts(SlurmView::Present(&to)), no_log)), State::TimedOut);
        let ca = sj("CANCELLED", "None");
        assert_eq!(
            decide(&facts(SlurmView::Present(&ca)), no_log),
            Verdict::Ended {
                state: State::Cancelled,
                reason: "cancelled by Slurm".into(),
                refused: false
            }
        );
        let mut f = facts(SlurmView::Absent);
        f.cancel_requested = true;
        assert_eq!(
            decide(&f, || panic!()),
            Verdict::Ended {
                state: State::Cancelled,
                reason: "cancelled by the user".into(),
                refused: false
            }
        );
    }

    #[test]
    fn shared_allocations() {
        let running = sj("RUNNING", "None");
        let mut f = facts(SlurmView::Present(&running));
        f.shared = true;
        // An allocation of its map runs other calls.
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Pending,
                reason: WAITING_FOR_AN_ALLOCATION.into()
            }
        );
        let queued = sj("PENDING", "Resources");
        assert_eq!(
            decide(&facts_shared(SlurmView::Present(&queued)), no_log),
            Verdict::Live {
                state: State::Pending,
                reason: "waiting for an allocation of its map, in Slurm's queue (Resources); \
                         no estimate of its start yet (Slurm's scheduler has not placed it)"
                    .into()
            }
        );
        f.started = Some("n1");
        assert_eq!(state_of(&decide(&f, no_log)), State::Running);
        // Cancelled before it started: over at once, whatever Slurm says.
        f.started = None;
        f.cancel_requested = true;
        for view in [SlurmView::NotAsked, SlurmView::Present(&running), SlurmView::Absent] {
            f.slurm = view;
            assert_eq!(
                decide(&f, no_log),
                Verdict::Ended {
                    state: State::Cancelled,
                    reason: "cancelled by the user before it started".into(),
                    refused: false
                }
            );
        }
        // Started, then cancelled: the runner stops it; still running meanwhile.
        f.started = Some("n1");
        f.slurm = SlurmView::Present(&running);
        assert_eq!(state_of(&decide(&f, no_log)), State::Running);
        // The allocation ended before the call started.
        f.started = None;
        f.cancel_requested = false;
        let cancelled = sj("CANCELLED", "None");
        f.slurm = SlurmView::Present(&cancelled);
        assert_eq!(
            decide(&f, no_log),
            Verdict::Ended {
                state: State::Cancelled,
                reason: "cancelled by Slurm: its allocation was cancelled before this call started".into(),
                refused: false
            }
        );
        let timeout = sj("TIMEOUT", "TimeLimit");
        f.slurm = SlurmView::Present(&timeout);
        assert_eq!(state_of(&decide(&f, no_log)), State::Cancelled);
        f.slurm = SlurmView::Absent;
        match decide(&f, no_log) {
            Verdict::Ended { state: State::Lost, reason, .. } => {
                assert!(reason.contains("this call never started"), "{reason}")
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_maps_call_and_the_allocation_that_claimed_it() {
        let queued = sj("PENDING", "Resources");
        let mut f = facts_shared(SlurmView::NotAsked);
        f.started = Some("n1");
        // The allocation that claimed it runs on its node, or (requeued
        // after its node failed) waits again or runs elsewhere: lost.
        let mut on_n1 = sj("RUNNING", "None");
        on_n1.nodes = "n1".into();
        let mut elsewhere = on_n1.clone();
        elsewhere.nodes = "n2".into();
        // (the map's job as a whole: another allocation may run elsewhere)
        f.slurm = SlurmView::Present(&elsewhere);
        assert_eq!(state_of(&decide(&f, no_log)), State::Running);
        f.by_claimer = true;
        f.slurm = SlurmView::Present(&on_n1);
        assert_eq!(state_of(&decide(&f, no_log)), State::Running);
        for view in [SlurmView::Present(&elsewhere), SlurmView::Present(&queued)] {
            f.slurm = view;
            let v = decide(&f, no_log);
            assert_eq!(state_of(&v), State::Lost, "{v:?}");
            assert!(format!("{v:?}").contains("its allocation was requeued"), "{v:?}");
        }
        // Claimed, not started: starting while its allocation runs, lost
        // once that allocation is queued again.
        f.started = None;
        f.slurm = SlurmView::Present(&on_n1);
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Pending,
                reason: "claimed by an allocation of its map, starting".into()
            }
        );
        f.slurm = SlurmView::Present(&queued);
        let v = decide(&f, no_log);
        assert_eq!(state_of(&v), State::Lost, "{v:?}");
        assert!(
            format!("{v:?}").contains("claimed it and was requeued (Slurm: PENDING, Resources)"),
            "{v:?}"
        );
    }

    /// Issue 52: with retries left, a call whose allocation Slurm queued
    /// again (its node was lost) waits for its new attempt, and says why.
    #[test]
    fn a_call_whose_node_was_lost_runs_again_while_it_has_retries() {
        let mut requeued = sj("PENDING", "BeginTime");
        requeued.nodes = String::new();
        let mut f = facts(SlurmView::Present(&requeued));
        f.started = Some("worker2");
        // (an answer of squeue from before the start: running)
        assert_eq!(state_of(&decide(&f, no_log)), State::Running);
        f.started_secs = REQUEUE_SEEN_SECS;
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Pending,
                reason: "its node worker2 was lost: Slurm queued it again (PENDING, BeginTime); \
                         its retries are spent: it ends lost when Slurm starts it again"
                    .into()
            }
        );
        f.run_again = true;
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Pending,
                reason: "its node worker2 was lost: Slurm queued it again (PENDING, BeginTime); \
                         a new attempt runs it afresh"
                    .into()
            }
        );
        // A map's call: its claimer queued again, or running elsewhere.
        let mut elsewhere = sj("RUNNING", "None");
        elsewhere.nodes = "worker1".into();
        let mut m = facts_shared(SlurmView::Present(&requeued));
        (m.by_claimer, m.run_again, m.started) = (true, true, Some("worker2"));
        for view in [SlurmView::Present(&requeued), SlurmView::Present(&elsewhere)] {
            m.slurm = view;
            let v = decide(&m, no_log);
            assert_eq!(state_of(&v), State::Pending, "{v:?}");
            assert!(format!("{v:?}").contains("its node worker2 was lost"), "{v:?}");
        }
        m.started = None;
        m.slurm = SlurmView::Present(&requeued);
        assert!(format!("{:?}", decide(&m, no_log)).contains("it runs again when its allocation starts again"));
        // No retries left: lost, as before.
        m.run_again = false;
        assert_eq!(state_of(&decide(&m, no_log)), State::Lost);
    }

    #[test]
    fn never_submitted() {
        let mut f = facts(SlurmView::NotAsked);
        f.submitted = false;
        assert_eq!(state_of(&decide(&f, || panic!())), State::Pending);
        f.age_secs = SUBMIT_GRACE_SECS + 1;
        match decide(&f, || panic!()) {
            Verdict::Ended { state: State::Failed, reason, .. } => assert!(reason.contains("never submitted")),
            other => panic!("{other:?}"),
        }
        f.cancel_requested = true;
        assert_eq!(state_of(&decide(&f, || panic!())), State::Cancelled);
    }

    #[test]
    fn log_scanning() {
        assert_eq!(scan_log(""), LogFacts::default());
        let l = scan_log("a\n\ndelegate: refused: first\nb\ndelegate: refused: second  \n\n");
        assert_eq!(l.refusal.as_deref(), Some("second"));
        assert_eq!(l.last_line.as_deref(), Some("delegate: refused: second"));
    }
}

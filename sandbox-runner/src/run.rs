//! Running one job: checks, one container, output streaming, the outcome.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use delegate_protocol::agent::{Answer, Ended, EndedHow, RankRequest, Request, RunRequest};
use delegate_protocol::cancel;
use delegate_protocol::policy::{Policy, PolicyError};
use delegate_protocol::units::{format_duration, format_size};
use delegate_protocol::{
    atomic_write_at, encode, error_line, exists_at, now_ms, one_line, open_dir_nofollow, rank_file, refused_line,
    state_line, write_record_at, Outcome, Record, Started, State, Writer, CANCEL, OUTCOME, STDERR, STDOUT,
};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, Mode};
use tokio::sync::watch;

use crate::agent::Agent;
use crate::attempt::{self, Begin};
use crate::validate::{self, Checked, JobDir, Refusal};
use delegate_protocol::claim::Claim;

/// How the process ends.
#[derive(Debug, PartialEq, Eq)]
pub struct Finish {
    pub code: i32,
    /// The last line printed to stderr, if any.
    pub final_line: Option<String>,
    /// The job already had an outcome this run did not write (the client
    /// cancelled it before it started); it was left as it is.
    pub already_ended: bool,
}

pub const EXIT_OUTCOME: i32 = 0;
pub const EXIT_REFUSED: i32 = 3;
pub const EXIT_INTERNAL: i32 = 4;

/// How often a running job's `cancel` marker is looked for.
const CANCEL_POLL: Duration = Duration::from_millis(250);

/// Which signal asked the runner to stop.
pub type SignalWatch = watch::Receiver<Option<&'static str>>;

/// Installs handlers for SIGTERM, SIGINT and SIGHUP. Must be called inside
/// the runtime and before anything else, so a signal never kills the runner
/// while it holds a container.
pub fn install_signal_handlers() -> std::io::Result<SignalWatch> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = watch::channel(None);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
                _ = hup.recv() => "SIGHUP",
            };
            tracing::warn!("received {name}");
            if tx.borrow().is_none() {
                let _ = tx.send(Some(name));
            }
        }
    });
    Ok(rx)
}

/// Reason of a job that never started because the runner was signalled
/// (in a batch: the allocation ended before this call's turn).
pub fn not_started_reason(signal: &str) -> String {
    if signal == "SIGTERM" {
        "cancelled before it started: its allocation ended (SIGTERM from Slurm: scancel or Slurm time limit)".into()
    } else {
        format!("cancelled before it started: its allocation ended ({signal})")
    }
}

/// Everything about the job the docker phase needs.
struct RunningJob<'a> {
    dir: &'a JobDir,
    checked: &'a Checked,
    policy: &'a Policy,
    host: String,
    gid: u32,
    signals: SignalWatch,
    /// A rank of a multi-node job (`sandbox-runner rank`): its files are
    /// `<name>.<rank>` (rank 0's start record keeps the name `started`).
    rank: Option<u32>,
}

impl RunningJob<'_> {
    fn outcome(&self, state: State, reason: String) -> Outcome {
        Outcome::ended(state, reason, self.host.clone(), Writer::Runner)
    }
    fn signalled(&self) -> Option<&'static str> {
        *self.signals.borrow()
    }
    /// The outcome of a job that must not start after all: a signal
    /// arrived, the user's cancel marker appeared, or the client already
    /// wrote an outcome (cheap checks, no engine call).
    fn must_not_start(&self) -> Option<Outcome> {
        if let Some(sig) = self.signalled() {
            return Some(self.outcome(State::Cancelled, self.cancel_reason(sig)));
        }
        if exists_at(&self.dir.fd, CANCEL) || exists_at(&self.dir.fd, OUTCOME) {
            // With an outcome present the final write leaves it alone.
            let why = cancel::read_cancel_reason(&self.dir.fd, &self.dir.path);
            return Some(self.outcome(State::Cancelled, cancel::cancelled_before_start(why.as_deref())));
        }
        None
    }
    /// The marker's reason in the user's words (`cancelled by the user`
    /// when it gives none).
    fn cancelled_by_marker(&self) -> String {
        cancel::cancelled_by(cancel::read_cancel_reason(&self.dir.fd, &self.dir.path).as_deref())
    }
    fn cancel_reason(&self, signal: &str) -> String {
        if exists_at(&self.dir.fd, CANCEL) {
            self.cancelled_by_marker()
        } else if signal == "SIGTERM" {
            "cancelled (SIGTERM from Slurm: scancel or Slurm time limit)".into()
        } else {
            format!("cancelled ({signal})")
        }
    }
}

/// Runs the job in `path` as the calling user. Never panics on bad input.
pub async fn run_job(
    path: &Path,
    policy: Result<Policy, PolicyError>,
    agent: &mut Option<Agent>,
    signals: SignalWatch,
) -> Finish {
    run_call(path, policy, agent, signals, None).await
}

/// [`run_job`], beginning with a new attempt when an earlier one was lost
/// ([`attempt::begin`]; `reclaim`: a map's call this allocation claimed
/// in an earlier start, claimed again with this).
pub async fn run_call(
    path: &Path,
    policy: Result<Policy, PolicyError>,
    agent: &mut Option<Agent>,
    signals: SignalWatch,
    reclaim: Option<&Claim>,
) -> Finish {
    // (asked before anything can stop the run: see queued_again)
    let requeued = crate::slurm::restart_count() > 0;
    let begun = attempt::begin(path, nix::unistd::getuid().as_raw(), requeued, reclaim);
    run_begun(path, policy, agent, signals, None, begun).await
}

/// The name a rank writes a record under (see [`RunningJob::rank`]).
pub(crate) fn rank_name(name: &str, rank: Option<u32>) -> String {
    match rank {
        None => name.to_string(),
        Some(0) if name == <Started as Record>::NAME => name.to_string(),
        Some(k) => rank_file(name, k),
    }
}

/// Writes a record under its name, or its rank's name.
pub(crate) fn write_ranked<R: Record>(dir: &JobDir, r: &R, rank: Option<u32>) -> delegate_protocol::Result<()> {
    if rank.is_none() {
        return write_record_at(&dir.fd, &dir.path, r);
    }
    let bytes = encode(r)?;
    atomic_write_at(&dir.fd, &dir.path, &rank_name(R::NAME, rank), &bytes, 0o644)
}

/// Writes the job's (or rank's) outcome as the student and says how the
/// runner ends. An outcome that appeared while the job had not started is
/// the client's (a cancel): it is never replaced by the runner's.
fn write_outcome(dir: &JobDir, path: &Path, o: &Outcome, line: Option<String>, rank: Option<u32>) -> Finish {
    if o.started_ms.is_none() && exists_at(&dir.fd, OUTCOME) {
        tracing::info!(
            "{}: an outcome already exists (the job was cancelled before it started); left as it is",
            path.display()
        );
        return Finish {
            code: EXIT_OUTCOME,
            final_line: None,
            already_ended: true,
        };
    }
    match write_ranked(dir, o, rank) {
        Ok(()) => Finish {
            code: EXIT_OUTCOME,
            final_line: line,
            already_ended: false,
        },
        Err(e) => {
            tracing::error!("cannot write the outcome: {e}");
            Finish {
                code: if o.refused { EXIT_REFUSED } else { EXIT_INTERNAL },
                final_line: Some(line.unwrap_or_else(|| {
                    format!(
                        "delegate: error: cannot write the outcome ({e}); the job {}: {}",
                        o.state,
                        one_line(&o.reason)
                    )
                })),
                already_ended: false,
            }
        }
    }
}

/// [`run_job`] for one rank of a multi-node job (`rank`: what Slurm says
/// this task's node index is; the agent checks it against slurmctld). A
/// multi-node job is never run again.
pub async fn run_job_as(
    path: &Path,
    policy: Result<Policy, PolicyError>,
    agent: &mut Option<Agent>,
    signals: SignalWatch,
    rank: Option<u32>,
) -> Finish {
    run_begun(path, policy, agent, signals, rank, Begin::AsItIs).await
}

async fn run_begun(
    path: &Path,
    policy: Result<Policy, PolicyError>,
    agent: &mut Option<Agent>,
    signals: SignalWatch,
    rank: Option<u32>,
    begun: Begin,
) -> Finish {
    let uid = nix::unistd::getuid().as_raw();
    let real_gid = nix::unistd::getgid().as_raw();
    let dir = match validate::open_job_dir(path, uid) {
        Ok(d) => d,
        Err(r) => {
            tracing::error!("refusing {}: {}", path.display(), r.reason());
            return Finish {
                code: EXIT_REFUSED,
                final_line: Some(refused_line(r.reason())),
                already_ended: false,
            };
        }
    };
    let host = delegate_protocol::host::hostname();
    let write = |o: &Outcome, line: Option<String>| write_outcome(&dir, path, o, line, rank);
    let base = |state, reason: String| Outcome::ended(state, reason, host.clone(), Writer::Runner);

    let policy = match policy {
        Ok(p) => p,
        Err(e) => {
            let reason = format!("{e}; ask the cluster's administrators");
            tracing::error!("{reason}");
            let line = error_line(&reason);
            return write(&base(State::Failed, reason), Some(line));
        }
    };
    if let Begin::Spent(reason) = begun {
        tracing::warn!("{}: {reason}", path.display());
        let line = state_line(State::Lost, &reason);
        return write(&base(State::Lost, reason), Some(line));
    }
    let checked = match validate::check_job_as(&dir, uid, &policy, rank.is_some()) {
        Ok(c) => c,
        Err(r) => return refused(path, r, |o, line| write(o, line), &base),
    };
    if checked.cancel_requested {
        tracing::info!("job {} was cancelled before it started", checked.job_id);
        let why = cancel::read_cancel_reason(&dir.fd, &dir.path);
        return write(&base(State::Cancelled, cancel::cancelled_before_start(why.as_deref())), None);
    }
    // Signalled already (in a batch: a later call after the allocation
    // ended): end at once, without any engine call.
    if let Some(sig) = *signals.borrow() {
        let reason = not_started_reason(sig);
        tracing::info!("job {}: {reason}", checked.job_id);
        let line = format!("delegate: cancelled: {reason}");
        return write(&base(State::Cancelled, reason), Some(line));
    }
    let groups: Vec<u32> = nix::unistd::getgroups()
        .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
        .unwrap_or_default();
    let ctx = RunningJob {
        dir: &dir,
        checked: &checked,
        policy: &policy,
        host: host.clone(),
        gid: validate::sandbox_gid(checked.spec.gid, real_gid, &groups),
        signals,
        rank,
    };
    let outcome = agent_phase(&ctx, agent).await;
    if queued_again(&ctx, &outcome) {
        return Finish {
            code: EXIT_OUTCOME,
            final_line: Some(format!("delegate: {REQUEUED_LINE}")),
            already_ended: false,
        };
    }
    tracing::info!("job {}: {}: {}", checked.job_id, outcome.state, outcome.reason);
    if !still_same_dir(&dir) {
        // (its outcome still goes into the directory it ran in, which
        // readers no longer find under the job's name)
        tracing::warn!(
            "job {}: a newer attempt took the job's name while this one ran (its node was given up): \
             this attempt's outcome is discarded, kept beside the job as a lost attempt's",
            checked.job_id
        );
    }
    let line = final_line(&outcome);
    write(&outcome, line)
}

/// What the runner says when Slurm took its call back to run it again.
pub const REQUEUED_LINE: &str =
    "queued again: Slurm took the call back (its node was set down or lost); the next attempt runs it afresh";

/// A call stopped by Slurm because Slurm queued its job again (its node
/// was set down, the allocation requeued) ends with no outcome: the next
/// attempt runs it ([`attempt`]), within its retries. A cancel of the
/// user's own, or a call without retries, ends as it says.
fn queued_again(ctx: &RunningJob<'_>, outcome: &Outcome) -> bool {
    let stopped = outcome.state == State::Cancelled && ctx.signalled().is_some();
    let again = stopped
        && ctx.rank.is_none()
        && ctx.checked.spec.resources.retries > 0
        && !exists_at(&ctx.dir.fd, CANCEL)
        && crate::slurm::requeued_since_start();
    if again {
        tracing::warn!("job {}: {REQUEUED_LINE}", ctx.checked.job_id);
    }
    again
}

/// How a job that failed the checks ends: with an outcome that says why,
/// or (already ended before: in a batch, the client cancelled this call
/// before its turn) with none.
fn refused(
    path: &Path,
    r: Refusal,
    write: impl Fn(&Outcome, Option<String>) -> Finish,
    base: &dyn Fn(State, String) -> Outcome,
) -> Finish {
    if let Refusal::Job { reason, write_outcome: false } = &r {
        tracing::info!("not running {}: {reason}", path.display());
        return Finish {
            code: EXIT_REFUSED,
            final_line: Some(refused_line(reason)),
            already_ended: true,
        };
    }
    let reason = r.reason().to_string();
    tracing::error!("refusing {}: {reason}", path.display());
    let mut o = base(State::Failed, format!("refused: {reason}"));
    o.refused = true;
    write(&o, Some(refused_line(&reason)))
}

/// The one line a call's stderr log ends with (none for a completed call).
fn final_line(outcome: &Outcome) -> Option<String> {
    match outcome.state {
        State::Completed => None,
        _ if outcome.refused => Some(refused_line(
            outcome.reason.strip_prefix("refused: ").unwrap_or(&outcome.reason),
        )),
        _ => Some(state_line(outcome.state, &outcome.reason)),
    }
}

/// True when the job directory's path still names the directory that was
/// checked (same device and inode, still no symlink on the way). The engine
/// resolves the bind-mount source by path, as root; this narrows (it cannot
/// close) the window in which a user could swap a path component.
fn still_same_dir(dir: &JobDir) -> bool {
    let now = match open_dir_nofollow(&dir.path) {
        Ok(fd) => fd,
        Err(_) => return false,
    };
    match (fstat(dir.fd.as_fd()), fstat(now.as_fd())) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// Creates an output file in the job directory; it must not exist.
fn create_output(dir: &JobDir, name: &str) -> Result<OwnedFd, String> {
    openat(
        dir.fd.as_fd(),
        name,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| format!("cannot create {}: {e}", dir.path.join(name).display()))
}

/// Why the runner asked the agent to kill the container.
enum KillWhy {
    Signalled(&'static str),
    CancelMarker,
    /// The start could not be recorded (the reason).
    Record(String),
}

/// What woke the runner while the agent runs the call.
enum Event {
    Answer(Result<Answer, String>),
    Signal(&'static str),
    Marker,
}

/// Moves this process to the cores the sandbox does not get (once: every
/// call of an allocation asks for the same cores).
fn keep_off_sandbox_cores(want: u32) {
    use delegate_protocol::cpus;
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let placed = cpus::allowed(0).map(|a| cpus::place(&a, want));
        match placed {
            Ok(Some(p)) if !p.others.is_empty() => {
                if let Err(e) = cpus::set_all_threads(&p.others) {
                    tracing::warn!("cannot keep off the sandbox's cores: {e}");
                } else {
                    tracing::debug!("on cores {:?}, the sandbox on {:?}", p.others, p.sandbox);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("{e}"),
        }
    });
}

/// Makes the call's output files (as the student), connects to the
/// node's agent (afresh when the connection is nearly idle), checks the
/// directory a last time and asks the agent to run the call, handing it
/// the directory and the output files as descriptors. `Err`: the outcome
/// the call ends with instead.
async fn request_run(ctx: &RunningJob<'_>, agent: &mut Option<Agent>) -> Result<(), Outcome> {
    let spec = &ctx.checked.spec;
    let (out_name, err_name) = (rank_name(STDOUT, ctx.rank), rank_name(STDERR, ctx.rank));
    let (stdout, stderr) = match (create_output(ctx.dir, &out_name), create_output(ctx.dir, &err_name)) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => return Err(ctx.outcome(State::Failed, e)),
    };
    if agent.as_ref().is_some_and(Agent::nearly_idle) {
        *agent = None;
    }
    if agent.is_none() {
        match Agent::connect(&ctx.policy.agent_socket).await {
            Ok(a) => *agent = Some(a),
            Err(e) => return Err(ctx.outcome(State::Failed, e)),
        }
    }
    let Some(a) = agent.as_mut() else {
        return Err(ctx.outcome(State::Failed, "internal error: no agent connection".into()));
    };
    if !still_same_dir(ctx.dir) {
        return Err(ctx.outcome(State::Failed, delegate_protocol::host::REPLACED.into()));
    }
    // Last look before the container exists.
    if let Some(o) = ctx.must_not_start() {
        return Err(o);
    }
    // On an exclusive node the sandbox gets the allocation's highest cores
    // (the agent applies the same rule): this process keeps to the others.
    if ctx.policy.pin_cpus {
        keep_off_sandbox_cores(spec.resources.cpus);
    }
    let run = RunRequest {
        spec: spec.clone(),
        job_dir: ctx.dir.path.display().to_string(),
        gid: ctx.gid,
    };
    let req = match ctx.rank {
        Some(rank) => Request::RunRank(RankRequest { run, rank }),
        None => Request::Run(run),
    };
    if let Err(e) = a.send(&req, &[ctx.dir.fd.as_fd(), stdout.as_fd(), stderr.as_fd()]).await {
        *agent = None;
        return Err(ctx.outcome(State::Failed, e));
    }
    Ok(())
}

/// The agent part: the agent creates, starts, watches and removes the
/// container; the runner records the start and the outcome, as the user.
/// Always returns an outcome; the container never outlives the call (the
/// agent removes it, also when this process dies).
async fn agent_phase(ctx: &RunningJob<'_>, agent: &mut Option<Agent>) -> Outcome {
    let job = ctx.checked.job_id.as_str();
    if let Some(o) = ctx.must_not_start() {
        return o;
    }
    if let Err(o) = request_run(ctx, agent).await {
        return o;
    }
    let Some(a) = agent.as_mut() else {
        return ctx.outcome(State::Failed, "internal error: no agent connection".into());
    };
    let mut signals = ctx.signals.clone();
    let mut marker_poll = tokio::time::interval(CANCEL_POLL);
    marker_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut started = false;
    let mut kill: Option<KillWhy> = None;
    loop {
        let watching = kill.is_none();
        let ev = tokio::select! {
            r = a.recv() => Event::Answer(r),
            sig = next_signal(&mut signals), if watching => Event::Signal(sig),
            () = cancel_marker(ctx, &mut marker_poll, started), if watching => Event::Marker,
        };
        let answer = match ev {
            Event::Signal(sig) => {
                kill = Some(KillWhy::Signalled(sig));
                let _ = a.send(&Request::Kill, &[]).await;
                continue;
            }
            Event::Marker => {
                kill = Some(KillWhy::CancelMarker);
                let _ = a.send(&Request::Kill, &[]).await;
                continue;
            }
            Event::Answer(r) => r,
        };
        match answer {
            Ok(Answer::Created { container_id, perf_mode }) => {
                tracing::info!("created container {container_id} for job {job} (perf mode {perf_mode})");
            }
            Ok(Answer::Started { container_id, perf_mode, started_ms }) => {
                started = true;
                // A job whose start cannot be recorded is stopped: the directory is broken.
                if let Err(why) = record_start(ctx, container_id, perf_mode, started_ms) {
                    if kill.is_none() {
                        kill = Some(KillWhy::Record(why));
                        let _ = a.send(&Request::Kill, &[]).await;
                    }
                }
            }
            Ok(Answer::Fingerprint(f)) => {
                // After the sandbox ended (the agent sends it with the end):
                // replaces anything the call left under that name.
                if let Err(e) = write_ranked(ctx.dir, &*f, ctx.rank) {
                    tracing::warn!("job {job}: cannot record the machine's fingerprint: {e}");
                }
            }
            Ok(Answer::Ended(e)) => return ended_outcome(ctx, e, kill),
            Ok(Answer::Refused(reason)) => {
                tracing::error!("the delegate agent refused job {job}: {reason}");
                *agent = None;
                let mut o = ctx.outcome(State::Failed, format!("refused: {reason}"));
                o.refused = true;
                return o;
            }
            Ok(Answer::Failed(reason)) => return ctx.outcome(State::Failed, reason),
            Ok(Answer::Probe(_) | Answer::Queue { .. }) => {}
            Err(e) => {
                *agent = None;
                return ctx.outcome(State::Failed, e);
            }
        }
    }
}

/// The signal Slurm sent this step (SIGTERM on scancel or the time limit).
async fn next_signal(signals: &mut SignalWatch) -> &'static str {
    loop {
        if let Some(s) = *signals.borrow_and_update() {
            return s;
        }
        if signals.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Returns once the call has started and the user's cancel marker exists.
async fn cancel_marker(ctx: &RunningJob<'_>, poll: &mut tokio::time::Interval, started: bool) {
    loop {
        poll.tick().await;
        if started && exists_at(&ctx.dir.fd, CANCEL) {
            return;
        }
    }
}

/// Records that the call started (the `started` file, per rank).
fn record_start(ctx: &RunningJob<'_>, container_id: String, perf_mode: String, started_ms: u64) -> Result<(), String> {
    tracing::info!("started container {container_id}");
    let rec = Started {
        host: ctx.host.clone(),
        started_ms,
        container_id,
        perf_mode,
    };
    write_ranked(ctx.dir, &rec, ctx.rank).map_err(|e| format!("cannot record the start: {e}"))
}

/// The outcome of a call the agent ran.
/// What the user reads about a sandbox that exited: the state and the
/// reason, from its exit code, the OOM killer's mark and whether the
/// engine went away (a pure function of the agent's report).
fn exited_words(e: &Ended, mem_bytes: u64) -> (State, String) {
    let failed = |r: String| (State::Failed, r);
    match e.exit_code {
        // The main process survived, a child of it was the one killed.
        Some(c) if e.oom_killed && c != 137 => failed(format!(
            "a process in the sandbox was killed: out of memory (limit {}); the main process exited with code {c}",
            format_size(mem_bytes)
        )),
        _ if e.oom_killed => failed(format!("killed: out of memory (limit {})", format_size(mem_bytes))),
        Some(0) => (State::Completed, "exited with code 0".into()),
        Some(c) if (129..160).contains(&c) => failed(format!("exited with code {c} (killed by signal {})", c - 128)),
        Some(c) => failed(format!("exited with code {c}")),
        None => match &e.engine_gone {
            Some(why) => failed(format!(
                "the Docker engine stopped during the job and the sandbox ended with it ({why})"
            )),
            None => failed("the sandbox ended but its exit code is unknown".into()),
        },
    }
}

fn ended_outcome(ctx: &RunningJob<'_>, e: Ended, kill: Option<KillWhy>) -> Outcome {
    let spec = &ctx.checked.spec;
    let mut o = ctx.outcome(State::Failed, String::new());
    o.started_ms = e.started_ms;
    o.oom_killed = e.oom_killed;
    match e.how {
        EndedHow::TimedOut => {
            o.state = State::TimedOut;
            o.reason = format!("time limit of {} reached", format_duration(spec.resources.time_limit_secs));
        }
        EndedHow::Killed => match kill {
            Some(KillWhy::Signalled(sig)) => {
                o.state = State::Cancelled;
                o.reason = ctx.cancel_reason(sig);
            }
            Some(KillWhy::CancelMarker) => {
                o.state = State::Cancelled;
                o.reason = ctx.cancelled_by_marker();
            }
            Some(KillWhy::Record(r)) => {
                o.started_ms = None;
                o.reason = r;
            }
            None => o.reason = "the sandbox was stopped by the delegate agent".into(),
        },
        EndedHow::WaitFailed(r) | EndedHow::Stopped(r) | EndedHow::Failed(r) => o.reason = r,
        EndedHow::Exited => {
            o.exit_code = e.exit_code;
            (o.state, o.reason) = exited_words(&e, spec.resources.mem_bytes);
        }
    }
    if let Some(note) = e.output_note {
        o.reason.push_str(&format!("; {note}"));
    }
    if let Some(r) = e.removal_error {
        o.reason.push_str(&format!("; {r}"));
    }
    o.finished_ms = now_ms();
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: Option<i32>, oom: bool, engine_gone: Option<&str>) -> Ended {
        Ended {
            how: EndedHow::Exited,
            exit_code: code,
            oom_killed: oom,
            engine_gone: engine_gone.map(str::to_string),
            output_note: None,
            removal_error: None,
            started_ms: Some(1),
        }
    }

    #[test]
    fn what_the_user_reads_about_an_exit() {
        let m = 64 << 20;
        let w = |code, oom, gone| exited_words(&exited(code, oom, gone), m);
        assert_eq!(w(Some(0), false, None), (State::Completed, "exited with code 0".into()));
        assert_eq!(w(Some(3), false, None), (State::Failed, "exited with code 3".into()));
        assert_eq!(
            w(Some(137), false, None),
            (State::Failed, "exited with code 137 (killed by signal 9)".into())
        );
        assert_eq!(
            w(Some(137), true, None),
            (State::Failed, "killed: out of memory (limit 64M)".into())
        );
        let (state, why) = w(Some(0), true, None);
        assert_eq!(state, State::Failed);
        assert!(
            why.starts_with("a process in the sandbox was killed: out of memory (limit 64M)"),
            "{why}"
        );
        assert!(why.ends_with("the main process exited with code 0"), "{why}");
        assert!(w(None, false, Some("engine restarted"))
            .1
            .contains("Docker engine stopped during the job"));
        assert_eq!(w(None, false, None).1, "the sandbox ended but its exit code is unknown");
    }
}

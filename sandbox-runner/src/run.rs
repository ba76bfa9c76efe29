//! Running one job: checks, one container, output streaming, the outcome.

use std::os::fd::AsFd;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::Duration;

use bollard::query_parameters::{AttachContainerOptions, WaitContainerOptions};
use bollard::Docker;
use delegate_protocol::policy::{PerfMode, Policy, PolicyError};
use delegate_protocol::units::{format_duration, format_size};
use delegate_protocol::{
    check_clean_absolute, error_line, exists_at, now_ms, one_line, open_dir_nofollow, refused_line, state_line,
    write_record_at, Outcome, Started, State, Writer, CANCEL, OUTCOME, STDERR, STDOUT,
};
use futures_util::{FutureExt, StreamExt};
use nix::sys::stat::fstat;
use tokio::sync::watch;

use crate::config::{self, Params, Perf};
use crate::engine::{self, EngineError};
use crate::output::{create_output, pump, Pumped};
use crate::validate::{self, Checked, JobDir, Refusal};

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

/// Time allowed for the output to drain after the container ended.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(30);
/// Time allowed for the output to drain after a kill (SIGKILL from Slurm
/// follows SIGTERM after KillWait, 5 s by default).
const DRAIN_AFTER_KILL: Duration = Duration::from_millis(1500);
/// Time allowed for the wait/inspect/remove calls on the kill path.
const KILL_PATH_CALL: Duration = Duration::from_millis(1500);
/// How often a running job's `cancel` marker is looked for.
const CANCEL_POLL: Duration = Duration::from_millis(250);
/// How long the removal waits for an engine that does not answer (restarting).
const REMOVE_PATIENCE: Duration = Duration::from_secs(30);

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

/// Runs `f` with the effective gid switched to the real gid, so files the
/// runner creates in the job directory belong to the user's group rather
/// than to `docker` (the setgid group). Only called where no connection to
/// the engine is being opened (the engine socket needs the docker group).
pub(crate) fn as_user_group<T>(f: impl FnOnce() -> T) -> T {
    let real = nix::unistd::getgid();
    let effective = nix::unistd::getegid();
    if real == effective {
        return f();
    }
    let switched = nix::unistd::setegid(real).is_ok();
    let out = f();
    if switched {
        if let Err(e) = nix::unistd::setegid(effective) {
            tracing::error!("cannot restore the effective gid: {e}");
        }
    }
    out
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
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
struct Ctx<'a> {
    dir: &'a JobDir,
    checked: &'a Checked,
    policy: &'a Policy,
    host: String,
    uid: u32,
    gid: u32,
    slurm_job: String,
    signals: SignalWatch,
}

impl Ctx<'_> {
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
            return Some(self.outcome(State::Cancelled, "cancelled before it started".into()));
        }
        None
    }
    fn cancel_reason(&self, signal: &str) -> String {
        if exists_at(&self.dir.fd, CANCEL) {
            "cancelled by the user".into()
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
    slurm_job_env: Option<String>,
    signals: SignalWatch,
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
    let host = hostname();
    let write = |o: &Outcome, line: Option<String>| -> Finish {
        // An outcome that appeared while the job had not started is the
        // client's (a cancel): it is never replaced by the runner's.
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
        match as_user_group(|| write_record_at(&dir.fd, &dir.path, o)) {
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
    };
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
    let checked = match validate::check_job(&dir, uid, &policy) {
        Ok(c) => c,
        Err(Refusal::Job { reason, write_outcome: false }) => {
            // Not an error of this run: the job ended before (in a batch,
            // the client cancelled this call before its turn).
            tracing::info!("not running {}: {reason}", path.display());
            return Finish {
                code: EXIT_REFUSED,
                final_line: Some(refused_line(&reason)),
                already_ended: true,
            };
        }
        Err(r) => {
            let reason = r.reason().to_string();
            tracing::error!("refusing {}: {reason}", path.display());
            let mut o = base(State::Failed, format!("refused: {reason}"));
            o.refused = true;
            return write(&o, Some(refused_line(&reason)));
        }
    };
    if checked.cancel_requested {
        tracing::info!("job {} was cancelled before it started", checked.job_id);
        return write(&base(State::Cancelled, "cancelled before it started".into()), None);
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
    let ctx = Ctx {
        dir: &dir,
        checked: &checked,
        policy: &policy,
        host: host.clone(),
        uid,
        gid: validate::sandbox_gid(checked.spec.gid, real_gid, &groups),
        slurm_job: config::sanitize_slurm_job(slurm_job_env.as_deref()),
        signals,
    };
    let outcome = docker_phase(&ctx).await;
    tracing::info!("job {}: {}: {}", checked.job_id, outcome.state, outcome.reason);
    let line = match outcome.state {
        State::Completed => None,
        _ => Some(state_line(outcome.state, &outcome.reason)),
    };
    write(&outcome, line)
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

const REPLACED: &str = "the job directory was replaced while the job was starting";

/// The docker part: always returns an outcome, never leaves a container.
async fn docker_phase(ctx: &Ctx<'_>) -> Outcome {
    let spec = &ctx.checked.spec;
    let socket = &ctx.policy.docker_socket;
    if let Err(e) = check_clean_absolute(socket) {
        return ctx.outcome(State::Failed, format!("the site policy's docker_socket is invalid: {e}"));
    }
    let limits = match ctx.policy.limits() {
        Ok(l) => l,
        Err(e) => return ctx.outcome(State::Failed, format!("the site policy is invalid: {e}")),
    };
    let docker = match engine::connect(socket).await {
        Ok(d) => d,
        Err(e) => return ctx.outcome(State::Failed, e.to_string()),
    };
    let job = ctx.checked.job_id.as_str();
    if let Err(e) = engine::sweep(&docker, job, &ctx.slurm_job, ctx.uid).await {
        tracing::warn!("could not sweep leftover containers: {}", engine::short_reason(&e));
    }
    if let Some(o) = ctx.must_not_start() {
        return o;
    }
    let (stdout, stderr) = match as_user_group(|| (create_output(ctx.dir, STDOUT), create_output(ctx.dir, STDERR))) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => return ctx.outcome(State::Failed, e),
    };

    let params = |perf| Params {
        spec,
        job_dir: &ctx.dir.path,
        uid: ctx.uid,
        gid: ctx.gid,
        slurm_job: &ctx.slurm_job,
        tmp_bytes: limits.tmp_bytes,
        max_pids: ctx.policy.max_pids,
        perf,
    };
    let mut perf = match ctx.policy.perf_mode {
        // Engines before Docker 24 (API 1.43) reject CAP_PERFMON by name:
        // decide from the negotiated API version instead of paying a failed
        // create per job. Newer engines still fall back below if they reject.
        PerfMode::Auto if !engine::may_accept_perfmon(&docker) => Perf::Seccomp,
        PerfMode::Auto | PerfMode::Perfmon => Perf::Perfmon,
        PerfMode::Seccomp => Perf::Seccomp,
        PerfMode::Off => Perf::Off,
    };
    if !still_same_dir(ctx.dir) {
        return ctx.outcome(State::Failed, REPLACED.into());
    }
    // Last look before the container exists: a cancel (marker or the
    // client's outcome) or a signal that arrived meanwhile.
    if let Some(o) = ctx.must_not_start() {
        return o;
    }
    let name = format!("delegate-{job}");
    let classify = |e: &bollard::errors::Error, action| engine::classify(e, action, socket, &ctx.host, &spec.image);
    let mut created = engine::create(&docker, Some(&name), config::container_config(&params(perf))).await;
    if let Err(e) = &created {
        if perf == Perf::Perfmon && engine::is_unknown_capability(e) {
            if ctx.policy.perf_mode == PerfMode::Perfmon {
                return ctx.outcome(
                    State::Failed,
                    EngineError::PerfmonRejected { host: ctx.host.clone() }.to_string(),
                );
            }
            tracing::warn!(
                "the Docker engine rejects CAP_PERFMON ({}); falling back to delegate's seccomp profile",
                engine::short_reason(e)
            );
            perf = Perf::Seccomp;
            created = engine::create(&docker, Some(&name), config::container_config(&params(perf))).await;
        }
    }
    let id = match created {
        Ok(id) => id,
        Err(e) => return ctx.outcome(State::Failed, classify(&e, "create the sandbox").to_string()),
    };
    tracing::info!("created container {id} for job {job} (perf mode {})", perf.as_str());

    // Everything from here on ends with the container removed, panics included.
    let result = AssertUnwindSafe(supervise(ctx, &docker, &id, perf, stdout, stderr))
        .catch_unwind()
        .await;
    // A restarting engine is waited for (bounded) rather than leaving the
    // container behind; the Slurm epilog is the next safety net.
    let removed = engine::remove_patiently(&docker, &id, REMOVE_PATIENCE).await;
    let mut outcome = match result {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => ctx.outcome(State::Failed, e),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            ctx.outcome(State::Failed, format!("internal error in sandbox-runner: {msg}"))
        }
    };
    match removed {
        Ok(()) => tracing::info!("removed container {id}"),
        Err(e) => {
            let r = engine::short_reason(&e);
            tracing::error!("could not remove container {id}: {r}");
            outcome
                .reason
                .push_str(&format!("; the sandbox container {id} could not be removed: {r}"));
        }
    }
    outcome.finished_ms = now_ms();
    outcome
}

/// How the container's run ended.
enum Ended {
    Exited,
    TimedOut,
    Signalled(&'static str),
    /// The user's `cancel` marker appeared.
    CancelMarker,
    WaitFailed(String),
}

/// Attaches, starts, waits (time limit, signals), kills if needed, drains
/// the output and inspects the container. The caller removes it.
async fn supervise(
    ctx: &Ctx<'_>,
    docker: &Docker,
    id: &str,
    perf: Perf,
    stdout: tokio::fs::File,
    stderr: tokio::fs::File,
) -> Result<Outcome, String> {
    let spec = &ctx.checked.spec;
    let socket = &ctx.policy.docker_socket;
    let classify =
        |e: &bollard::errors::Error, action| engine::classify(e, action, socket, &ctx.host, &spec.image).to_string();
    if let Some(o) = ctx.must_not_start() {
        return Ok(o);
    }
    // Attach before starting, so no output is lost.
    let attach = AttachContainerOptions {
        stream: true,
        stdout: true,
        stderr: true,
        stdin: false,
        logs: false,
        detach_keys: None,
    };
    let attached = docker
        .attach_container(id, Some(attach))
        .await
        .map_err(|e| classify(&e, "attach to the sandbox"))?;
    let mut pump_task = tokio::spawn(pump(attached.output, stdout, stderr));
    drop(attached.input);

    docker
        .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
        .await
        .map_err(|e| classify(&e, "start the sandbox"))?;
    let started_ms = now_ms();
    tracing::info!("started container {id}");
    if !still_same_dir(ctx.dir) {
        // The caller removes (and so kills) the container.
        return Err(REPLACED.into());
    }
    let started = Started {
        host: ctx.host.clone(),
        started_ms,
        container_id: id.to_string(),
        perf_mode: perf.as_str().to_string(),
    };
    // A job whose start cannot be recorded is stopped: the directory is broken.
    as_user_group(|| write_record_at(&ctx.dir.fd, &ctx.dir.path, &started))
        .map_err(|e| format!("cannot record the start: {e}"))?;

    let limit = Duration::from_secs(spec.resources.time_limit_secs);
    let mut signals = ctx.signals.clone();
    let mut wait = docker.wait_container(id, None::<WaitContainerOptions>);
    let mut marker_poll = tokio::time::interval(CANCEL_POLL);
    marker_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ended = tokio::select! {
        w = wait.next() => match w {
            // Non-zero exits come back as DockerContainerWaitError.
            Some(Ok(_)) | Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => Ended::Exited,
            Some(Err(e)) => Ended::WaitFailed(classify(&e, "wait for the sandbox")),
            None => Ended::WaitFailed("the Docker engine ended the wait without a result".into()),
        },
        _ = tokio::time::sleep(limit) => Ended::TimedOut,
        sig = async {
            loop {
                if let Some(s) = *signals.borrow_and_update() {
                    return s;
                }
                if signals.changed().await.is_err() {
                    // The signal task is gone: never resolve.
                    std::future::pending::<()>().await;
                }
            }
        } => Ended::Signalled(sig),
        () = async {
            loop {
                marker_poll.tick().await;
                if exists_at(&ctx.dir.fd, CANCEL) {
                    return;
                }
            }
        } => Ended::CancelMarker,
    };

    let killing = !matches!(ended, Ended::Exited);
    if killing {
        tracing::warn!("killing container {id}");
        if let Err(e) = engine::kill(docker, id).await {
            tracing::error!("could not kill container {id}: {}", engine::short_reason(&e));
        }
        // Let the engine notice the death before inspecting; bounded.
        let _ = tokio::time::timeout(KILL_PATH_CALL, wait.next()).await;
    }
    drop(wait);

    let drain = if killing { DRAIN_AFTER_KILL } else { DRAIN_AFTER_EXIT };
    let pumped = match tokio::time::timeout(drain, &mut pump_task).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => Pumped {
            error: Some(format!("the output copier failed: {e}")),
        },
        Err(_) => {
            pump_task.abort();
            Pumped {
                error: Some("the output did not finish draining in time and may be incomplete".into()),
            }
        }
    };

    let inspect_timeout = if killing {
        KILL_PATH_CALL
    } else {
        Duration::from_secs(30)
    };
    let mut engine_gone = None;
    let state = match tokio::time::timeout(
        inspect_timeout,
        docker.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>),
    )
    .await
    {
        Ok(Ok(info)) => info.state,
        Ok(Err(e)) => {
            tracing::error!("cannot inspect container {id}: {}", engine::short_reason(&e));
            if engine::unreachable(&e) {
                engine_gone = Some(classify(&e, "inspect the sandbox"));
            }
            None
        }
        Err(_) => {
            tracing::error!("inspecting container {id} timed out");
            None
        }
    };
    let exit_code = state.as_ref().and_then(|s| s.exit_code).map(|c| c as i32);
    let oom = state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);

    let mut o = ctx.outcome(State::Failed, String::new());
    o.started_ms = Some(started_ms);
    o.oom_killed = oom;
    match ended {
        Ended::TimedOut => {
            o.state = State::TimedOut;
            o.reason = format!("time limit of {} reached", format_duration(spec.resources.time_limit_secs));
        }
        Ended::Signalled(sig) => {
            o.state = State::Cancelled;
            o.reason = ctx.cancel_reason(sig);
        }
        Ended::CancelMarker => {
            o.state = State::Cancelled;
            o.reason = "cancelled by the user".into();
        }
        Ended::WaitFailed(reason) => {
            o.reason = reason;
        }
        Ended::Exited => {
            o.exit_code = exit_code;
            match exit_code {
                // The main process survived, a child of it was the one killed.
                Some(c) if oom && c != 137 => {
                    o.reason = format!(
                        "a process in the sandbox was killed: out of memory (limit {}); the main process exited with code {c}",
                        format_size(spec.resources.mem_bytes)
                    );
                }
                _ if oom => {
                    o.reason = format!("killed: out of memory (limit {})", format_size(spec.resources.mem_bytes));
                }
                Some(0) => {
                    o.state = State::Completed;
                    o.reason = "exited with code 0".into();
                }
                Some(c) if (129..160).contains(&c) => {
                    o.reason = format!("exited with code {c} (killed by signal {})", c - 128);
                }
                Some(c) => o.reason = format!("exited with code {c}"),
                None => match engine_gone.take() {
                    // The engine stopped (restart, crash) and took the sandbox with it.
                    Some(why) => {
                        o.reason =
                            format!("the Docker engine stopped during the job and the sandbox ended with it ({why})")
                    }
                    None => o.reason = "the sandbox ended but its exit code is unknown".into(),
                },
            }
        }
    }
    if let Some(e) = pumped.error {
        o.reason.push_str(&format!("; the output may be incomplete: {e}"));
    }
    Ok(o)
}

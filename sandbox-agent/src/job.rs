//! Serving one runner: identify it, then run its calls one at a time, each
//! in one fresh container bound to the verified job, the checked directory
//! inode and the life of the batch task.

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::query_parameters::{AttachContainerOptions, WaitContainerOptions};
use bollard::Docker;
use delegate_protocol::agent::{Answer, Ended, EndedHow, Request, RunRequest};
use delegate_protocol::policy::{OutputLimit, PerfMode, Policy, DEFAULT_POLICY_PATH, POLICY_ENV};
use delegate_protocol::units::format_size;
use delegate_protocol::{check_clean_absolute, now_ms, JobId};
use futures_util::{FutureExt, StreamExt};
use nix::sys::stat::{fstat, SFlag};
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

use crate::config::{self, Params, Perf};
use crate::conn::{self, Incoming};
use crate::engine::{self, EngineError};
use crate::ident::{self, Caller};
use crate::output::{pump, Pumped};
use crate::stage::Staged;

/// Time allowed for the output to drain after the container ended.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(30);
/// ... after a kill.
const DRAIN_AFTER_KILL: Duration = Duration::from_millis(1500);
/// Time allowed for the wait/inspect calls on the kill path.
const KILL_PATH_CALL: Duration = Duration::from_millis(1500);
/// How long the removal waits for an engine that does not answer (restarting).
const REMOVE_PATIENCE: Duration = Duration::from_secs(30);
/// How often the job directory's usage is summed.
const DISK_POLL: Duration = Duration::from_secs(1);
/// The test-only pause between the checks and the container's creation:
/// honoured only when this file is root-owned and not writable by others
/// (written by the test fixture as root, never reachable by a job).
pub const TEST_PAUSE_FILE: &str = "/etc/delegate/agent-test-pause";

pub const REPLACED: &str = "the job directory was replaced while the job was starting";

/// State shared by every connection.
pub struct Shared {
    /// Slurm jobs with a sandbox (being set up or running) right now.
    pub running: Mutex<HashSet<String>>,
    pub stepds: Vec<PathBuf>,
    pub node: String,
}

/// The policy: the root-owned default file, or `$DELEGATE_POLICY` of the
/// agent's own (root) environment.
pub fn load_policy() -> Result<Policy, delegate_protocol::policy::PolicyError> {
    let path = std::env::var_os(POLICY_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_POLICY_PATH));
    Policy::load(&path, true)
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// Serves one connection until the runner closes it.
pub async fn serve(stream: UnixStream, shared: Arc<Shared>) {
    let cred = match stream.peer_cred() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("no peer credentials: {e}");
            return;
        }
    };
    let (pid, uid) = (cred.pid().unwrap_or(0), cred.uid());
    let stream = Arc::new(stream);
    let mut rx = conn::spawn_reader(stream.clone());
    let mut caller: Option<Caller> = None;
    while let Some(Incoming { request, fds }) = rx.recv().await {
        let answer = match request {
            Request::Probe => {
                let report = match load_policy() {
                    Ok(p) => crate::probe::probe(&p).await,
                    Err(e) => delegate_protocol::agent::ProbeReport {
                        error: e.to_string(),
                        perf_mode: "unknown".into(),
                        perf_detail: "the site policy could not be read".into(),
                        ..Default::default()
                    },
                };
                Answer::Probe(report)
            }
            Request::Kill => continue,
            Request::Run(req) => {
                if caller.is_none() {
                    match ident::identify(pid, uid, &shared.stepds, &shared.node).await {
                        Ok(c) => {
                            tracing::info!("pid {pid} uid {uid}: batch task of Slurm job {}", c.job);
                            caller = Some(c);
                        }
                        Err(why) => {
                            tracing::warn!("refused pid {pid} uid {uid}: {why}");
                            let _ = conn::send(&stream, &Answer::Refused(why)).await;
                            return;
                        }
                    }
                }
                let Some(c) = caller.as_ref() else { return };
                if !c.alive() {
                    let _ = conn::send(&stream, &Answer::Refused("the batch task has ended".into())).await;
                    return;
                }
                run(&shared, c, req, fds, &stream, &mut rx).await
            }
        };
        if let Err(e) = conn::send(&stream, &answer).await {
            tracing::info!("pid {pid}: cannot answer ({e}); closing");
            return;
        }
    }
}

/// Removes the job from the running set when dropped.
struct Slot<'a> {
    shared: &'a Shared,
    job: String,
}
impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Ok(mut r) = self.shared.running.lock() {
            r.remove(&self.job);
        }
    }
}

/// Removes the container when dropped while armed (a panic, a cancelled
/// task): the normal path removes it itself, patiently, and disarms.
struct ContainerGuard {
    docker: Docker,
    id: String,
    armed: bool,
}
impl Drop for ContainerGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (docker, id) = (self.docker.clone(), self.id.clone());
        tracing::error!("removing container {id} (the call ended abnormally)");
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                if let Err(e) = engine::remove_patiently(&docker, &id, REMOVE_PATIENCE).await {
                    tracing::error!("could not remove container {id}: {}", engine::short_reason(&e));
                }
            });
        }
    }
}

fn test_pause() -> Option<Duration> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(TEST_PAUSE_FILE).ok()?;
    if m.uid() != 0 || m.mode() & 0o022 != 0 || !m.is_file() {
        return None;
    }
    let secs: f64 = std::fs::read_to_string(TEST_PAUSE_FILE).ok()?.trim().parse().ok()?;
    (secs > 0.0 && secs < 120.0).then(|| Duration::from_secs_f64(secs))
}

/// Checks a descriptor: its type and owner (and for the directory, not
/// writable by group or others).
fn check_fd(fd: &OwnedFd, what: &str, uid: u32, dir: bool) -> Result<(), String> {
    let st = fstat(fd.as_fd()).map_err(|e| format!("{what}: {e}"))?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let want = if dir { SFlag::S_IFDIR } else { SFlag::S_IFREG };
    if kind != want {
        return Err(format!("{what} is not a {}", if dir { "directory" } else { "regular file" }));
    }
    if st.st_uid != uid {
        return Err(format!("{what} is owned by uid {}, expected uid {uid}", st.st_uid));
    }
    if dir && st.st_mode & 0o022 != 0 {
        return Err(format!("{what} is writable by group or others"));
    }
    Ok(())
}

/// Runs one call; returns the answer that ends it.
async fn run(
    shared: &Shared,
    caller: &Caller,
    req: RunRequest,
    fds: Vec<OwnedFd>,
    stream: &UnixStream,
    rx: &mut mpsc::Receiver<Incoming>,
) -> Answer {
    let mut fds = fds.into_iter();
    let (Some(dir), Some(out), Some(err)) = (fds.next(), fds.next(), fds.next()) else {
        return Answer::Refused("a run request needs the job directory and its output files".into());
    };
    let uid = caller.uid;
    for (fd, what, is_dir) in [
        (&dir, "the job directory", true),
        (&out, "stdout", false),
        (&err, "stderr", false),
    ] {
        if let Err(e) = check_fd(fd, what, uid, is_dir) {
            return Answer::Refused(e);
        }
    }
    let policy = match load_policy() {
        Ok(p) => p,
        Err(e) => return Answer::Failed(format!("{e}; ask the cluster's administrators")),
    };
    let limits = match policy.limits() {
        Ok(l) => l,
        Err(e) => return Answer::Failed(format!("the site policy is invalid: {e}")),
    };
    // The path the runner names must be where the inode is now (the
    // kernel's own name for the descriptor); the policy's job roots are
    // checked on it.
    let job_dir = PathBuf::from(&req.job_dir);
    if check_clean_absolute(&job_dir).is_err() {
        return Answer::Refused(format!("{} is not a clean absolute path", req.job_dir));
    }
    match std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
        Ok(p) if p == job_dir => {}
        _ => return Answer::Failed(REPLACED.into()),
    }
    let spec = req.spec;
    if let Err(e) = spec.validate() {
        return Answer::Refused(e.to_string());
    }
    let name_ok = job_dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| JobId::parse(n).ok())
        .is_some_and(|id| id == spec.job_id);
    if !name_ok {
        return Answer::Refused(format!(
            "the spec is for job {}, but the directory is {}",
            spec.job_id, req.job_dir
        ));
    }
    if let Err(e) = policy.check(&spec, uid, &job_dir) {
        return Answer::Refused(e.to_string());
    }
    let gid = if req.gid == caller.gid || caller.groups.contains(&req.gid) {
        req.gid
    } else {
        caller.gid
    };
    let slurm_job = caller.job.clone();
    {
        let Ok(mut r) = shared.running.lock() else {
            return Answer::Failed("internal error in sandbox-agent: poisoned lock".into());
        };
        if !r.insert(slurm_job.clone()) {
            return Answer::Refused(format!("Slurm job {slurm_job} already has a sandbox running"));
        }
    }
    let _slot = Slot { shared, job: slurm_job.clone() };
    if let Some(p) = test_pause() {
        tracing::warn!("job {slurm_job}: checks done, pausing {p:?} (test hook {TEST_PAUSE_FILE})");
        tokio::time::sleep(p).await;
    }
    if !caller.alive() {
        return Answer::Refused("the batch task has ended".into());
    }
    // Pin the checked inode at a root-owned path: the engine is given
    // only this path, which the user cannot rename.
    let staged = match Staged::new(&policy, &slurm_job, &dir) {
        Ok(s) => s,
        Err(e) => return Answer::Failed(format!("the delegate agent cannot stage the job directory: {e}")),
    };
    let ctx = Ctx {
        policy: &policy,
        host: hostname(),
        uid,
        gid,
        slurm_job: &slurm_job,
        spec: &spec,
        tmp_bytes: limits.tmp_bytes,
        max_output: limits.max_output_bytes,
        max_job_bytes: limits.max_job_bytes,
        caller,
        node: shared.node.clone(),
    };
    let answer = AssertUnwindSafe(engine_phase(&ctx, &staged, &dir, out, err, stream, rx))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Answer::Failed(format!("internal error in sandbox-agent: {msg}"))
        });
    drop(staged);
    answer
}

struct Ctx<'a> {
    policy: &'a Policy,
    host: String,
    uid: u32,
    gid: u32,
    slurm_job: &'a str,
    spec: &'a delegate_protocol::Spec,
    tmp_bytes: u64,
    max_output: u64,
    max_job_bytes: u64,
    caller: &'a Caller,
    node: String,
}

fn file(fd: OwnedFd) -> tokio::fs::File {
    tokio::fs::File::from_std(std::fs::File::from(fd))
}

async fn engine_phase(
    ctx: &Ctx<'_>,
    staged: &Staged,
    dir: &OwnedFd,
    out: OwnedFd,
    err: OwnedFd,
    stream: &UnixStream,
    rx: &mut mpsc::Receiver<Incoming>,
) -> Answer {
    let spec = ctx.spec;
    let socket = &ctx.policy.docker_socket;
    if let Err(e) = check_clean_absolute(socket) {
        return Answer::Failed(format!("the site policy's docker_socket is invalid: {e}"));
    }
    let docker = match engine::connect(socket).await {
        Ok(d) => d,
        Err(e) => return Answer::Failed(e.to_string()),
    };
    let job = spec.job_id.as_str();
    if let Err(e) = engine::sweep(&docker, job, ctx.slurm_job, ctx.uid).await {
        tracing::warn!("could not sweep leftover containers: {}", engine::short_reason(&e));
    }
    let source = staged.engine_path();
    let params = |perf| Params {
        spec,
        job_dir: &source,
        uid: ctx.uid,
        gid: ctx.gid,
        slurm_job: ctx.slurm_job,
        tmp_bytes: ctx.tmp_bytes,
        max_pids: ctx.policy.max_pids,
        perf,
        max_open_files: ctx.policy.max_open_files,
        max_file_bytes: ctx.max_job_bytes,
        node: &ctx.node,
    };
    let mut perf = match ctx.policy.perf_mode {
        PerfMode::Auto if !engine::may_accept_perfmon(&docker) => Perf::Seccomp,
        PerfMode::Auto | PerfMode::Perfmon => Perf::Perfmon,
        PerfMode::Seccomp => Perf::Seccomp,
        PerfMode::Off => Perf::Off,
    };
    let name = format!("delegate-{job}");
    let classify = |e: &bollard::errors::Error, action| engine::classify(e, action, socket, &ctx.host, &spec.image);
    let mut created = engine::create(&docker, Some(&name), config::container_config(&params(perf))).await;
    if let Err(e) = &created {
        if perf == Perf::Perfmon && engine::is_unknown_capability(e) {
            if ctx.policy.perf_mode == PerfMode::Perfmon {
                return Answer::Failed(EngineError::PerfmonRejected { host: ctx.host.clone() }.to_string());
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
        Err(e) => return Answer::Failed(classify(&e, "create the sandbox").to_string()),
    };
    let mut guard = ContainerGuard {
        docker: docker.clone(),
        id: id.clone(),
        armed: true,
    };
    tracing::info!(
        "job {job} (Slurm job {}, uid {}): created container {id} (perf mode {})",
        ctx.slurm_job,
        ctx.uid,
        perf.as_str()
    );
    let created_ok = conn::send(
        stream,
        &Answer::Created {
            container_id: id.clone(),
            perf_mode: perf.as_str().into(),
        },
    )
    .await
    .is_ok();
    let mut ended = if created_ok {
        supervise(ctx, &docker, &id, perf, dir, out, err, stream, rx).await
    } else {
        Ended {
            how: EndedHow::Failed("the runner went away".into()),
            exit_code: None,
            oom_killed: false,
            engine_gone: None,
            output_note: None,
            removal_error: None,
            started_ms: None,
        }
    };
    match engine::remove_patiently(&docker, &id, REMOVE_PATIENCE).await {
        Ok(()) => tracing::info!("removed container {id}"),
        Err(e) => {
            let r = engine::short_reason(&e);
            tracing::error!("could not remove container {id}: {r}");
            ended.removal_error = Some(format!("the sandbox container {id} could not be removed: {r}"));
        }
    }
    guard.armed = false;
    Answer::Ended(ended)
}

/// Sums the bytes the directory holds (allocated blocks), through the
/// descriptor (never a path), bounded in depth and entries.
fn usage(dir: &OwnedFd) -> std::io::Result<u64> {
    fn walk(fd: std::os::fd::BorrowedFd<'_>, depth: u32, budget: &mut u32) -> std::io::Result<u64> {
        use nix::fcntl::{openat, AtFlags, OFlag};
        use nix::sys::stat::{fstatat, Mode};
        let own = nix::unistd::dup(fd)?;
        let mut d = nix::dir::Dir::from_fd(own)?;
        let mut total = 0u64;
        let mut subdirs = Vec::new();
        for e in d.iter() {
            let e = e?;
            let name = e.file_name().to_owned();
            if name.as_bytes() == b"." || name.as_bytes() == b".." {
                continue;
            }
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            let Ok(st) = fstatat(fd, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            total += (st.st_blocks as u64).saturating_mul(512);
            if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR && depth < 64 {
                subdirs.push(name);
            }
        }
        for name in subdirs {
            if let Ok(sub) = openat(
                fd,
                name.as_c_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                total += walk(sub.as_fd(), depth + 1, budget)?;
            }
        }
        Ok(total)
    }
    let mut budget = 200_000;
    walk(dir.as_fd(), 0, &mut budget)
}

/// Why supervision ended.
enum End {
    Exited,
    TimedOut,
    Killed,
    WaitFailed(String),
    Stopped(String),
}

/// Attaches, starts, waits (time limit, the runner's kill, the batch
/// task's end, the disk limits), kills if needed, drains the output and
/// inspects the container. The caller removes it.
#[allow(clippy::too_many_arguments)]
async fn supervise(
    ctx: &Ctx<'_>,
    docker: &Docker,
    id: &str,
    perf: Perf,
    dir: &OwnedFd,
    out: OwnedFd,
    err: OwnedFd,
    stream: &UnixStream,
    rx: &mut mpsc::Receiver<Incoming>,
) -> Ended {
    let spec = ctx.spec;
    let socket = &ctx.policy.docker_socket;
    let classify =
        |e: &bollard::errors::Error, action| engine::classify(e, action, socket, &ctx.host, &spec.image).to_string();
    let mut ended = Ended {
        how: EndedHow::Exited,
        exit_code: None,
        oom_killed: false,
        engine_gone: None,
        output_note: None,
        removal_error: None,
        started_ms: None,
    };
    let fail = |mut e: Ended, why: String| {
        e.how = EndedHow::Failed(why);
        e
    };
    // A kill asked before the start: do not start.
    if let Ok(Incoming { request: Request::Kill, .. }) = rx.try_recv() {
        ended.how = EndedHow::Killed;
        return ended;
    }
    let attach = AttachContainerOptions {
        stream: true,
        stdout: true,
        stderr: true,
        stdin: false,
        logs: false,
        detach_keys: None,
    };
    let attached = match docker.attach_container(id, Some(attach)).await {
        Ok(a) => a,
        Err(e) => return fail(ended, classify(&e, "attach to the sandbox")),
    };
    let (over_tx, mut over_rx) = watch::channel(false);
    let mut pump_task = tokio::spawn(pump(attached.output, file(out), file(err), ctx.max_output, over_tx));
    drop(attached.input);
    if let Err(e) = docker
        .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
        .await
    {
        pump_task.abort();
        return fail(ended, classify(&e, "start the sandbox"));
    }
    let started_ms = now_ms();
    ended.started_ms = Some(started_ms);
    tracing::info!("started container {id}");
    let told = conn::send(
        stream,
        &Answer::Started {
            container_id: id.to_string(),
            perf_mode: perf.as_str().into(),
            started_ms,
        },
    )
    .await;

    let limit = Duration::from_secs(spec.resources.time_limit_secs);
    let mut wait = docker.wait_container(id, None::<WaitContainerOptions>);
    // SAFETY: `register` needs the descriptor to stay open and owned by the
    // AsyncFd while registered: it is a fresh duplicate moved into it.
    let pidfd = ctx
        .caller
        .pidfd
        .try_clone()
        .and_then(|fd| unsafe { AsyncFd::register(fd) }.map_err(|e| e.into()));
    let mut disk_poll = tokio::time::interval(DISK_POLL);
    disk_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let output_stop = ctx.policy.output_limit == OutputLimit::Stop && ctx.max_output > 0;
    let end = if told.is_err() {
        End::Killed
    } else {
        tokio::select! {
            w = wait.next() => match w {
                Some(Ok(_)) | Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => End::Exited,
                Some(Err(e)) => End::WaitFailed(classify(&e, "wait for the sandbox")),
                None => End::WaitFailed("the Docker engine ended the wait without a result".into()),
            },
            _ = tokio::time::sleep(limit) => End::TimedOut,
            // The runner asked, or went away (killed, its allocation ended).
            () = async {
                loop {
                    match rx.recv().await {
                        Some(Incoming { request: Request::Kill, .. }) | None => return,
                        Some(_) => {}
                    }
                }
            } => End::Killed,
            // The batch task ended (the pidfd becomes readable).
            () = async {
                match &pidfd {
                    Ok(fd) => {
                        let _ = fd.readable().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            } => End::Killed,
            why = async {
                loop {
                    disk_poll.tick().await;
                    if ctx.max_job_bytes == 0 {
                        continue;
                    }
                    let d = dir.try_clone();
                    let used = match d {
                        Ok(d) => tokio::task::spawn_blocking(move || usage(&d)).await.ok().and_then(Result::ok),
                        Err(_) => None,
                    };
                    if let Some(u) = used {
                        if u > ctx.max_job_bytes {
                            return format!(
                                "stopped: the job directory holds {}, more than the site limit of {} (max_job_bytes)",
                                format_size(u),
                                format_size(ctx.max_job_bytes)
                            );
                        }
                    }
                }
            } => End::Stopped(why),
            () = async {
                if !output_stop {
                    std::future::pending::<()>().await;
                }
                while !*over_rx.borrow_and_update() {
                    if over_rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            } => End::Stopped(format!(
                "stopped: its output passed the site limit of {} (max_output)",
                format_size(ctx.max_output)
            )),
        }
    };
    let killing = !matches!(end, End::Exited);
    if killing {
        tracing::warn!("killing container {id}");
        if let Err(e) = engine::kill(docker, id).await {
            tracing::error!("could not kill container {id}: {}", engine::short_reason(&e));
        }
        let _ = tokio::time::timeout(KILL_PATH_CALL, wait.next()).await;
    }
    drop(wait);
    let drain = if killing { DRAIN_AFTER_KILL } else { DRAIN_AFTER_EXIT };
    let pumped = match tokio::time::timeout(drain, &mut pump_task).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => Pumped {
            error: Some(format!("the output copier failed: {e}")),
            dropped: 0,
        },
        Err(_) => {
            pump_task.abort();
            Pumped {
                error: Some("the output did not finish draining in time and may be incomplete".into()),
                dropped: 0,
            }
        }
    };
    let inspect_timeout = if killing {
        KILL_PATH_CALL
    } else {
        Duration::from_secs(30)
    };
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
                ended.engine_gone = Some(classify(&e, "inspect the sandbox"));
            }
            None
        }
        Err(_) => {
            tracing::error!("inspecting container {id} timed out");
            None
        }
    };
    ended.exit_code = state.as_ref().and_then(|s| s.exit_code).map(|c| c as i32);
    ended.oom_killed = state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
    ended.how = match end {
        End::Exited => EndedHow::Exited,
        End::TimedOut => EndedHow::TimedOut,
        End::Killed => EndedHow::Killed,
        End::WaitFailed(r) => EndedHow::WaitFailed(r),
        End::Stopped(r) => EndedHow::Stopped(r),
    };
    let mut notes = Vec::new();
    if pumped.dropped > 0 {
        notes.push(format!(
            "the output was truncated at the site limit of {} (max_output): {} bytes were dropped",
            format_size(ctx.max_output),
            pumped.dropped
        ));
    }
    if let Some(e) = pumped.error {
        notes.push(format!("the output may be incomplete: {e}"));
    }
    if !notes.is_empty() {
        ended.output_note = Some(notes.join("; "));
    }
    tracing::info!("container {id} ended: {:?} exit {:?}", ended.how, ended.exit_code);
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_nested_files() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("a")).unwrap();
        std::fs::write(t.path().join("a/f"), vec![1u8; 1 << 20]).unwrap();
        std::fs::write(t.path().join("g"), vec![1u8; 1 << 20]).unwrap();
        let fd: OwnedFd = std::fs::File::open(t.path()).unwrap().into();
        let u = usage(&fd).unwrap();
        assert!(u >= 2 << 20, "{u}");
    }
}

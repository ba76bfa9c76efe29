//! Serving one runner: identify it, then run its calls one at a time, each
//! in one fresh container bound to the verified job, the checked directory
//! inode and the life of the batch task.

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use delegate_protocol::agent::{Answer, Ended, EndedHow, Request, RunRequest};
use delegate_protocol::policy::{Policy, DEFAULT_POLICY_PATH, POLICY_ENV};
use delegate_protocol::{check_clean_absolute, Fingerprint, JobId};
use futures_util::FutureExt;
use nix::sys::stat::{fstat, SFlag};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::caller::conn::{self, Incoming};
use crate::caller::ident::{self, Caller};
use crate::gpu::devices::{self as gpu, GpuError};
use crate::measure::fingerprint;
use crate::sandbox::call::Ctx;
use crate::sandbox::config::{self, Params, Perf};
use crate::sandbox::engine::{self, EngineError};
use crate::sandbox::rank;
use crate::sandbox::stage::Staged;
use crate::sandbox::supervise;

/// How long the removal waits for an engine that does not answer (restarting).
pub(crate) const REMOVE_PATIENCE: Duration = Duration::from_secs(30);
/// The test-only pause between the checks and the container's creation:
/// honoured only when this file is root-owned and not writable by others
/// (written by the test fixture as root, never reachable by a job).
pub const TEST_PAUSE_FILE: &str = "/etc/delegate/agent-test-pause";

/// State shared by every connection.
pub struct Shared {
    /// Slurm jobs with a sandbox (being set up or running) right now.
    pub running: Mutex<HashSet<String>>,
    pub stepds: Vec<PathBuf>,
    pub node: String,
    /// Told when a call ended: the node's class and report are published
    /// again (crate::node::report).
    pub republish: Arc<tokio::sync::Notify>,
    /// The per-user log lines' limiter (crate::caller::quiet).
    pub quiet: crate::caller::quiet::PerUser,
    /// The probe's last answer (crate::node::probe::Cached).
    pub probe: crate::node::probe::Cached,
    /// Whether others wait, asked of Slurm at most once a second
    /// (crate::scheduling::queue::Cached).
    pub queue: crate::scheduling::queue::Cached,
    /// Maps' allocations told to step aside, watched until the node they
    /// gave up is taken (crate::scheduling::aside).
    pub aside: crate::scheduling::aside::Watched,
    /// When each job last showed progress (crate::scheduling::aside::keep_maps_moving).
    pub progress: crate::scheduling::aside::Progress,
}

/// The policy: the root-owned default file, or `$DELEGATE_POLICY` of the
/// agent's own (root) environment.
pub fn load_policy() -> Result<Policy, delegate_protocol::policy::PolicyError> {
    Policy::load(&policy_path(), true)
}

/// The policy's path: `$DELEGATE_POLICY` of the agent's own environment,
/// else the default.
pub fn policy_path() -> PathBuf {
    std::env::var_os(POLICY_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_POLICY_PATH))
}

/// Serves one connection until the runner closes it; when serving ends,
/// so does the connection (crate::caller::conn::Reader).
pub async fn serve(stream: conn::Socket, shared: Arc<Shared>) {
    let cred = match stream.peer_cred() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("no peer credentials: {e}");
            return;
        }
    };
    let (pid, uid) = (cred.pid().unwrap_or(0), cred.uid());
    let stream = Arc::new(stream);
    let (mut rx, _reader) = conn::spawn_reader(stream.clone());
    let mut caller: Option<Caller> = None;
    let mut engine: Option<EngineConn> = None;
    // A connection idle for crate::caller::admit::IDLE between requests is closed.
    while let Ok(Some(Incoming { request, fds })) = tokio::time::timeout(crate::caller::admit::IDLE, rx.recv()).await {
        let answer = match request {
            Request::Probe => Answer::Probe(
                shared
                    .probe
                    .get(crate::node::probe::cache_key(&policy_path()), probe_report)
                    .await,
            ),
            Request::Kill => continue,
            Request::RunRank(rr) => {
                // One rank per connection.
                if caller.is_none() {
                    serve_rank(&shared, pid, uid, rr, fds, &stream, &mut rx).await;
                }
                return;
            }
            Request::Run(req) => {
                let Some(c) = batch_task(&shared, &mut caller, pid, uid, &stream).await else {
                    return;
                };
                run(&shared, c, &mut engine, req, fds, &stream, &mut rx, None).await
            }
            Request::Queue(q) => {
                let Some(c) = batch_task(&shared, &mut caller, pid, uid, &stream).await else {
                    return;
                };
                shared.progress.touch(&c.job);
                let others_wait = shared.queue.others_wait(q.partition.as_deref(), uid).await;
                if others_wait {
                    crate::scheduling::aside::watch(shared.clone(), c.job.clone(), q.partition, uid);
                }
                Answer::Queue { others_wait }
            }
        };
        if let Err(e) = conn::send(&stream, &answer).await {
            tracing::debug!("pid {pid}: cannot answer ({e}); closing");
            return;
        }
    }
}

/// The connection's caller, identified once as the batch task of a running
/// Slurm job on this node; `None` (after telling it why) when it is not,
/// or no longer.
async fn batch_task<'a>(
    shared: &Shared,
    caller: &'a mut Option<Caller>,
    pid: i32,
    uid: u32,
    stream: &UnixStream,
) -> Option<&'a Caller> {
    if caller.is_none() {
        match ident::identify(pid, uid, &shared.stepds, &shared.node).await {
            Ok(c) => {
                tracing::info!("pid {pid} uid {uid}: batch task of Slurm job {}", c.job);
                *caller = Some(c);
            }
            Err(why) => {
                shared
                    .quiet
                    .warn(uid, "refused", &format!("refused pid {pid} uid {uid}: {why}"));
                let _ = conn::send(stream, &Answer::Refused(why)).await;
                return None;
            }
        }
    }
    let c = caller.as_ref()?;
    if !c.alive() {
        let _ = conn::send(stream, &Answer::Refused("the batch task has ended".into())).await;
        return None;
    }
    Some(c)
}

/// Why an allocation may not start a call: it is older than the site's
/// max_allocation_time, `bound` seconds (security round 4, item 2: a
/// shared allocation whose limit was raised held its node for hours while
/// another student waited). Every call is checked, not only a
/// connection's later ones (a runner connects again after a refusal); a
/// job's first call starts as its batch task does. None: it may.
fn past_allocation_bound(caller: &Caller, bound: u64) -> Option<String> {
    let age = caller.age()?;
    (bound > 0 && age.as_secs() >= bound).then(|| {
        format!(
            "this allocation has run {} s, longer than the site's max_allocation_time ({bound} s): it starts no more calls",
            age.as_secs()
        )
    })
}

/// The probe's report (`delegate doctor` through the runner).
async fn probe_report() -> delegate_protocol::agent::ProbeReport {
    match load_policy() {
        Ok(p) => crate::node::probe::probe(&p).await,
        Err(e) => delegate_protocol::agent::ProbeReport {
            error: e.to_string(),
            perf_mode: "unknown".into(),
            perf_detail: "the site policy could not be read".into(),
            ..Default::default()
        },
    }
}

/// Serves a rank's one request: the caller identified as a step's task,
/// its place (rank, world) from slurmctld (crate::sandbox::rank) and checked
/// against the request, then the call; the answer ends the connection.
async fn serve_rank(
    shared: &Shared,
    pid: i32,
    uid: u32,
    rr: delegate_protocol::agent::RankRequest,
    fds: Vec<OwnedFd>,
    stream: &UnixStream,
    rx: &mut mpsc::Receiver<Incoming>,
) {
    let (c, place) = match ident::identify_as(pid, uid, &shared.stepds, &shared.node, ident::StepKind::Rank).await {
        Ok((c, Some(place))) => (c, place),
        Ok((_, None)) => return,
        Err(why) => {
            shared
                .quiet
                .warn(uid, "refused", &format!("refused rank pid {pid} uid {uid}: {why}"));
            let _ = conn::send(stream, &Answer::Refused(why)).await;
            return;
        }
    };
    tracing::info!(
        "pid {pid} uid {uid}: rank {} of {} of Slurm job {}",
        place.rank,
        place.world,
        c.job
    );
    let answer = if rr.rank != place.rank || rr.run.spec.resources.nodes != place.world {
        Answer::Refused(format!(
            "this node is rank {} of {} of Slurm job {}, the request says rank {} of {}",
            place.rank, place.world, c.job, rr.rank, rr.run.spec.resources.nodes
        ))
    } else {
        let mut engine = None;
        run(shared, &c, &mut engine, rr.run, fds, stream, rx, Some(place)).await
    };
    let _ = conn::send(stream, &answer).await;
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
        self.shared.progress.touch(&self.job);
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

/// The engine as one connection (one allocation) uses it: connected and
/// its API version negotiated once, this Slurm job's leftovers swept once
/// (a requeued job keeps its id), not once per call.
pub(crate) struct EngineConn {
    docker: Docker,
    socket: PathBuf,
}

impl EngineConn {
    /// The cached connection when it is for `socket`, else a new one (and
    /// the sweep of the leftovers of `uid` in Slurm job `sweep`, if given).
    async fn get(
        slot: &mut Option<EngineConn>,
        socket: &std::path::Path,
        sweep: Option<&str>,
        uid: u32,
    ) -> Result<Docker, EngineError> {
        if let Some(e) = slot.as_ref().filter(|e| e.socket == socket) {
            return Ok(e.docker.clone());
        }
        let docker = engine::connect(socket).await?;
        if let Some(slurm_job) = sweep {
            if let Err(e) = engine::sweep(&docker, engine::Leftovers::SlurmJob(slurm_job), uid).await {
                tracing::warn!("could not sweep leftover containers: {}", engine::short_reason(&e));
            }
        }
        *slot = Some(EngineConn {
            docker: docker.clone(),
            socket: socket.to_path_buf(),
        });
        Ok(docker)
    }
}

/// The run request checked: the descriptors' types and owners, the site
/// policy readable and valid, the job directory's path the inode's own
/// name now, the spec valid, for this directory and within the policy.
// The error is the answer sent as it is, once per call: no need to box it.
#[allow(clippy::result_large_err)]
fn checked_request(
    req: &RunRequest,
    uid: u32,
    [dir, out, err]: [&OwnedFd; 3],
) -> Result<(Policy, delegate_protocol::policy::Limits), Answer> {
    for (fd, what, is_dir) in [
        (dir, "the job directory", true),
        (out, "stdout", false),
        (err, "stderr", false),
    ] {
        check_fd(fd, what, uid, is_dir).map_err(Answer::Refused)?;
    }
    let policy = load_policy().map_err(|e| Answer::Failed(format!("{e}; ask the cluster's administrators")))?;
    let limits = policy
        .limits()
        .map_err(|e| Answer::Failed(format!("the site policy is invalid: {e}")))?;
    // The path the runner names must be where the inode is now (the
    // kernel's own name for the descriptor); the policy's job roots are
    // checked on it.
    let job_dir = PathBuf::from(&req.job_dir);
    if check_clean_absolute(&job_dir).is_err() {
        return Err(Answer::Refused(format!("{} is not a clean absolute path", req.job_dir)));
    }
    match std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
        Ok(p) if p == job_dir => {}
        _ => return Err(Answer::Failed(delegate_protocol::host::REPLACED.into())),
    }
    let spec = &req.spec;
    spec.validate().map_err(|e| Answer::Refused(e.to_string()))?;
    let name_ok = job_dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| JobId::parse(n).ok())
        .is_some_and(|id| id == spec.job_id);
    if !name_ok {
        return Err(Answer::Refused(format!(
            "the spec is for job {}, but the directory is {}",
            spec.job_id, req.job_dir
        )));
    }
    policy.check(spec, uid, &job_dir).map_err(|e| Answer::Refused(e.to_string()))?;
    Ok((policy, limits))
}

/// Runs one call; returns the answer that ends it.
#[allow(clippy::too_many_arguments)]
async fn run(
    shared: &Shared,
    caller: &Caller,
    engine: &mut Option<EngineConn>,
    req: RunRequest,
    fds: Vec<OwnedFd>,
    stream: &UnixStream,
    rx: &mut mpsc::Receiver<Incoming>,
    place: Option<ident::RankPlace>,
) -> Answer {
    let mut fds = fds.into_iter();
    let (Some(dir), Some(out), Some(err)) = (fds.next(), fds.next(), fds.next()) else {
        return Answer::Refused("a run request needs the job directory and its output files".into());
    };
    let uid = caller.uid;
    let (policy, limits) = match checked_request(&req, uid, [&dir, &out, &err]) {
        Ok(p) => p,
        Err(answer) => return answer,
    };
    // (A rank is its job's one call, started with its step.)
    let bound = place.is_none().then_some(limits.max_allocation_secs);
    if let Some(why) = bound.and_then(|b| past_allocation_bound(caller, b)) {
        tracing::warn!("Slurm job {}: {why}", caller.job);
        return Answer::Refused(why);
    }
    let spec = req.spec;
    let gid = if req.gid == caller.gid || caller.groups.contains(&req.gid) {
        req.gid
    } else {
        caller.gid
    };
    let slurm_job = caller.job.clone();
    let alone;
    {
        let Ok(mut r) = shared.running.lock() else {
            return Answer::Failed("internal error in sandbox-agent: poisoned lock".into());
        };
        if !r.insert(slurm_job.clone()) {
            return Answer::Refused(format!("Slurm job {slurm_job} already has a sandbox running"));
        }
        alone = r.len() == 1;
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
        host: delegate_protocol::host::hostname(),
        uid,
        gid,
        slurm_job: &slurm_job,
        spec: &spec,
        tmp_bytes: limits.tmp_bytes,
        max_output: limits.max_output_bytes,
        max_job_bytes: limits.max_job_bytes,
        max_job_files: policy.max_job_files,
        caller,
        node: shared.node.clone(),
        alone,
        place,
    };
    let answer = AssertUnwindSafe(engine_phase(&ctx, engine, &staged, &dir, out, err, stream, rx))
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
    shared.republish.notify_one();
    answer
}

/// The GPUs slurmctld allocated to this job on this node: exactly what the
/// spec asks for (checked against max_gpus with the rest of it), or the
/// answer that refuses or fails the call.
async fn sandbox_gpus(ctx: &Ctx<'_>, docker: &Docker) -> Result<gpu::Passthrough, Answer> {
    let spec = ctx.spec;
    let gpus = match gpu::for_job(ctx.policy, docker, ctx.slurm_job, &ctx.node, spec.resources.gpus).await {
        Ok(g) => g,
        Err(e @ (GpuError::Mismatch { .. } | GpuError::NoGpus { .. } | GpuError::Short { .. })) => {
            return Err(Answer::Refused(e.to_string()))
        }
        Err(e) => return Err(Answer::Failed(format!("{e}; ask the cluster's administrators"))),
    };
    if !gpus.devices.is_empty() {
        tracing::info!(
            "job {} (Slurm job {}): GPUs {:?} ({})",
            spec.job_id,
            ctx.slurm_job,
            gpus.devices,
            gpus.mode.as_str()
        );
    }
    Ok(gpus)
}

/// Creates the call's container. A name already taken is a container of
/// an earlier attempt of this job: swept, then created again (not for a
/// rank, `sweep_ok` false: its engine may hold the other ranks' sandboxes;
/// the epilog sweeps those).
async fn create_sandbox(
    ctx: &Ctx<'_>,
    docker: &Docker,
    name: &str,
    body: bollard::models::ContainerCreateBody,
    sweep_ok: bool,
) -> Result<String, bollard::errors::Error> {
    let created = engine::create(docker, Some(name), body.clone()).await;
    if !(sweep_ok && created.as_ref().is_err_and(engine::is_name_conflict)) {
        return created;
    }
    if let Err(e) = engine::sweep(docker, engine::Leftovers::Job(ctx.spec.job_id.as_str()), ctx.uid).await {
        tracing::warn!("could not sweep leftover containers: {}", engine::short_reason(&e));
    }
    engine::create(docker, Some(name), body).await
}

/// The engine (connected afresh when the last call lost it) and, for a
/// rank, the job's private network; or the answer that fails the call.
async fn connect(
    ctx: &Ctx<'_>,
    engine_conn: &mut Option<EngineConn>,
) -> Result<(Docker, Option<(String, ident::RankPlace)>), Answer> {
    let socket = &ctx.policy.docker_socket;
    if let Err(e) = check_clean_absolute(socket) {
        return Err(Answer::Failed(format!("the site policy's docker_socket is invalid: {e}")));
    }
    // A rank's engine may hold the other ranks' sandboxes (one engine for
    // several workers): no sweep by Slurm job there (the epilog sweeps).
    let sweep = ctx.place.is_none().then_some(ctx.slurm_job);
    let docker = EngineConn::get(engine_conn, socket, sweep, ctx.uid)
        .await
        .map_err(|e| Answer::Failed(e.to_string()))?;
    let network = match ctx.place {
        Some(place) => Some((
            rank::ensure_network(&docker, ctx.caller, place).await.map_err(Answer::Failed)?,
            place,
        )),
        None => None,
    };
    Ok((docker, network))
}

/// The call's container: the policy's limits, the job directory, the
/// student's ids, the GPUs, the cores (`cpuset`), the perf mode, the
/// rank's network.
fn sandbox_body(
    ctx: &Ctx<'_>,
    source: &std::path::Path,
    gpus: &gpu::Passthrough,
    cpuset: Option<&str>,
    network: Option<&(String, ident::RankPlace)>,
    perf: Perf,
) -> bollard::models::ContainerCreateBody {
    let params = Params {
        spec: ctx.spec,
        job_dir: source,
        uid: ctx.uid,
        gid: ctx.gid,
        slurm_job: ctx.slurm_job,
        tmp_bytes: ctx.tmp_bytes,
        max_pids: ctx.policy.max_pids,
        perf,
        max_open_files: ctx.policy.max_open_files,
        max_file_bytes: ctx.max_job_bytes,
        node: &ctx.node,
        gpus,
        cpuset,
    };
    let mut body = config::container_config(&params);
    if let Some((net, place)) = network {
        rank::apply(&mut body, net, *place);
    }
    body
}

/// The answer to a failed create, in the user's words; a lost engine is
/// connected afresh next time and a rank's network released.
async fn create_failed(
    ctx: &Ctx<'_>,
    engine_conn: &mut Option<EngineConn>,
    docker: &Docker,
    network: Option<&(String, ident::RankPlace)>,
    perf: Perf,
    e: bollard::errors::Error,
) -> Answer {
    if engine::unreachable(&e) {
        *engine_conn = None;
    }
    if let Some((net, _)) = network {
        rank::release_network(docker, net).await;
    }
    if perf == Perf::Perfmon && engine::is_unknown_capability(&e) {
        return Answer::Failed(EngineError::PerfmonRejected { host: ctx.host.clone() }.to_string());
    }
    let why = engine::classify(&e, "create the sandbox", &ctx.policy.docker_socket, &ctx.host, &ctx.spec.image);
    Answer::Failed(why.to_string())
}

#[allow(clippy::too_many_arguments)]
async fn engine_phase(
    ctx: &Ctx<'_>,
    engine_conn: &mut Option<EngineConn>,
    staged: &Staged,
    dir: &OwnedFd,
    out: OwnedFd,
    err: OwnedFd,
    stream: &UnixStream,
    rx: &mut mpsc::Receiver<Incoming>,
) -> Answer {
    let spec = ctx.spec;
    let (docker, network) = match connect(ctx, engine_conn).await {
        Ok(c) => c,
        Err(answer) => return answer,
    };
    let job = spec.job_id.as_str();
    let gpus = match sandbox_gpus(ctx, &docker).await {
        Ok(g) => g,
        Err(answer) => return answer,
    };
    // Cores of its own on an exclusive node (delegate_protocol::cpus).
    let placement = if ctx.policy.pin_cpus {
        delegate_protocol::cpus::place(&ctx.caller.cpus, spec.resources.cpus)
    } else {
        None
    };
    let cpuset = placement.as_ref().map(|p| delegate_protocol::cpus::cpuset_list(&p.sandbox));
    let (perf, perf_off) = config::perf_for(ctx.policy.perf_mode, config::perf_paranoid());
    if let Some(why) = &perf_off {
        tracing::warn!("job {job}: {why}");
    }
    let name = match &network {
        Some((_, place)) => rank::container_name(job, place.rank),
        None => format!("delegate-{job}"),
    };
    let body = sandbox_body(ctx, &staged.engine_path(), &gpus, cpuset.as_deref(), network.as_ref(), perf);
    let id = match create_sandbox(ctx, &docker, &name, body, network.is_none()).await {
        Ok(id) => id,
        Err(e) => return create_failed(ctx, engine_conn, &docker, network.as_ref(), perf, e).await,
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
    let created = Answer::Created {
        container_id: id.clone(),
        perf_mode: perf.as_str().into(),
    };
    let created_ok = conn::send(stream, &created).await.is_ok();
    // While the call runs, the agent keeps to the other cores.
    let off_cores = placement
        .as_ref()
        .filter(|_| ctx.alone && created_ok)
        .and_then(|p| crate::measure::pin::OffCores::new(&p.others));
    let mut ended = if created_ok {
        let cores = call_cores(ctx, placement.as_ref());
        let call = Call {
            docker: &docker,
            id: &id,
            gpus: &gpus,
            perf,
            dir,
            stream,
        };
        measured_call(ctx, &call, cores, out, err, rx).await
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
    drop(off_cores);
    if ended.engine_gone.is_some() {
        *engine_conn = None;
    }
    ended.removal_error = remove(&docker, &id).await;
    guard.armed = false;
    if let Some((net, _)) = &network {
        rank::release_network(&docker, net).await;
    }
    Answer::Ended(ended)
}

/// The created sandbox of a call and where its answers go.
struct Call<'a> {
    docker: &'a Docker,
    id: &'a str,
    gpus: &'a gpu::Passthrough,
    perf: Perf,
    dir: &'a OwnedFd,
    stream: &'a UnixStream,
}

/// Runs the call on `cores`, tuned for it (restored when `tuned` is
/// dropped, after the fingerprint has read the state the call ran in), and
/// sends its fingerprint before its end.
async fn measured_call(
    ctx: &Ctx<'_>,
    call: &Call<'_>,
    cores: Vec<u32>,
    out: OwnedFd,
    err: OwnedFd,
    rx: &mut mpsc::Receiver<Incoming>,
) -> Ended {
    let tuned = if ctx.policy.tune_cpus {
        crate::measure::tune::tune(std::path::Path::new("/"), &cores)
    } else {
        crate::measure::tune::untouched()
    };
    let before = fingerprint_before(ctx, cores).await;
    let gpus = crate::gpu::info::now(&call.gpus.devices, &call.gpus.ordinals).await;
    let (docker, perf) = (call.docker, call.perf);
    let ended = supervise::supervise(ctx, docker, call.id, perf, call.dir, out, err, call.stream, rx).await;
    let mut fp = fingerprint_after(ctx, docker, before, perf).await;
    fp.tuning = tuned.notes.clone();
    fp.gpus = gpus;
    drop(tuned);
    let _ = conn::send(call.stream, &Answer::Fingerprint(Box::new(fp))).await;
    ended
}

/// The cores the call runs on: its own (pinned), else the allocation's.
fn call_cores(ctx: &Ctx<'_>, placement: Option<&delegate_protocol::cpus::Placement>) -> Vec<u32> {
    let cores = placement.map_or(&ctx.caller.cpus, |p| &p.sandbox);
    cores.iter().filter_map(|&c| u32::try_from(c).ok()).collect()
}

/// The /proc that shows the node's tasks (the host's on a stack worker).
fn node_proc(ctx: &Ctx<'_>) -> PathBuf {
    match &ctx.policy.host_proc {
        p if p.as_os_str().is_empty() => PathBuf::from("/proc"),
        p => p.clone(),
    }
}

/// The machine's state just before the call starts (crate::measure::fingerprint).
async fn fingerprint_before(ctx: &Ctx<'_>, cores: Vec<u32>) -> fingerprint::Before {
    let proc = node_proc(ctx);
    let skip = [std::process::id() as i32].into_iter().collect();
    let caller = ctx.uid;
    tokio::task::spawn_blocking(move || fingerprint::before(std::path::Path::new("/"), &proc, &cores, &skip, caller))
        .await
        .unwrap_or_else(|_| fingerprint::Before::unknown(caller))
}

/// The fingerprint of the call that just ended.
async fn fingerprint_after(ctx: &Ctx<'_>, docker: &Docker, before: fingerprint::Before, perf: Perf) -> Fingerprint {
    let image_id = docker.inspect_image(&ctx.spec.image).await.ok().and_then(|i| i.id);
    let (proc, node) = (node_proc(ctx), ctx.node.clone());
    let skip = [std::process::id() as i32].into_iter().collect();
    let perf = perf.as_str();
    tokio::task::spawn_blocking(move || {
        let hw = fingerprint::hardware_counters();
        fingerprint::after(std::path::Path::new("/"), &proc, before, &skip, &node, perf, image_id, hw)
    })
    .await
    .unwrap_or_default()
}

/// Removes the ended sandbox (patiently); what to tell the student if it
/// could not be.
async fn remove(docker: &Docker, id: &str) -> Option<String> {
    match engine::remove_patiently(docker, id, REMOVE_PATIENCE).await {
        Ok(()) => {
            tracing::info!("removed container {id}");
            None
        }
        Err(e) => {
            let r = engine::short_reason(&e);
            tracing::error!("could not remove container {id}: {r}");
            Some(format!("the sandbox container {id} could not be removed: {r}"))
        }
    }
}

//! The call's container: the engine connected once per allocation, the
//! GPUs, the cores, the container created, supervised while measured, and
//! removed, also when the call ends abnormally.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use bollard::Docker;
use delegate_protocol::agent::{Answer, Ended, EndedHow};
use delegate_protocol::check_clean_absolute;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::caller::conn::{self, Incoming};
use crate::caller::ident;
use crate::gpu::devices::{self as gpu, GpuError};
use crate::sandbox::call::CheckedCall;
use crate::sandbox::config::{self, Params, Perf};
use crate::sandbox::engine::{self, EngineError};
use crate::sandbox::rank;
use crate::sandbox::stage::Staged;

use super::measured::{call_cores, measured_call, CreatedSandbox};

/// How long the removal waits for an engine that does not answer (restarting).
pub(crate) const REMOVE_PATIENCE: Duration = Duration::from_secs(30);
/// Removes the container when dropped while armed (a panic, a cancelled
/// task): the normal path removes it itself, patiently, and disarms.
pub(super) struct ContainerGuard {
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

/// The GPUs slurmctld allocated to this job on this node: exactly what the
/// spec asks for (checked against max_gpus with the rest of it), or the
/// answer that refuses or fails the call.
pub(super) async fn sandbox_gpus(ctx: &CheckedCall<'_>, docker: &Docker) -> Result<gpu::Passthrough, Answer> {
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
pub(super) async fn create_sandbox(
    ctx: &CheckedCall<'_>,
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
pub(super) async fn connect(
    ctx: &CheckedCall<'_>,
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
            rank::ensure_network(&docker, ctx.caller, place, &ctx.node)
                .await
                .map_err(|e| Answer::Failed(e.to_string()))?,
            place,
        )),
        None => None,
    };
    Ok((docker, network))
}

/// The call's container: the policy's limits, the job directory, the
/// student's ids, the GPUs, the cores (`cpuset`), the perf mode, the
/// rank's network.
pub(super) fn sandbox_body(
    ctx: &CheckedCall<'_>,
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
pub(super) async fn create_failed(
    ctx: &CheckedCall<'_>,
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
pub(super) async fn engine_phase(
    ctx: &CheckedCall<'_>,
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
        let call = CreatedSandbox {
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

/// Removes the ended sandbox (patiently); what to tell the student if it
/// could not be.
pub(super) async fn remove(docker: &Docker, id: &str) -> Option<String> {
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

//! The Docker engine, reached only through the socket named by the site
//! policy (never `DOCKER_HOST` or any other environment variable).

use std::collections::HashMap;
use std::path::Path;

use bollard::errors::Error as BollardError;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptions, KillContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use bollard::{Docker, API_DEFAULT_VERSION};

use crate::sandbox::config::{Perf, LABEL_JOB, LABEL_SLURM_JOB, LABEL_UID};

/// Seconds to wait for an answer (headers) to any one request.
const REQUEST_TIMEOUT_SECS: u64 = 60;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot reach the Docker engine at {socket}: {reason}")]
    Unreachable { socket: String, reason: String },
    #[error("the sandbox image {image} is not present on node {host}")]
    ImageMissing { image: String, host: String },
    #[error(
        "the Docker engine on node {host} rejects CAP_PERFMON (Docker before 24); \
         the site policy asks for perf_mode = \"perfmon\", use \"auto\" or \"seccomp\" there"
    )]
    PerfmonRejected { host: String },
    #[error("the Docker engine on node {host} failed to {action}: {reason}")]
    Docker {
        host: String,
        action: &'static str,
        reason: String,
    },
}

/// Connects to the engine at `socket` and negotiates the API version, so
/// that Debian's Docker 20.10 (API 1.41) works as well as newer engines.
pub async fn connect(socket: &Path) -> Result<Docker, EngineError> {
    let shown = socket.display().to_string();
    let unreachable = |e: BollardError| EngineError::Unreachable {
        socket: shown.clone(),
        reason: short_reason(&e),
    };
    let docker = Docker::connect_with_unix(&shown, REQUEST_TIMEOUT_SECS, API_DEFAULT_VERSION).map_err(unreachable)?;
    docker.negotiate_version().await.map_err(unreachable)
}

/// The engine's message without bollard's decoration.
pub fn short_reason(e: &BollardError) -> String {
    match e {
        BollardError::DockerResponseServerError { message, .. } => message.trim().to_string(),
        BollardError::SocketNotFoundError(p) => format!("{p} does not exist"),
        other => {
            // The innermost cause (e.g. "Connection refused (os error 111)")
            // says more than hyper's wrappers around it.
            let mut last: &dyn std::error::Error = other;
            while let Some(e) = last.source() {
                last = e;
            }
            last.to_string()
        }
    }
}

/// True when the error is the engine not answering at all.
fn is_transport(e: &BollardError) -> bool {
    !matches!(
        e,
        BollardError::DockerResponseServerError { .. } | BollardError::DockerContainerWaitError { .. }
    )
}

/// Classifies an engine error into a one-sentence reason.
pub fn classify(e: &BollardError, action: &'static str, socket: &Path, host: &str, image: &str) -> EngineError {
    match e {
        BollardError::DockerResponseServerError { status_code: 404, message }
            if message.contains("No such image") || message.contains("not found") && message.contains(image) =>
        {
            EngineError::ImageMissing {
                image: image.to_string(),
                host: host.to_string(),
            }
        }
        e if is_transport(e) => EngineError::Unreachable {
            socket: socket.display().to_string(),
            reason: short_reason(e),
        },
        e => EngineError::Docker {
            host: host.to_string(),
            action,
            reason: short_reason(e),
        },
    }
}

/// True when the engine rejected CAP_PERFMON by name (Docker before 24).
pub fn is_unknown_capability(e: &BollardError) -> bool {
    matches!(e, BollardError::DockerResponseServerError { message, .. }
        if message.contains("unknown capability") || message.contains("CAP_PERFMON"))
}

/// Creates the container with the given perf mode. `name` is optional.
pub async fn create(docker: &Docker, name: Option<&str>, body: ContainerCreateBody) -> Result<String, BollardError> {
    let opts = CreateContainerOptions {
        name: name.map(str::to_string),
        ..Default::default()
    };
    let resp = docker.create_container(Some(opts), body).await?;
    for w in &resp.warnings {
        tracing::warn!("engine warning: {w}");
    }
    Ok(resp.id)
}

/// Force-removes a container; already gone counts as success.
pub async fn remove(docker: &Docker, id: &str) -> Result<(), BollardError> {
    let opts = RemoveContainerOptions { force: true, v: true, link: false };
    match docker.remove_container(id, Some(opts)).await {
        Ok(()) => Ok(()),
        Err(BollardError::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
        // "removal already in progress"
        Err(BollardError::DockerResponseServerError { status_code: 409, .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Like [`remove`], but while the engine does not answer at all (it is being
/// restarted) keeps trying, with backoff, for up to `deadline`: a container
/// is never left behind just because the engine blinked. Engine answers
/// (errors included) end it at once.
pub async fn remove_patiently(docker: &Docker, id: &str, deadline: std::time::Duration) -> Result<(), BollardError> {
    let deadline = tokio::time::Instant::now() + deadline;
    let mut pause = std::time::Duration::from_millis(250);
    loop {
        match remove(docker, id).await {
            Err(e) if is_transport(&e) && tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(
                    "the Docker engine does not answer ({}); retrying the removal of {id}",
                    short_reason(&e)
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
            r => return r,
        }
    }
}

/// True when the error means the engine did not answer (not an engine error).
pub fn unreachable(e: &BollardError) -> bool {
    is_transport(e)
}

/// Sends SIGKILL; a container that is not running counts as success.
pub async fn kill(docker: &Docker, id: &str) -> Result<(), BollardError> {
    let opts = KillContainerOptions { signal: "SIGKILL".into() };
    match docker.kill_container(id, Some(opts)).await {
        Ok(()) => Ok(()),
        Err(BollardError::DockerResponseServerError { status_code: 404 | 409, .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// What a sweep looks for: containers left from an earlier attempt of one
/// delegate job, or from an earlier run of one Slurm job (a requeue keeps
/// the id).
#[derive(Clone, Copy, Debug)]
pub enum Leftovers<'a> {
    Job(&'a str),
    SlurmJob(&'a str),
}

/// Removes the containers of `what`, but only ever containers of `uid` (the
/// ids are the ones the agent verified; the uid filter stays as a second
/// guard). One engine round trip when there is nothing to remove.
pub async fn sweep(docker: &Docker, what: Leftovers<'_>, uid: u32) -> Result<usize, BollardError> {
    let sel = match what {
        Leftovers::Job(job) => format!("{LABEL_JOB}={job}"),
        Leftovers::SlurmJob(j) => format!("{LABEL_SLURM_JOB}={j}"),
    };
    // Several label filters are ANDed by the engine.
    let filters = HashMap::from([("label".to_string(), vec![sel, format!("{LABEL_UID}={uid}")])]);
    let opts = ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    let mut removed = 0;
    for c in docker.list_containers(Some(opts)).await? {
        if let Some(id) = c.id {
            tracing::warn!("removing container {id} left from an earlier attempt ({what:?})");
            remove(docker, &id).await?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// True when a create failed because the name is taken (a container of an
/// earlier attempt of the same job).
pub fn is_name_conflict(e: &BollardError) -> bool {
    matches!(e, BollardError::DockerResponseServerError { status_code: 409, .. })
}

/// What `perf_mode = auto` resolves to, decided by asking the engine to
/// create (not start) a throwaway container with CAP_PERFMON.
pub async fn perfmon_accepted(docker: &Docker, body: ContainerCreateBody) -> Result<bool, BollardError> {
    match create(docker, None, body).await {
        Ok(id) => {
            if let Err(e) = remove(docker, &id).await {
                tracing::warn!("could not remove the probe container {id}: {e}");
            }
            Ok(true)
        }
        Err(e) if is_unknown_capability(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

impl Perf {
    pub fn detail(self) -> &'static str {
        match self {
            Perf::Perfmon => "CAP_PERFMON is added to the sandbox",
            Perf::Seccomp => {
                "delegate's seccomp profile permits perf_event_open, no capability (kernel.perf_event_paranoid 2 or more: the sandbox's own processes, user space only)"
            }
            Perf::Off => "perf counters are off by site policy",
        }
    }
}

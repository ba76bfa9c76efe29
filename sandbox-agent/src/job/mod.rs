//! Serving one runner: identify it, then run its calls one at a time, each
//! in one fresh container bound to the verified job, the checked directory
//! inode and the life of the batch task.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use delegate_protocol::agent::{Answer, Request};
use delegate_protocol::policy::{Policy, DEFAULT_POLICY_PATH, POLICY_ENV};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::caller::conn::{self, Incoming};
use crate::caller::ident::{self, Caller};

mod check;
mod container;
mod measured;
mod run;

use container::EngineConn;
use run::run;

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
    pub quiet: crate::caller::quiet::PerUserLogLimit,
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
                // (a runner asking for its sandbox is making progress, for
                // as long as the checks before the sandbox take)
                shared.progress.touch(&c.job);
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
                let _ = conn::send(stream, &Answer::Refused(why.to_string())).await;
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
            let _ = conn::send(stream, &Answer::Refused(why.to_string())).await;
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

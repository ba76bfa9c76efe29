//! Supervising one started sandbox: attach, start, then wait for whichever
//! comes first of its exit, the time limit, the runner's kill, the end of
//! the batch task, the output or disk limits; kill if needed, drain the
//! output and inspect what the container left.

use std::os::fd::OwnedFd;
use std::time::Duration;

use delegate_protocol::agent::{Answer, Ended, EndedHow, Request};
use delegate_protocol::now_ms;
use delegate_protocol::policy::OutputLimit;
use delegate_protocol::units::format_size;
use futures_util::StreamExt;
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

use crate::caller::conn::{self, Incoming};
use crate::sandbox::call::CheckedCall;
use crate::sandbox::config::Perf;
use crate::sandbox::engine;
use crate::sandbox::jobdisk::{self, Budget};
use crate::sandbox::lifecycle::Lifecycle;
use crate::sandbox::output::{pump, Owner, Pumped};

/// Time allowed for the output to drain after the container ended.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(30);
/// ... after a kill.
const DRAIN_AFTER_KILL: Duration = Duration::from_millis(1500);
/// Time allowed for the wait/inspect calls on the kill path.
const KILL_PATH_CALL: Duration = Duration::from_millis(1500);
/// How often the job directory's usage is summed: every 100 ms (a job that
/// writes at memory speed, ~1.3 GB/s on this VM, passes `max_job_bytes` by
/// at most ~130 MB), less often only when summing itself takes long (a
/// directory of very many files): ten times the last sum's duration, at
/// most 2 s, so the watcher never takes more than a tenth of a core.
const DISK_POLL_MIN: Duration = Duration::from_millis(100);
const DISK_POLL_MAX: Duration = Duration::from_secs(2);

/// The pause before the next sum of the job directory's usage, after one
/// that took `took`.
fn disk_poll_after(took: Duration) -> Duration {
    took.saturating_mul(10).clamp(DISK_POLL_MIN, DISK_POLL_MAX)
}

/// Why supervision ended.
enum End {
    Exited,
    TimedOut,
    Killed,
    WaitFailed(String),
    Stopped(String),
}

/// The engine's error for `action` in the user's words.
fn classify(ctx: &CheckedCall<'_>, e: &bollard::errors::Error, action: &'static str) -> engine::EngineError {
    engine::classify(e, action, &ctx.policy.docker_socket, &ctx.host, &ctx.spec.image)
}

/// Attaches, starts, waits (time limit, the runner's kill, the batch
/// task's end, the disk limits), kills if needed, drains the output and
/// inspects the container. The caller removes it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn supervise<E: Lifecycle>(
    ctx: &CheckedCall<'_>,
    docker: &E,
    id: &str,
    perf: Perf,
    dir: &OwnedFd,
    out: OwnedFd,
    err: OwnedFd,
    stream: &UnixStream,
    rx: &mut mpsc::Receiver<Incoming>,
) -> Ended {
    let mut ended = Ended {
        how: EndedHow::Exited,
        exit_code: None,
        oom_killed: false,
        engine_gone: None,
        output_note: None,
        removal_error: None,
        started_ms: None,
    };
    // A kill asked before the start: do not start.
    if let Ok(Incoming { request: Request::Kill, .. }) = rx.try_recv() {
        ended.how = EndedHow::Killed;
        return ended;
    }
    let Running { mut pump_task, over_rx, started_ms } = match start(ctx, docker, id, out, err).await {
        Ok(r) => r,
        Err(why) => {
            ended.how = EndedHow::Failed(why.to_string());
            return ended;
        }
    };
    ended.started_ms = Some(started_ms);
    let answer = Answer::Started {
        container_id: id.to_string(),
        perf_mode: perf.as_str().into(),
        started_ms,
    };
    let told = conn::send(stream, &answer).await;
    let mut wait = docker.wait(id);
    let end = if told.is_err() {
        End::Killed
    } else {
        race(ctx, docker, id, dir, rx, &mut wait, over_rx).await
    };
    let killing = !matches!(end, End::Exited);
    if killing {
        tracing::warn!("killing container {id}");
        if let Err(e) = docker.kill(id).await {
            tracing::error!("could not kill container {id}: {}", engine::short_reason(&e));
        }
        let _ = tokio::time::timeout(KILL_PATH_CALL, wait.next()).await;
    }
    drop(wait);
    let pumped = drain(&mut pump_task, killing).await;
    let state = last_state(ctx, docker, id, killing, &mut ended).await;
    ended.exit_code = state.as_ref().and_then(|s| s.exit_code).map(|c| c as i32);
    ended.oom_killed = state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
    ended.how = end.into();
    ended.output_note = output_note(pumped, ctx.max_output);
    tracing::info!("container {id} ended: {:?} exit {:?}", ended.how, ended.exit_code);
    ended
}

/// A started sandbox: its output copier, the copier's "over max_output"
/// signal, and when it started.
struct Running {
    pump_task: tokio::task::JoinHandle<Pumped>,
    over_rx: watch::Receiver<bool>,
    started_ms: u64,
}

/// Attaches to the created sandbox, starts copying its output as the
/// student, and starts it; the error in the user's words.
async fn start<E: Lifecycle>(
    ctx: &CheckedCall<'_>,
    docker: &E,
    id: &str,
    out: OwnedFd,
    err: OwnedFd,
) -> Result<Running, engine::EngineError> {
    let output = docker
        .attach(id)
        .await
        .map_err(|e| classify(ctx, &e, "attach to the sandbox"))?;
    let (over_tx, over_rx) = watch::channel(false);
    let owner = Owner { uid: ctx.uid, gid: ctx.gid };
    let pump_task = tokio::spawn(pump(output, owner, out, err, ctx.max_output, over_tx));
    if let Err(e) = docker.start(id).await {
        pump_task.abort();
        return Err(classify(ctx, &e, "start the sandbox"));
    }
    tracing::info!("started container {id}");
    Ok(Running { pump_task, over_rx, started_ms: now_ms() })
}

/// Whichever comes first: the sandbox's exit, the time limit, the runner's
/// kill (or its going away), the end of the batch task, the job
/// directory's budget, the output limit (when it stops the call).
async fn race<E: Lifecycle, W>(
    ctx: &CheckedCall<'_>,
    docker: &E,
    id: &str,
    dir: &OwnedFd,
    rx: &mut mpsc::Receiver<Incoming>,
    wait: &mut W,
    mut over_rx: watch::Receiver<bool>,
) -> End
where
    W: futures_util::Stream<Item = Result<bollard::models::ContainerWaitResponse, bollard::errors::Error>> + Unpin,
{
    let limit = Duration::from_secs(ctx.spec.resources.time_limit_secs);
    // SAFETY: `register` needs the descriptor to stay open and owned by the
    // AsyncFd while registered: it is a fresh duplicate moved into it.
    let pidfd = ctx
        .caller
        .pidfd
        .try_clone()
        .and_then(|fd| unsafe { AsyncFd::register(fd) }.map_err(|e| e.into()));
    let output_stop = ctx.policy.output_limit == OutputLimit::Stop && ctx.max_output > 0;
    tokio::select! {
        w = wait.next() => match w {
            Some(Ok(_)) | Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => End::Exited,
            Some(Err(e)) => End::WaitFailed(classify(ctx, &e, "wait for the sandbox").to_string()),
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
        why = watch_job_dir(ctx, docker, id, dir) => End::Stopped(why),
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
}

/// The container's last state (exit code, OOM kill), bounded in time on the
/// kill path; an engine that stopped answering is noted in `ended`.
async fn last_state<E: Lifecycle>(
    ctx: &CheckedCall<'_>,
    docker: &E,
    id: &str,
    killing: bool,
    ended: &mut Ended,
) -> Option<bollard::models::ContainerState> {
    let deadline = if killing {
        KILL_PATH_CALL
    } else {
        Duration::from_secs(30)
    };
    match tokio::time::timeout(deadline, docker.state(id)).await {
        Ok(Ok(state)) => state,
        Ok(Err(e)) => {
            tracing::error!("cannot inspect container {id}: {}", engine::short_reason(&e));
            if engine::unreachable(&e) {
                ended.engine_gone = Some(classify(ctx, &e, "inspect the sandbox").to_string());
            }
            None
        }
        Err(_) => {
            tracing::error!("inspecting container {id} timed out");
            None
        }
    }
}

impl From<End> for EndedHow {
    fn from(end: End) -> EndedHow {
        match end {
            End::Exited => EndedHow::Exited,
            End::TimedOut => EndedHow::TimedOut,
            End::Killed => EndedHow::Killed,
            End::WaitFailed(r) => EndedHow::WaitFailed(r),
            End::Stopped(r) => EndedHow::Stopped(r),
        }
    }
}

/// Waits for the output copier to finish (briefly after a kill); a copier
/// that does not finish in time is aborted and says so.
async fn drain(pump_task: &mut tokio::task::JoinHandle<Pumped>, killing: bool) -> Pumped {
    let deadline = if killing { DRAIN_AFTER_KILL } else { DRAIN_AFTER_EXIT };
    match tokio::time::timeout(deadline, &mut *pump_task).await {
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
    }
}

/// What the outcome's reason says about the output, if anything: bytes
/// dropped past `max_output`, and the copier's error.
fn output_note(pumped: Pumped, max_output: u64) -> Option<String> {
    let mut notes = Vec::new();
    if pumped.dropped > 0 {
        notes.push(format!(
            "the output was truncated at the site limit of {} (max_output): {} bytes were dropped",
            format_size(max_output),
            pumped.dropped
        ));
    }
    if let Some(e) = pumped.error {
        notes.push(format!("the output may be incomplete: {e}"));
    }
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// Watches the job directory's budget (crate::sandbox::jobdisk) until the call
/// passes it; returns why. Never returns when there is no budget.
async fn watch_job_dir<E: Lifecycle>(ctx: &CheckedCall<'_>, docker: &E, id: &str, dir: &OwnedFd) -> String {
    let budget = Budget {
        bytes: ctx.max_job_bytes,
        files: ctx.max_job_files,
    };
    if budget.bytes == 0 && budget.files == 0 {
        return std::future::pending().await;
    }
    // The sandbox's processes, for its deleted-but-open files: only where
    // this agent's /proc shows them (not from another pid namespace).
    let init = docker.state(id).await.ok().flatten().and_then(|s| s.pid);
    let dev = jobdisk::device(dir);
    let proc = match &ctx.policy.host_proc {
        p if p.as_os_str().is_empty() => std::path::PathBuf::from("/proc"),
        p => p.clone(),
    };
    let mut pause = DISK_POLL_MIN;
    loop {
        tokio::time::sleep(pause).await;
        let t0 = std::time::Instant::now();
        let Ok(d) = dir.try_clone() else { continue };
        let (id, proc) = (id.to_string(), proc.clone());
        let measured = tokio::task::spawn_blocking(move || {
            let mut m = jobdisk::measure(&d, budget).ok()?;
            if let (Some(pids), Some(dev)) = (init.and_then(|p| jobdisk::sandbox_pids(&proc, p, &id)), dev) {
                m.deleted_bytes = jobdisk::deleted_bytes(&proc, &pids, dev);
            }
            Some(m)
        })
        .await
        .ok()
        .flatten();
        pause = disk_poll_after(t0.elapsed());
        if let Some(why) = measured.and_then(|m| jobdisk::verdict(&m, budget)) {
            return why;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_note_says_what_was_dropped_and_what_failed() {
        let p = |dropped, error: Option<&str>| Pumped {
            dropped,
            error: error.map(str::to_string),
        };
        assert_eq!(output_note(p(0, None), 32 << 20), None);
        assert_eq!(
            output_note(p(10, None), 32 << 20).as_deref(),
            Some("the output was truncated at the site limit of 32M (max_output): 10 bytes were dropped")
        );
        let both = output_note(p(10, Some("disk full")), 32 << 20).expect("a note");
        assert!(both.ends_with("; the output may be incomplete: disk full"), "{both}");
    }

    use std::sync::atomic::Ordering;

    use delegate_protocol::policy::Policy;
    use delegate_protocol::{JobId, Resources, Spec, Task};

    use crate::caller::ident::Caller;
    use crate::sandbox::lifecycle::scripted::Scripted;

    /// What one supervision of a scripted sandbox gave: its end, the
    /// answers sent to the runner, the stdout file's text.
    struct Run {
        ended: Ended,
        answers: Vec<Answer>,
        stdout: String,
    }

    /// Supervises `engine`'s sandbox with a time limit of `secs`; `kill`
    /// sends the runner's Kill first.
    async fn supervised(engine: &Scripted, secs: u64, kill: bool) -> Run {
        let policy = Policy::default();
        let spec = Spec {
            job_id: JobId::new(),
            uid: 0,
            gid: 0,
            created_ms: 0,
            image: "delegate-sandbox:latest".into(),
            task: Task::Command { argv: vec!["true".into()] },
            resources: Resources {
                time_limit_secs: secs,
                ..Resources::default()
            },
            env: Vec::new(),
        };
        let caller = Caller::this_process();
        let ctx = CheckedCall {
            policy: &policy,
            host: "node1".into(),
            uid: 0,
            gid: 0,
            slurm_job: "1",
            spec: &spec,
            tmp_bytes: 0,
            max_output: 1 << 20,
            max_job_bytes: 0,
            max_job_files: 0,
            caller: &caller,
            node: "node1".into(),
            alone: true,
            place: None,
        };
        let tmp = tempfile::tempdir().unwrap();
        let dir: OwnedFd = std::fs::File::open(tmp.path()).unwrap().into();
        let out: OwnedFd = std::fs::File::create(tmp.path().join("stdout")).unwrap().into();
        let err: OwnedFd = std::fs::File::create(tmp.path().join("stderr")).unwrap().into();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        if kill {
            tx.send(Incoming { request: Request::Kill, fds: Vec::new() }).await.unwrap();
        }
        let ended = supervise(&ctx, engine, "c1", Perf::Seccomp, &dir, out, err, &ours, &mut rx).await;
        drop((ours, tx));
        let mut bytes = Vec::new();
        let mut theirs = theirs.into_std().unwrap();
        theirs.set_nonblocking(false).unwrap();
        std::io::Read::read_to_end(&mut theirs, &mut bytes).unwrap();
        let mut frames = delegate_protocol::agent::FrameBuf::default();
        frames.push(&bytes);
        let mut answers = Vec::new();
        while let Some(a) = frames.next_frame::<Answer>().unwrap() {
            answers.push(a);
        }
        let stdout = std::fs::read_to_string(tmp.path().join("stdout")).unwrap();
        Run { ended, answers, stdout }
    }

    #[tokio::test]
    async fn a_sandbox_that_exits_is_started_told_and_its_output_kept() {
        let engine = Scripted::new(Some(3), b"hello\n");
        let r = supervised(&engine, 60, false).await;
        assert_eq!(r.ended.how, EndedHow::Exited);
        assert_eq!((r.ended.exit_code, r.ended.oom_killed), (Some(3), false));
        assert!(r.ended.started_ms.is_some() && r.ended.output_note.is_none());
        assert!(
            matches!(r.answers.as_slice(), [Answer::Started { container_id, perf_mode, .. }]
            if container_id == "c1" && perf_mode == "seccomp"),
            "{:?}",
            r.answers
        );
        assert_eq!(r.stdout, "hello\n");
        assert_eq!(engine.kills.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_sandbox_past_its_time_limit_is_killed() {
        let engine = Scripted::new(None, b"");
        let r = supervised(&engine, 1, false).await;
        assert_eq!(r.ended.how, EndedHow::TimedOut);
        assert_eq!(engine.kills.load(Ordering::SeqCst), 1);
        assert_eq!(r.ended.exit_code, Some(137));
    }

    #[tokio::test]
    async fn a_kill_before_the_start_starts_nothing() {
        let engine = Scripted::new(Some(0), b"");
        let r = supervised(&engine, 60, true).await;
        assert_eq!(r.ended.how, EndedHow::Killed);
        assert_eq!(engine.starts.load(Ordering::SeqCst), 0);
        assert!(r.answers.is_empty() && r.ended.started_ms.is_none());
    }

    #[tokio::test]
    async fn an_out_of_memory_kill_is_reported() {
        let mut engine = Scripted::new(Some(137), b"");
        engine.oom = true;
        let r = supervised(&engine, 60, false).await;
        assert_eq!(
            (r.ended.how, r.ended.exit_code, r.ended.oom_killed),
            (EndedHow::Exited, Some(137), true)
        );
    }

    #[tokio::test]
    async fn a_failed_wait_says_what_the_engine_did() {
        let mut engine = Scripted::new(None, b"");
        engine.wait_error = Some(|| bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: "containerd is gone".into(),
        });
        let r = supervised(&engine, 60, false).await;
        assert_eq!(
            r.ended.how,
            EndedHow::WaitFailed(
                "the Docker engine on node node1 failed to wait for the sandbox: containerd is gone".into()
            )
        );
        assert_eq!(engine.kills.load(Ordering::SeqCst), 1, "a sandbox whose wait failed is killed");
    }

    #[tokio::test]
    async fn an_engine_that_stops_answering_is_named() {
        let mut engine = Scripted::new(None, b"");
        engine.wait_error = Some(|| bollard::errors::Error::RequestTimeoutError);
        let r = supervised(&engine, 60, false).await;
        assert_eq!(
            r.ended.how,
            EndedHow::WaitFailed("cannot reach the Docker engine at /var/run/docker.sock: Timeout error".into())
        );
    }

    #[test]
    fn disk_poll_is_fast_unless_summing_is_slow() {
        assert_eq!(disk_poll_after(Duration::from_micros(40)), DISK_POLL_MIN);
        assert_eq!(disk_poll_after(Duration::from_millis(30)), Duration::from_millis(300));
        assert_eq!(disk_poll_after(Duration::from_secs(5)), DISK_POLL_MAX);
    }
}

//! Supervising one started sandbox: attach, start, then wait for whichever
//! comes first of its exit, the time limit, the runner's kill, the end of
//! the batch task, the output or disk limits; kill if needed, drain the
//! output and inspect what the container left.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use bollard::query_parameters::{AttachContainerOptions, WaitContainerOptions};
use bollard::Docker;
use delegate_protocol::agent::{Answer, Ended, EndedHow, Request};
use delegate_protocol::now_ms;
use delegate_protocol::policy::OutputLimit;
use delegate_protocol::units::format_size;
use futures_util::StreamExt;
use nix::sys::stat::SFlag;
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

use crate::config::Perf;
use crate::conn::{self, Incoming};
use crate::engine;
use crate::job::Ctx;
use crate::output::{pump, Owner, Pumped};

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

/// Attaches, starts, waits (time limit, the runner's kill, the batch
/// task's end, the disk limits), kills if needed, drains the output and
/// inspects the container. The caller removes it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn supervise(
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
    let owner = Owner { uid: ctx.uid, gid: ctx.gid };
    let mut pump_task = tokio::spawn(pump(attached.output, owner, out, err, ctx.max_output, over_tx));
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
                if ctx.max_job_bytes == 0 {
                    std::future::pending::<()>().await;
                }
                let mut pause = DISK_POLL_MIN;
                loop {
                    tokio::time::sleep(pause).await;
                    let t0 = std::time::Instant::now();
                    let d = dir.try_clone();
                    let used = match d {
                        Ok(d) => tokio::task::spawn_blocking(move || usage(&d)).await.ok().and_then(Result::ok),
                        Err(_) => None,
                    };
                    pause = disk_poll_after(t0.elapsed());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_poll_is_fast_unless_summing_is_slow() {
        assert_eq!(disk_poll_after(Duration::from_micros(40)), DISK_POLL_MIN);
        assert_eq!(disk_poll_after(Duration::from_millis(30)), Duration::from_millis(300));
        assert_eq!(disk_poll_after(Duration::from_secs(5)), DISK_POLL_MAX);
    }

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

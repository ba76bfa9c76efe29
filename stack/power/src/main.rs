//! `delegate-power`: the stack's power service for elastic workers
//! (docs/elastic.md), its own binary in the stack's `power` service (the
//! cluster image, root, the host's Docker socket). slurmctld's power programs (slurm-conf/power.sh,
//! run as SlurmUser on the head) leave one request per worker in the spool
//! directory, a root/SlurmUser-only directory bound into the head and into
//! this service only: a file `req.<id>` holding `resume workerN` or
//! `suspend workerN`. This service, root with the host's Docker socket,
//! checks each request against the stack's elastic workers, scales that
//! worker's swarm service to 1 or 0 replicas, and answers in `res.<id>`:
//! `ok ...` or `error <why>`. A start is answered once the worker's task
//! runs, or fails at once when the engine rejects it (a missing image, a
//! mount that cannot be made) rather than after Slurm's ResumeTimeout.
//!
//! Whom it trusts: the spool's files are written by SlurmUser; every request
//! is parsed bounded and only this stack's elastic workers may be scaled.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod back;
mod placement;

use bollard::models::TaskState;
use bollard::query_parameters::{InspectServiceOptions, ListTasksOptions, UpdateServiceOptions};
use bollard::Docker;

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Resume,
    Suspend,
}

/// The service's settings (its environment, from the stack file).
#[derive(Debug, Clone)]
pub struct Settings {
    pub stack: String,
    /// Workers `1..=min` always run: never scaled.
    pub min: u32,
    pub max: u32,
    pub spool: PathBuf,
    /// How long a start is watched before it is answered "starting".
    pub start_wait: Duration,
}

impl Settings {
    /// From DELEGATE_STACK_NAME, DELEGATE_ELASTIC_MIN/MAX and
    /// DELEGATE_POWER_START_WAIT; the spool is /run/delegate-power.
    pub fn from_env() -> Result<Settings, String> {
        let var = |n: &str| std::env::var(n).map_err(|_| format!("{n} is not set"));
        let num = |n: &str| -> Result<u32, String> { var(n)?.parse().map_err(|_| format!("{n} must be a number")) };
        let stack = var("DELEGATE_STACK_NAME")?;
        if stack.is_empty()
            || !stack
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(format!("DELEGATE_STACK_NAME '{stack}' is not a stack name"));
        }
        let start_wait = std::env::var("DELEGATE_POWER_START_WAIT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60);
        Ok(Settings {
            stack,
            min: num("DELEGATE_ELASTIC_MIN")?,
            max: num("DELEGATE_ELASTIC_MAX")?,
            spool: PathBuf::from("/run/delegate-power"),
            start_wait: Duration::from_secs(start_wait),
        })
    }
}

/// A request file's id: `req.<digits>` (at most 40).
pub fn request_id(file_name: &str) -> Option<&str> {
    let id = file_name.strip_prefix("req.")?;
    (!id.is_empty() && id.len() <= 40 && id.bytes().all(|b| b.is_ascii_digit())).then_some(id)
}

/// The request's first line, checked: an action and one of this stack's
/// elastic workers (`min+1..=max`).
pub fn parse_request(body: &[u8], min: u32, max: u32) -> Result<(Action, u32), String> {
    let line = body.split(|b| *b == b'\n').next().unwrap_or_default();
    let text = String::from_utf8_lossy(&line[..line.len().min(64)]).into_owned();
    let refuse = || {
        format!(
            "refused request '{}' (want resume|suspend worker{}..worker{max})",
            clean(&text),
            min + 1
        )
    };
    let (action, node) = text.split_once(' ').ok_or_else(refuse)?;
    let action = match action {
        "resume" => Action::Resume,
        "suspend" => Action::Suspend,
        _ => return Err(refuse()),
    };
    let n = node
        .strip_prefix("worker")
        .filter(|d| !d.is_empty() && d.len() <= 4 && !d.starts_with('0') && d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse::<u32>().ok())
        .filter(|n| *n > min && *n <= max)
        .ok_or_else(refuse)?;
    Ok((action, n))
}

/// The engine's own words for a failed request (the agent's
/// `sandbox::engine::short_reason`, for this service's answers).
fn short_reason(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.trim().to_string(),
        other => {
            let mut last: &dyn std::error::Error = other;
            while let Some(e) = last.source() {
                last = e;
            }
            last.to_string()
        }
    }
}

/// Text fit for an answer and a Slurm reason: printable, no quotes, bounded.
pub fn clean(s: &str) -> String {
    let kept: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " .,:;_/()=+-".contains(c) {
                c
            } else {
                ' '
            }
        })
        .collect();
    kept.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(180)
        .collect()
}

/// Writes the answer to request `id` (atomically: a temporary, renamed).
fn answer(spool: &Path, id: &str, text: &str) {
    match write_spool(spool, &format!("res.{id}"), text) {
        Ok(()) => tracing::info!("answer {id}: {text}"),
        Err(e) => tracing::error!("cannot answer {id}: {e}"),
    }
}

/// Writes `text` as the spool file `name`, whole or not at all (a
/// temporary `.name`, renamed): the head's programs never read half.
fn write_spool(spool: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let tmp = spool.join(format!(".{name}"));
    std::fs::write(&tmp, format!("{text}\n")).and_then(|()| std::fs::rename(&tmp, spool.join(name)))
}

/// Sets the service's replicas (as `docker service update --replicas`).
async fn scale(docker: &Docker, service: &str, replicas: i64) -> Result<(), String> {
    let current = docker
        .inspect_service(service, None::<InspectServiceOptions>)
        .await
        .map_err(|e| format!("cannot inspect {service}: {}", crate::short_reason(&e)))?;
    let version = current
        .version
        .and_then(|v| v.index)
        .ok_or_else(|| format!("{service} has no version"))?;
    let mut spec = current.spec.ok_or_else(|| format!("{service} has no spec"))?;
    let mode = spec.mode.get_or_insert_with(Default::default);
    mode.replicated.get_or_insert_with(Default::default).replicas = Some(replicas);
    let options = UpdateServiceOptions {
        version: i32::try_from(version).unwrap_or(i32::MAX),
        ..Default::default()
    };
    docker
        .update_service(service, spec, options, None)
        .await
        .map(|_| ())
        .map_err(|e| {
            format!(
                "docker service update --replicas {replicas} {service} failed: {}",
                crate::short_reason(&e)
            )
        })
}

/// The state and error of the service's newest task.
async fn newest_task(docker: &Docker, service: &str) -> Option<(Option<TaskState>, String)> {
    let filters = [("service".to_string(), vec![service.to_string()])].into_iter().collect();
    let tasks = docker
        .list_tasks(Some(ListTasksOptions { filters: Some(filters) }))
        .await
        .ok()?;
    let newest = tasks
        .into_iter()
        .max_by_key(|t| t.version.as_ref().and_then(|v| v.index).unwrap_or(0))?;
    let status = newest.status.unwrap_or_default();
    Some((status.state, status.err.unwrap_or_default()))
}

/// Scales worker `n` and answers request `id`.
async fn serve_one(docker: Docker, s: Settings, id: String, action: Action, n: u32) {
    let service = format!("{}_worker{n}", s.stack);
    if action == Action::Suspend {
        let text = match scale(&docker, &service, 0).await {
            Ok(()) => "ok stopped".to_owned(),
            Err(e) => format!("error {}", clean(&e)),
        };
        return answer(&s.spool, &id, &text);
    }
    if let Err(e) = scale(&docker, &service, 1).await {
        return answer(&s.spool, &id, &format!("error {}", clean(&e)));
    }
    // Started when its task runs; a task the engine rejects or that fails
    // is a failure now.
    let deadline = tokio::time::Instant::now() + s.start_wait;
    let mut last = String::from("none");
    while tokio::time::Instant::now() < deadline {
        match newest_task(&docker, &service).await {
            Some((Some(TaskState::RUNNING), _)) => return answer(&s.spool, &id, "ok running"),
            Some((_, err)) if !err.is_empty() => {
                let _ = scale(&docker, &service, 0).await;
                return answer(&s.spool, &id, &format!("error the task of {service} failed: {}", clean(&err)));
            }
            Some((state, _)) => last = state.map_or("unknown".into(), |st| st.to_string()),
            None => {}
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    answer(&s.spool, &id, &format!("ok starting (task: {})", clean(&last)));
}

/// One request taken from the spool: its id and what it asks (or why it
/// is refused).
type Taken = (String, Result<(Action, u32), String>);

/// Takes the requests now in the spool: each one read bounded and removed;
/// well-formed ones for this stack's elastic workers are served (in the
/// background), others answered with the refusal.
fn take_requests(s: &Settings) -> Vec<Taken> {
    let Ok(entries) = std::fs::read_dir(&s.spool) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("req.") {
            continue;
        }
        let path = entry.path();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let Some(id) = request_id(&name).filter(|_| is_file).map(str::to_owned) else {
            let _ = std::fs::remove_file(&path);
            tracing::warn!("dropped {}", clean(&name));
            continue;
        };
        let body = read_bounded(&path, 64);
        let _ = std::fs::remove_file(&path);
        out.push((id, parse_request(&body, s.min, s.max)));
    }
    out
}

fn read_bounded(path: &Path, limit: u64) -> Vec<u8> {
    use std::io::Read;
    let mut body = Vec::new();
    if let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        let _ = f.take(limit).read_to_end(&mut body);
    }
    body
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("delegate-power {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    if std::env::args().len() > 1 {
        eprintln!("usage: delegate-power [--version] (settings from the environment: docs/elastic.md)");
        std::process::exit(2);
    }
    // (logs on stderr: the service's log)
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_target(false)
        .with_writer(std::io::stderr)
        .init();
    let result = Settings::from_env().and_then(|s| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(serve(s))
    });
    if let Err(e) = result {
        tracing::error!("power service: {e}");
        std::process::exit(1);
    }
}

/// The service's loop: the spool is looked at every 200 ms; the swarm,
/// for workers that wait for a machine, every [`back::CHECK_INTERVAL`].
async fn serve(s: Settings) -> Result<(), String> {
    if !s.spool.is_dir() {
        return Err(format!("{} is missing", s.spool.display()));
    }
    let docker = Docker::connect_with_unix_defaults().map_err(|e| format!("cannot reach the Docker engine: {e}"))?;
    tracing::info!(
        "power service: workers {}..{} of stack {}, requests in {}",
        s.min + 1,
        s.max,
        s.stack,
        s.spool.display()
    );
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut machines = tokio::time::interval(back::CHECK_INTERVAL);
    loop {
        for (id, request) in take_requests(&s) {
            match request {
                Ok((action, n)) => {
                    tracing::info!("request {id}: {action:?} worker{n}");
                    tokio::spawn(serve_one(docker.clone(), s.clone(), id, action, n));
                }
                Err(why) => answer(&s.spool, &id, &format!("error {why}")),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = machines.tick() => back::announce(&docker, &s).await,
            _ = term.recv() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_against_the_elastic_workers() {
        assert_eq!(parse_request(b"resume worker2\n", 1, 3), Ok((Action::Resume, 2)));
        assert_eq!(parse_request(b"suspend worker3", 1, 3), Ok((Action::Suspend, 3)));
        for bad in [
            &b"resume worker1"[..],
            b"resume worker4",
            b"resume worker02",
            b"start worker2",
            b"resume  worker2",
            b"",
            b"resume worker2x",
            b"resume head",
        ] {
            let err = parse_request(bad, 1, 3).unwrap_err();
            assert!(err.starts_with("refused request"), "{err}");
            assert!(err.ends_with("(want resume|suspend worker2..worker3)"), "{err}");
        }
    }

    #[test]
    fn ids_and_answers_are_bounded() {
        assert_eq!(request_id("req.123"), Some("123"));
        for bad in [
            "req.",
            "req.12a",
            "req.../x",
            "res.1",
            &format!("req.{}", "1".repeat(41)),
        ] {
            assert_eq!(request_id(bad), None, "{bad}");
        }
        assert_eq!(clean("a\"b'c\n$(x)"), "a b c (x)");
        assert_eq!(clean(&"x".repeat(500)).len(), 180);
    }

    #[test]
    fn the_spool_is_taken_bounded_and_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings {
            stack: "t".into(),
            min: 0,
            max: 2,
            spool: dir.path().to_path_buf(),
            start_wait: Duration::ZERO,
        };
        std::fs::write(dir.path().join("req.1"), "resume worker1\n").unwrap();
        std::fs::write(dir.path().join("req.2"), format!("suspend worker9{}", "x".repeat(10_000))).unwrap();
        std::fs::write(dir.path().join("req.x"), "resume worker1").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", dir.path().join("req.3")).unwrap();
        let mut got = take_requests(&s);
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], ("1".into(), Ok((Action::Resume, 1))));
        // The request is read up to its first 64 bytes; the refusal is bounded.
        let want = format!(
            "refused request 'suspend worker9{}' (want resume|suspend worker1..worker2)",
            "x".repeat(64 - "suspend worker9".len())
        );
        assert_eq!(got[1], ("2".into(), Err(want)));
        assert!(got[1].1.as_ref().is_err_and(|e| e.len() < 200));
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "every request file is removed"
        );
    }
}

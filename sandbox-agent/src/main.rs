//! `sandbox-agent`: delegate's root-owned per-node daemon, the only holder
//! of the Docker socket.
//!
//! ```text
//! sandbox-agent            serve on the site policy's agent_socket (root only);
//!                          SIGHUP publishes the node's class now ([`node`])
//! sandbox-agent --version
//! ```
//!
//! `sandbox-runner` (unprivileged, run by the student's Slurm batch step)
//! connects to the socket. Anyone may connect and ask for the probe; a
//! call runs only for a peer that the kernel and slurmctld show to be the
//! batch task of a running Slurm job of its uid on this node (see
//! [`ident`]); the job directory is the inode the runner opened, pinned at
//! a root-owned staging path ([`stage`]); at most one sandbox per Slurm
//! job; the container lives no longer than the connection and the batch
//! task, and every created container is removed (panics included).
//!
//! Logs go to `$DELEGATE_AGENT_LOG` (default
//! `/var/log/delegate/agent.log`), a file the agent opens itself in append
//! mode: nothing the student controls can block or break them.

mod ask;
mod caller;
mod gpu;
mod job;
mod logfile;
mod measure;
mod node;
mod sandbox;
mod scheduling;

use caller::{admit, conn, ident, quiet};
use node::probe;
use sandbox::stage;
use scheduling::{aside, failed_launch, queue};

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

const DEFAULT_LOG: &str = "/var/log/delegate/agent.log";

fn init_logging() {
    let path = std::env::var_os("DELEGATE_AGENT_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LOG));
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    // 0640: the log names every student's jobs and uids (root and group
    // adm read it; build_cluster.sh makes it root:adm); rotated at a cap.
    let file = logfile::Rotating::open(&path, logfile::CAP);
    let builder = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_ansi(false)
        .with_target(false);
    match file {
        Ok(f) => builder.with_writer(Mutex::new(f)).init(),
        Err(e) => {
            builder.with_writer(std::io::stderr).init();
            tracing::warn!("cannot open {}: {e}; logging to stderr", path.display());
        }
    }
    std::panic::set_hook(Box::new(|info| tracing::error!("panic: {info}")));
}

/// Closes every descriptor above stderr the agent inherited: a daemon that
/// outlives its starter must not keep its descriptors (e.g. the lock that a
/// `flock <file> build_cluster.sh --local up` holds, which would stay held
/// as long as the agent runs, or a pipe its starter waits to see closed).
fn close_inherited() {
    // SAFETY: close_range(2) on descriptors nothing in this process uses yet.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if rc == 0 {
        return;
    }
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .filter(|&fd| fd > 2)
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
}

fn main() {
    close_inherited();
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("sandbox-agent {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    if std::env::args().len() > 1 {
        eprintln!("usage: sandbox-agent [--version]");
        std::process::exit(2);
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("sandbox-agent: must run as root");
        std::process::exit(1);
    }
    init_logging();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(serve()) {
        tracing::error!("{e}");
        eprintln!("sandbox-agent: {e}");
        std::process::exit(1);
    }
}

/// Serves a new connection if its user is within the bounds of
/// [`admit`]; else closes it at once (logged once a minute per user).
fn admit_one(stream: tokio::net::UnixStream, admission: &Arc<admit::Admission>, shared: &Arc<job::Shared>) {
    let uid = match stream.peer_cred() {
        Ok(c) => c.uid(),
        Err(e) => {
            tracing::warn!("no peer credentials: {e}");
            return;
        }
    };
    match admission.admit(uid) {
        Ok(ticket) => {
            tokio::spawn(job::serve(conn::Socket::new(stream, ticket), shared.clone()));
        }
        Err(why) => shared.quiet.warn(uid, "admission", &format!("closing a new connection: {why}")),
    }
}

async fn serve() -> Result<(), String> {
    let policy = job::load_policy().map_err(|e| e.to_string())?;
    let socket = policy.agent_socket.clone();
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    stage::prepare(&policy.staging_dir).map_err(|e| format!("{}: {e}", policy.staging_dir.display()))?;
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    // Anyone may connect: the checks decide.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let stepds = ident::slurmstepd_paths();
    if stepds.is_empty() {
        tracing::warn!("no slurmstepd found: every run request will be refused");
    }
    let shared = Arc::new(job::Shared {
        running: Mutex::new(HashSet::new()),
        stepds,
        node: ident::node_name(),
        republish: Arc::new(tokio::sync::Notify::new()),
        quiet: quiet::PerUserLogLimit::default(),
        probe: probe::Cached::default(),
        queue: queue::Cached::default(),
        aside: aside::Watched::default(),
        progress: aside::Progress::default(),
    });
    tokio::spawn(aside::keep_maps_moving(shared.clone()));
    tokio::spawn(failed_launch::keep_released(shared.node.clone(), shared.stepds.clone()));
    tokio::spawn(node::report::keep_published(
        policy.clone(),
        shared.node.clone(),
        shared.republish.clone(),
    ));
    tracing::info!(
        "sandbox-agent {} listening on {} (node {}, slurmstepd {:?})",
        env!("CARGO_PKG_VERSION"),
        socket.display(),
        shared.node,
        shared.stepds
    );
    let admission = Arc::new(admit::Admission::default());
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    // SIGHUP: publish the node's class and report now (a deployment that
    // just cleared them waits for it).
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            a = listener.accept() => match a {
                Ok((stream, _)) => admit_one(stream, &admission, &shared),
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            _ = hup.recv() => shared.republish.notify_one(),
            _ = term.recv() => {
                tracing::info!("SIGTERM: stopping");
                let _ = std::fs::remove_file(&socket);
                return Ok(());
            }
        }
    }
}

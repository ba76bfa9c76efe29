//! `delegate-place`: the place helper's socket (see `delegate_protocol::place`).
//! Run as Slurm's user (it must see every user's jobs, and needs nothing
//! more) on the machine where students' clients run; its socket's
//! directory must exist and be its own.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use delegate_client::slurm::Slurm;
use delegate_place::latest::{self, Latest, Patience};
use delegate_place::Reader;
use delegate_protocol::agent::frame;
use delegate_protocol::place::{PlaceAnswer, DEFAULT_PLACE_SOCKET};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// How long a caller may take to read its answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Parser)]
#[command(about = "Tells each student where their waiting jobs stand in Slurm's queue")]
struct Args {
    /// The socket to listen on (its directory must exist).
    #[arg(long, default_value = DEFAULT_PLACE_SOCKET)]
    socket: PathBuf,
    /// Slurm's queue is read at most once in this many seconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
    every: u64,
    /// Print the socket it would listen on and exit (for the scripts that
    /// start it: the path is written once, in delegate_protocol::place).
    #[arg(long)]
    print_socket: bool,
    /// Ask the helper listening on --socket instead, and print the caller's
    /// waiting jobs (root: every one), a line each: job, jobs ahead, likely
    /// start (seconds since the epoch, `-` when none).
    #[arg(long, conflicts_with = "print_socket")]
    ask: bool,
}

/// `--ask`: the helper's answer for this caller, as lines.
fn ask(socket: &Path) -> ExitCode {
    match delegate_client::place::ask(socket) {
        Ok(places) => {
            let mut lines: Vec<String> = places
                .jobs
                .into_iter()
                .map(|(job, s)| {
                    let at = s.likely_start.map_or_else(|| "-".to_owned(), |t| t.to_string());
                    format!("{job} {} {at}", s.ahead)
                })
                .collect();
            lines.sort();
            for l in lines {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("delegate-place: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum BindError {
    #[error("{0} exists and is not a socket; remove it or choose another --socket")]
    NotASocket(String),
    #[error("cannot listen on {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Listens on `path`, replacing a socket left there by an earlier run.
fn bind(path: &Path) -> Result<UnixListener, BindError> {
    let shown = path.display().to_string();
    let io = |source| BindError::Io { path: shown.clone(), source };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(io)?,
        Ok(_) => return Err(BindError::NotASocket(shown)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    // Any local user may ask; each learns only of their own jobs.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(io)?;
    Ok(listener)
}

/// Answers one caller and closes the connection.
fn serve(stream: UnixStream, latest: &Latest) {
    let uid = match getsockopt(&stream, PeerCredentials) {
        Ok(c) => c.uid(),
        Err(e) => {
            tracing::warn!("a caller without credentials: {e}");
            return;
        }
    };
    let name = uzers::get_user_by_uid(uid)
        .map(|u| u.name().to_string_lossy().into_owned())
        .unwrap_or_else(|| uid.to_string());
    let answer = latest.for_answer().map_or_else(
        || PlaceAnswer {
            unavailable: Some("Slurm's queue is still being read".to_owned()),
            ..PlaceAnswer::default()
        },
        |read| read.answer(&name, uid),
    );
    let bytes = match frame(&answer) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!("cannot encode the answer for uid {uid}: {e}");
            return;
        }
    };
    let mut stream = stream;
    let sent = stream
        .set_write_timeout(Some(WRITE_TIMEOUT))
        .and_then(|()| stream.write_all(&bytes));
    if let Err(e) = sent {
        tracing::debug!("uid {uid} did not take its answer: {e}");
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let args = Args::parse();
    if args.print_socket {
        println!("{}", args.socket.display());
        return ExitCode::SUCCESS;
    }
    if args.ask {
        return ask(&args.socket);
    }
    let listener = match bind(&args.socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("delegate-place: {e}");
            return ExitCode::FAILURE;
        }
    };
    let slurm = Slurm::from_env();
    let read = move || slurm.queue_all().map_err(|e| format!("Slurm's queue could not be read ({e})"));
    let latest = Latest::new(Patience::every(Duration::from_secs(args.every)));
    if let Err(e) = latest::spawn(latest.clone(), Reader::new(read)) {
        eprintln!("delegate-place: cannot start the thread that reads Slurm's queue: {e}");
        return ExitCode::FAILURE;
    }
    tracing::info!(socket = %args.socket.display(), every = args.every, "listening");
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => serve(stream, &latest),
            Err(e) => {
                tracing::warn!("accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    ExitCode::SUCCESS
}

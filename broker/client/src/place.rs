//! Where the caller's waiting jobs stand in Slurm's queue, asked of the
//! place helper (`delegate_protocol::place`) when one listens on this
//! machine. Students do not see other users' jobs; the helper tells each
//! only of their own. Bounded: a connection that cannot be made at once,
//! an answer not there within [`ANSWER_WITHIN`] or over its size bound is
//! no answer (the status then shows no place).

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use delegate_protocol::agent::FrameBuf;
use delegate_protocol::place::{Place, PlaceAnswer, DEFAULT_PLACE_SOCKET, MAX_PLACE_BYTES, PLACE_SOCKET_ENV};
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};

/// How long the helper may take to answer.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Why there is no answer.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("cannot connect to the place helper at {path}: {source}")]
    Connect { path: String, source: nix::Error },
    #[error("the place helper at {path} did not answer: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("the place helper at {path} answered something else: {reason}")]
    Answer { path: String, reason: String },
    #[error("the place helper cannot tell: {0}")]
    Unavailable(String),
}

/// The helper's socket: `$DELEGATE_PLACE_SOCKET`, else the default, when
/// a socket is there.
pub fn socket_path() -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let path = std::env::var_os(PLACE_SOCKET_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_PLACE_SOCKET), PathBuf::from);
    std::fs::metadata(&path)
        .ok()
        .filter(|m| m.file_type().is_socket())
        .map(|_| path)
}

/// Where one waiting job stands: the waiting jobs ahead of it, and when it
/// will likely start (seconds since the epoch), when the helper could say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    pub ahead: u32,
    pub likely_start: Option<u64>,
}

/// The helper's answer: each of the caller's waiting jobs (Slurm id as
/// `squeue --array` prints it) and where it stands, as of the helper's
/// last read of the queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Places {
    /// When the helper read the queue (seconds since the epoch): a job
    /// submitted since is not in `jobs` yet.
    pub read_at: u64,
    pub jobs: HashMap<String, Standing>,
}

/// Where the caller's waiting jobs stand ([`Places`]).
pub fn ask(path: &Path) -> Result<Places, PlaceError> {
    let shown = path.display().to_string();
    let connect_err = |source| PlaceError::Connect { path: shown.clone(), source };
    // (non-blocking: a helper whose backlog is full is no answer, not a wait)
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(connect_err)?;
    let addr = UnixAddr::new(path).map_err(connect_err)?;
    connect(fd.as_raw_fd(), &addr).map_err(connect_err)?;
    let read_err = |source| PlaceError::Read { path: shown.clone(), source };
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false).map_err(read_err)?;
    stream.set_read_timeout(Some(ANSWER_WITHIN)).map_err(read_err)?;
    let mut bytes = Vec::new();
    stream.take(MAX_PLACE_BYTES + 4).read_to_end(&mut bytes).map_err(read_err)?;
    let mut buf = FrameBuf::default();
    buf.push(&bytes);
    let answer = match buf.next_frame::<PlaceAnswer>() {
        Ok(Some(a)) => a,
        Ok(None) => {
            return Err(PlaceError::Answer {
                path: shown,
                reason: format!("{} bytes, not a whole answer", bytes.len()),
            })
        }
        Err(e) => return Err(PlaceError::Answer { path: shown, reason: e.to_string() }),
    };
    if let Some(why) = answer.unavailable {
        return Err(PlaceError::Unavailable(why));
    }
    let read_at = answer.as_of_ms / 1000;
    let standing = |p: &Place| Standing {
        ahead: p.ahead,
        likely_start: p.likely_in_s.map(|s| read_at.saturating_add(u64::from(s))),
    };
    Ok(Places {
        read_at,
        jobs: answer.places.iter().map(|p| (p.job.clone(), standing(p))).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use delegate_protocol::agent::frame;
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    fn serve_once(bytes: Vec<u8>) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<()>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("place.sock");
        let l = UnixListener::bind(&path).expect("bind");
        let t = std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let _ = s.write_all(&bytes);
            }
        });
        (dir, path, t)
    }

    #[test]
    fn the_answer_names_each_waiting_job_and_its_place() {
        let a = PlaceAnswer {
            as_of_ms: 1_000_000,
            places: vec![
                Place {
                    job: "7_2".into(),
                    ahead: 37,
                    likely_in_s: Some(90),
                },
                Place {
                    job: "8".into(),
                    ahead: 38,
                    likely_in_s: None,
                },
            ],
            unavailable: None,
        };
        let (_d, path, t) = serve_once(frame(&a).expect("frame"));
        let got = ask(&path).expect("answer");
        t.join().expect("server");
        assert_eq!(got.read_at, 1_000);
        let got = got.jobs;
        // The likely start counts from the helper's read of the queue.
        assert_eq!(got["7_2"], Standing { ahead: 37, likely_start: Some(1_090) });
        assert_eq!(got["8"], Standing { ahead: 38, likely_start: None });
    }

    #[test]
    fn no_answer_junk_or_a_silent_helper_is_an_error_not_a_wait() {
        let (_d, path, t) = serve_once(b"\x05\x00\x00\x00junk!".to_vec());
        assert!(matches!(ask(&path), Err(PlaceError::Answer { .. })));
        t.join().expect("server");
        let unavailable = PlaceAnswer {
            unavailable: Some("Slurm's queue could not be read".into()),
            ..PlaceAnswer::default()
        };
        let (_d, path, t) = serve_once(frame(&unavailable).expect("frame"));
        assert!(matches!(ask(&path), Err(PlaceError::Unavailable(w)) if w.contains("could not be read")));
        t.join().expect("server");
        // A helper that accepts and never answers: at most ANSWER_WITHIN.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("silent.sock");
        let _l = UnixListener::bind(&path).expect("bind");
        assert!(matches!(ask(&path), Err(PlaceError::Read { .. })));
        // Nobody there.
        assert!(matches!(ask(&dir.path().join("none.sock")), Err(PlaceError::Connect { .. })));
    }
}

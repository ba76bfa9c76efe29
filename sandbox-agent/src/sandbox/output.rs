//! The call's output: copied from the container's attach stream into the
//! `stdout` and `stderr` files the runner created (as the user) and passed
//! as descriptors, chunk by chunk, counting against the site's
//! `max_output`. Past it the rest is read and dropped (counted), so the
//! container never blocks on a full pipe; with `output_limit = "stop"` the
//! call is stopped.
//!
//! The bytes are written by a thread of their own that holds no capability
//! and the user's filesystem identity (setfsuid/setfsgid): the kernel then
//! enforces the user's disk quota on the output as on any of their writes
//! (root's CAP_SYS_RESOURCE would write past a full quota; security round
//! 3, item 7).

use std::io::Write;
use std::os::fd::OwnedFd;

use bollard::container::LogOutput;
use delegate_protocol::{STDERR, STDOUT};
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};

use crate::sandbox::engine;

/// Chunks in flight to the writer thread (the attach stream waits beyond).
const IN_FLIGHT: usize = 64;

/// Whose output it is: the writer thread takes this filesystem identity.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// Output pump result.
pub struct Pumped {
    pub error: Option<String>,
    /// Bytes dropped past `max_output`.
    pub dropped: u64,
}

pub type OutputStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// One output file; after the first write error it only counts what is lost.
struct Sink {
    file: std::fs::File,
    name: &'static str,
    ok: bool,
}

impl Sink {
    fn write(&mut self, bytes: &[u8], error: &mut Option<String>) {
        if !self.ok {
            return;
        }
        if let Err(e) = self.file.write_all(bytes) {
            self.ok = false;
            tracing::error!("cannot write {}: {e}", self.name);
            error.get_or_insert_with(|| format!("cannot write {}: {e}", self.name));
        }
    }
    fn finish(&mut self, error: &mut Option<String>) {
        if let Err(e) = self.file.flush().and_then(|()| self.file.sync_all()) {
            error.get_or_insert_with(|| format!("cannot save {}: {e}", self.name));
        }
    }
}

/// Takes `owner`'s filesystem identity and drops every capability, for
/// the calling thread only (both are per-thread in Linux).
fn become_owner(owner: Owner) -> Result<(), WriterError> {
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(owner.gid));
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(owner.uid));
    for set in [caps::CapSet::Effective, caps::CapSet::Permitted] {
        caps::clear(None, set).map_err(WriterError::Caps)?;
    }
    Ok(())
}

/// Why the output writer could not start as the student.
#[derive(Debug, thiserror::Error)]
enum WriterError {
    #[error("cannot drop the writer's capabilities: {0}")]
    Caps(caps::errors::CapsError),
    #[error("cannot start the output writer: {0}")]
    Thread(std::io::Error),
}

/// A chunk for the writer: whether it is stderr's, and its bytes.
type Chunk = (bool, Vec<u8>);
/// The writer's first error, when it is done.
type Done = oneshot::Receiver<Option<String>>;

/// The writer thread: chunks in, the first error out.
fn spawn_writer(owner: Owner, stdout: OwnedFd, stderr: OwnedFd) -> Result<(mpsc::Sender<Chunk>, Done), WriterError> {
    let (tx, mut rx) = mpsc::channel::<Chunk>(IN_FLIGHT);
    let (done_tx, done_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("output-writer".into())
        .spawn(move || {
            let mut error = become_owner(owner).err().map(|e| e.to_string());
            let mut out = Sink {
                file: stdout.into(),
                name: STDOUT,
                ok: error.is_none(),
            };
            let mut err = Sink {
                file: stderr.into(),
                name: STDERR,
                ok: error.is_none(),
            };
            while let Some((is_err, bytes)) = rx.blocking_recv() {
                let sink = if is_err { &mut err } else { &mut out };
                sink.write(&bytes, &mut error);
            }
            out.finish(&mut error);
            err.finish(&mut error);
            let _ = done_tx.send(error);
        })
        .map_err(WriterError::Thread)?;
    Ok((tx, done_rx))
}

/// Copies the attach stream to the output files as it arrives, written as
/// `owner`. `limit` is the site's `max_output` (0: none); `over` is set
/// once it is passed.
pub async fn pump(
    mut stream: OutputStream,
    owner: Owner,
    stdout: OwnedFd,
    stderr: OwnedFd,
    limit: u64,
    over: watch::Sender<bool>,
) -> Pumped {
    let (tx, done) = match spawn_writer(owner, stdout, stderr) {
        Ok(w) => w,
        Err(e) => {
            // Drain the stream anyway: the container never blocks on a pipe.
            while stream.next().await.is_some() {}
            return Pumped { error: Some(e.to_string()), dropped: 0 };
        }
    };
    let mut error: Option<String> = None;
    let mut written: u64 = 0;
    let mut dropped: u64 = 0;
    while let Some(item) = stream.next().await {
        let (is_err, message) = match item {
            Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => (false, message),
            Ok(LogOutput::StdErr { message }) => (true, message),
            Ok(LogOutput::StdIn { .. }) => continue,
            Err(e) => {
                error.get_or_insert_with(|| format!("the output stream broke: {}", engine::short_reason(&e)));
                break;
            }
        };
        let n = message.len() as u64;
        let room = if limit == 0 {
            n
        } else {
            limit.saturating_sub(written).min(n)
        };
        if room > 0 {
            // (the writer ended early only if it failed: it says why below)
            let _ = tx.send((is_err, message[..room as usize].to_vec())).await;
            written += room;
        }
        if room < n {
            if dropped == 0 {
                let _ = over.send(true);
            }
            dropped += n - room;
        }
    }
    drop(tx);
    let written_error = done.await.unwrap_or_else(|_| Some("the output writer ended abnormally".into()));
    Pumped { error: error.or(written_error), dropped }
}

//! The job's output files: created fresh in the job directory, then fed
//! from the container's attach stream chunk by chunk as it arrives.

use std::os::fd::{AsFd, OwnedFd};

use bollard::container::LogOutput;
use delegate_protocol::{STDERR, STDOUT};
use futures_util::StreamExt;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use tokio::io::AsyncWriteExt;

use crate::engine;
use crate::validate::JobDir;

/// Creates the output files; they must not exist.
pub fn create_output(dir: &JobDir, name: &str) -> Result<tokio::fs::File, String> {
    let fd: OwnedFd = openat(
        dir.fd.as_fd(),
        name,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| format!("cannot create {}: {e}", dir.path.join(name).display()))?;
    Ok(tokio::fs::File::from_std(std::fs::File::from(fd)))
}

/// Output pump result.
pub struct Pumped {
    pub error: Option<String>,
}

pub type OutputStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// One output file; after the first write error it only counts what is lost.
struct Sink {
    file: tokio::fs::File,
    name: &'static str,
    ok: bool,
}

impl Sink {
    async fn write(&mut self, bytes: &[u8], error: &mut Option<String>) {
        if !self.ok {
            return;
        }
        if let Err(e) = self.file.write_all(bytes).await {
            self.ok = false;
            tracing::error!("cannot write {}: {e}", self.name);
            error.get_or_insert_with(|| format!("cannot write {}: {e}", self.name));
        }
    }
    async fn finish(&mut self, error: &mut Option<String>) {
        let r = async {
            self.file.flush().await?;
            self.file.sync_all().await
        }
        .await;
        if let Err(e) = r {
            error.get_or_insert_with(|| format!("cannot save {}: {e}", self.name));
        }
    }
}

/// Copies the attach stream to the output files chunk by chunk, as it
/// arrives (never the whole output in memory).
pub async fn pump(mut stream: OutputStream, stdout: tokio::fs::File, stderr: tokio::fs::File) -> Pumped {
    let mut error: Option<String> = None;
    let mut out = Sink { file: stdout, name: STDOUT, ok: true };
    let mut err = Sink { file: stderr, name: STDERR, ok: true };
    while let Some(item) = stream.next().await {
        match item {
            Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                out.write(&message, &mut error).await
            }
            Ok(LogOutput::StdErr { message }) => err.write(&message, &mut error).await,
            Ok(LogOutput::StdIn { .. }) => {}
            Err(e) => {
                error.get_or_insert_with(|| format!("the output stream broke: {}", engine::short_reason(&e)));
                break;
            }
        }
    }
    out.finish(&mut error).await;
    err.finish(&mut error).await;
    Pumped { error }
}

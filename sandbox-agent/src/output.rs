//! The call's output: copied from the container's attach stream into the
//! `stdout` and `stderr` files the runner created (as the user) and passed
//! as descriptors, chunk by chunk, counting against the site's
//! `max_output`. Past it the rest is read and dropped (counted), so the
//! container never blocks on a full pipe; with `output_limit = "stop"` the
//! call is stopped.

use bollard::container::LogOutput;
use delegate_protocol::{STDERR, STDOUT};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::engine;

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

/// Copies the attach stream to the output files as it arrives. `limit` is
/// the site's `max_output` (0: none); `over` is set once it is passed.
pub async fn pump(
    mut stream: OutputStream,
    stdout: tokio::fs::File,
    stderr: tokio::fs::File,
    limit: u64,
    over: watch::Sender<bool>,
) -> Pumped {
    let mut error: Option<String> = None;
    let mut out = Sink { file: stdout, name: STDOUT, ok: true };
    let mut err = Sink { file: stderr, name: STDERR, ok: true };
    let mut written: u64 = 0;
    let mut dropped: u64 = 0;
    while let Some(item) = stream.next().await {
        let (sink, message) = match item {
            Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => (&mut out, message),
            Ok(LogOutput::StdErr { message }) => (&mut err, message),
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
            sink.write(&message[..room as usize], &mut error).await;
            written += room;
        }
        if room < n {
            if dropped == 0 {
                let _ = over.send(true);
            }
            dropped += n - room;
        }
    }
    out.finish(&mut error).await;
    err.finish(&mut error).await;
    Pumped { error, dropped }
}

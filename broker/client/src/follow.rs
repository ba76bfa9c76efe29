//! Following a job's output as it is written: both streams, until the job
//! is over. The CLI's `delegate logs --follow` and Python's
//! `delegate.logs(job, follow=True)` are this loop with a printer.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

use delegate_protocol::JobId;

use crate::status::JobStatus;
use crate::{Client, ClientError, Result, Stream, SLURM_INTERVAL};

/// The pause between two reads that found nothing new.
pub const FOLLOW_PAUSE: Duration = Duration::from_millis(200);

/// One stream being followed: its file once it exists, and how far it was read.
struct Followed {
    stream: Stream,
    file: Option<File>,
    pos: u64,
}

fn io_error(what: &str, source: std::io::Error) -> ClientError {
    ClientError::Io { what: what.to_owned(), source }
}

impl Client {
    /// Hands each new piece of job `id`'s stdout and stderr to `sink` as
    /// it is written, until the job is over (its outcome is written, or
    /// Slurm, asked every [`SLURM_INTERVAL`], says it ended) and all that
    /// was written before has been handed on; and an empty piece after
    /// each [`FOLLOW_PAUSE`] without news. `sink` returns false to stop at
    /// once (a closed pipe, an interrupt).
    pub fn follow_output(&self, id: &JobId, mut sink: impl FnMut(Stream, &[u8]) -> bool) -> Result<()> {
        // A clear error for a job that does not exist.
        self.status(std::slice::from_ref(id))?;
        let mut followed = [Stream::Stdout, Stream::Stderr].map(|stream| Followed { stream, file: None, pos: 0 });
        let mut last_check = Instant::now();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // Decided before the read, so everything written before the
            // outcome is handed on.
            let over = self.has_outcome(id)?
                || (last_check.elapsed() >= SLURM_INTERVAL && {
                    last_check = Instant::now();
                    self.status(std::slice::from_ref(id))?.iter().all(JobStatus::is_terminal)
                });
            let mut progressed = false;
            for f in followed.iter_mut() {
                match self.read_new(id, f, &mut buf, &mut sink)? {
                    Some(moved) => progressed |= moved,
                    None => return Ok(()),
                }
            }
            if over {
                return Ok(());
            }
            if !progressed {
                std::thread::sleep(FOLLOW_PAUSE);
                // An empty piece after each pause: a caller may stop (an
                // interrupt) while nothing is written.
                if !sink(Stream::Stdout, &[]) {
                    return Ok(());
                }
            }
        }
    }

    /// Hands what `f` gained since the last read to `sink`: whether there
    /// was anything, or None when `sink` asked to stop.
    fn read_new(
        &self,
        id: &JobId,
        f: &mut Followed,
        buf: &mut [u8],
        sink: &mut impl FnMut(Stream, &[u8]) -> bool,
    ) -> Result<Option<bool>> {
        if f.file.is_none() {
            f.file = self.open_output(id, f.stream)?;
        }
        let Some(file) = f.file.as_mut() else {
            return Ok(Some(false));
        };
        let what = format!("job {id}'s {}", f.stream.file_name());
        file.seek(SeekFrom::Start(f.pos)).map_err(|e| io_error(&what, e))?;
        let mut moved = false;
        loop {
            let n = file.read(buf).map_err(|e| io_error(&what, e))?;
            if n == 0 {
                return Ok(Some(moved));
            }
            f.pos += n as u64;
            moved = true;
            if !sink(f.stream, &buf[..n]) {
                return Ok(None);
            }
        }
    }
}

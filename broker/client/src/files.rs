//! Readers of a job's files: its output streams, its result and the
//! fingerprint of the machine it ran on.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use delegate_protocol::{
    self as protocol, exists_at, list_entries, open_regular_at, read_bounded_at, read_record_at, Fingerprint, JobId,
    ProtocolError, MAX_RESULT_BYTES,
};

use crate::client::optional;
use crate::{Client, ClientError, Result, Stream};

/// How long a file the job directory lists may stay unopenable. A network
/// filesystem's cached negative lookup (NFS's lookup cache, revalidated
/// within acdirmax, 60 s by default; FUSE's negative_timeout) hides a file
/// the server has when its name was looked up before it was written:
/// `delegate logs --follow` printed nothing of a job's output through such
/// a home (docs/robustness.md).
pub const STALE_LOOKUP_PATIENCE: Duration = Duration::from_secs(90);

/// The pause between two opens of a listed file that did not open.
const STALE_LOOKUP_PAUSE: Duration = Duration::from_millis(500);

/// `attempt` (a read or open of `name` in the directory `fd` at `dir`),
/// `None` while the file does not exist. A name the directory lists but
/// whose lookup fails is tried again until it succeeds or
/// [`STALE_LOOKUP_PATIENCE`] has passed.
pub(crate) fn when_listed<T>(
    fd: &OwnedFd,
    dir: &Path,
    name: &str,
    mut attempt: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    let deadline = Instant::now() + STALE_LOOKUP_PATIENCE;
    loop {
        if let Some(v) = attempt()? {
            return Ok(Some(v));
        }
        let listed = list_entries(fd, dir, 4096).is_ok_and(|names| names.iter().any(|n| n == name));
        if !listed {
            return Ok(None);
        }
        if Instant::now() >= deadline {
            return Err(ClientError::Protocol(ProtocolError::io(
                dir.join(name).display(),
                std::io::Error::other(format!(
                    "listed by its directory but not found for {} s (a network filesystem's stale cache?)",
                    STALE_LOOKUP_PATIENCE.as_secs()
                )),
            )));
        }
        tracing::debug!(dir = %dir.display(), name, "listed but not found yet (a stale lookup cache); trying again");
        std::thread::sleep(STALE_LOOKUP_PAUSE);
    }
}

impl Client {
    /// Opens a job's stdout or stderr file for streaming; `None` while it
    /// does not exist yet (see [`when_listed`]).
    pub fn open_output(&self, id: &JobId, stream: Stream) -> Result<Option<File>> {
        let (fd, dir) = (self.open_job_dir(id)?, self.job_dir(id));
        when_listed(&fd, &dir, stream.file_name(), || {
            Ok(open_regular_at(&fd, &dir, stream.file_name())?)
        })
    }

    /// Opens rank `rank`'s stdout or stderr of a multi-node job
    /// (`stdout.<rank>`); `None` while it does not exist.
    pub fn open_rank_output(&self, id: &JobId, stream: Stream, rank: u32) -> Result<Option<File>> {
        let fd = self.open_job_dir(id)?;
        Ok(open_regular_at(
            &fd,
            &self.job_dir(id),
            &protocol::rank_file(stream.file_name(), rank),
        )?)
    }

    /// Reads at most `limit` bytes of a job's stdout or stderr; `None` while
    /// it does not exist.
    pub fn read_output(&self, id: &JobId, stream: Stream, limit: u64) -> Result<Option<Vec<u8>>> {
        let (fd, dir) = (self.open_job_dir(id)?, self.job_dir(id));
        when_listed(&fd, &dir, stream.file_name(), || {
            Ok(optional(read_bounded_at(&fd, &dir, stream.file_name(), limit, None))?)
        })
    }

    /// The `result` file (a pickled return value or exception), bounded by
    /// [`MAX_RESULT_BYTES`]; `None` when the job wrote none.
    pub fn read_result(&self, id: &JobId) -> Result<Option<Vec<u8>>> {
        let (fd, dir) = (self.open_job_dir(id)?, self.job_dir(id));
        when_listed(&fd, &dir, protocol::RESULT, || {
            Ok(optional(read_bounded_at(&fd, &dir, protocol::RESULT, MAX_RESULT_BYTES, None))?)
        })
    }

    /// Rank `rank`'s `result.<rank>` of a multi-node Python call, bounded
    /// like [`Client::read_result`]; `None` when that rank wrote none.
    pub fn read_rank_result(&self, id: &JobId, rank: u32) -> Result<Option<Vec<u8>>> {
        let fd = self.open_job_dir(id)?;
        Ok(optional(read_bounded_at(
            &fd,
            &self.job_dir(id),
            &protocol::rank_file(protocol::RESULT, rank),
            MAX_RESULT_BYTES,
            None,
        ))?)
    }

    /// The machine the call ran on, as the worker's agent recorded it
    /// (`fingerprint`); `None` before the call ended or when the worker
    /// recorded none. A file that does not decode is an error. Only a call
    /// that started has one: a job that never ran (held, then cancelled)
    /// shows none, whatever file stands under that name.
    /// Both files are looked up again while listed (see [`when_listed`]):
    /// the worker writes them, and a caching home may still hide them.
    pub fn fingerprint(&self, id: &JobId) -> Result<Option<Fingerprint>> {
        let (fd, dir) = (self.open_job_dir(id)?, self.job_dir(id));
        let started = when_listed(&fd, &dir, protocol::STARTED, || {
            Ok(exists_at(&fd, protocol::STARTED).then_some(()))
        })?;
        if started.is_none() {
            return Ok(None);
        }
        when_listed(&fd, &dir, protocol::FINGERPRINT, || {
            Ok(optional(read_record_at(&fd, &dir, None))?)
        })
    }

    /// The `repeats` file of `delegate submit --repeat` (the sandbox's
    /// timer writes it: untrusted JSON), bounded; `None` when absent.
    pub fn read_repeats(&self, id: &JobId) -> Result<Option<Vec<u8>>> {
        let (fd, dir) = (self.open_job_dir(id)?, self.job_dir(id));
        when_listed(&fd, &dir, protocol::REPEATS, || {
            Ok(optional(read_bounded_at(
                &fd,
                &dir,
                protocol::REPEATS,
                protocol::MAX_REPEATS_BYTES,
                None,
            ))?)
        })
    }

    /// True when the job's outcome file exists.
    pub fn has_outcome(&self, id: &JobId) -> Result<bool> {
        let fd = self.open_job_dir(id)?;
        Ok(exists_at(&fd, protocol::OUTCOME))
    }
}

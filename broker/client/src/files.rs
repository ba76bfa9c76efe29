//! Readers of a job's files: its output streams, its result and the
//! fingerprint of the machine it ran on.

use std::fs::File;

use delegate_protocol::{
    self as protocol, exists_at, open_regular_at, read_bounded_at, read_record_at, Fingerprint, JobId, MAX_RESULT_BYTES,
};

use crate::client::optional;
use crate::{Client, Result, Stream};

impl Client {
    /// Opens a job's stdout or stderr file for streaming; `None` while it
    /// does not exist yet.
    pub fn open_output(&self, id: &JobId, stream: Stream) -> Result<Option<File>> {
        let fd = self.open_job_dir(id)?;
        Ok(open_regular_at(&fd, &self.job_dir(id), stream.file_name())?)
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
        let fd = self.open_job_dir(id)?;
        Ok(optional(read_bounded_at(
            &fd,
            &self.job_dir(id),
            stream.file_name(),
            limit,
            None,
        ))?)
    }

    /// The `result` file (a pickled return value or exception), bounded by
    /// [`MAX_RESULT_BYTES`]; `None` when the job wrote none.
    pub fn read_result(&self, id: &JobId) -> Result<Option<Vec<u8>>> {
        let fd = self.open_job_dir(id)?;
        Ok(optional(read_bounded_at(
            &fd,
            &self.job_dir(id),
            protocol::RESULT,
            MAX_RESULT_BYTES,
            None,
        ))?)
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
    pub fn fingerprint(&self, id: &JobId) -> Result<Option<Fingerprint>> {
        let fd = self.open_job_dir(id)?;
        if !exists_at(&fd, protocol::STARTED) {
            return Ok(None);
        }
        Ok(optional(read_record_at(&fd, &self.job_dir(id), None))?)
    }

    /// The `repeats` file of `delegate submit --repeat` (the sandbox's
    /// timer writes it: untrusted JSON), bounded; `None` when absent.
    pub fn read_repeats(&self, id: &JobId) -> Result<Option<Vec<u8>>> {
        let fd = self.open_job_dir(id)?;
        Ok(optional(read_bounded_at(
            &fd,
            &self.job_dir(id),
            protocol::REPEATS,
            protocol::MAX_REPEATS_BYTES,
            None,
        ))?)
    }

    /// True when the job's outcome file exists.
    pub fn has_outcome(&self, id: &JobId) -> Result<bool> {
        let fd = self.open_job_dir(id)?;
        Ok(exists_at(&fd, protocol::OUTCOME))
    }
}

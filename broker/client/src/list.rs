//! Listing the jobs of a delegate root.

use delegate_protocol::{list_entries, JobId};
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, SFlag};

use crate::{Client, JobStatus, Result};

const MAX_JOBS_LISTED: usize = 100_000;

impl Client {
    /// The ids of all job directories in the root, oldest first.
    pub fn job_ids(&self) -> Result<Vec<JobId>> {
        let names = list_entries(&self.root_fd, &self.root, MAX_JOBS_LISTED)?;
        let mut ids: Vec<JobId> = names
            .iter()
            .filter_map(|n| JobId::parse(n).ok())
            .filter(|id| {
                fstatat(&self.root_fd, id.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// All jobs in the root, oldest first; unreadable directories are
    /// skipped with a warning.
    pub fn list(&self) -> Result<Vec<JobStatus>> {
        let mut jobs = Vec::new();
        for id in self.job_ids()? {
            match self.load(&id) {
                Ok(j) => jobs.push(j),
                Err(e) => tracing::warn!(job = %id, error = %e, "skipping an unreadable job directory"),
            }
        }
        self.reconcile(&mut jobs, true)
    }
}

//! Reading one job directory once ([`JobFiles`]) and the tail of Slurm's
//! log of its batch script.

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use delegate_protocol::attempt::{read_attempts, Attempt};
use delegate_protocol::claim::{Claim, MAX_CLAIM_BYTES};
use delegate_protocol::{
    self as protocol, exists_at, now_ms, open_regular_at, read_bounded_at, read_record_at, JobId, Outcome, Spec,
    Started,
};
use nix::sys::stat::fstat;

use crate::client::optional;
use crate::state::{scan_log, LogFacts};
use crate::{Client, ClientError, Result};

/// How much of the end of Slurm's log of a job is read.
pub const LOG_TAIL_BYTES: u64 = 64 * 1024;
const MAX_SLURM_ID_BYTES: u64 = 64;

/// The files of one job directory, read once.
pub(crate) struct JobFiles {
    pub(crate) id: JobId,
    pub(crate) dir: PathBuf,
    /// `None` when the directory cannot be opened safely (a symlink, another
    /// owner, no permission): `unreadable` says why.
    pub(crate) fd: Option<OwnedFd>,
    pub(crate) unreadable: Option<String>,
    pub(crate) slurm_id: Option<String>,
    /// Calls of the allocation this call runs in, when it shares one.
    pub(crate) shared: Option<u32>,
    /// The allocation of its map that claimed it (`123_4`), once one did.
    pub(crate) claimed_by: Option<String>,
    pub(crate) started: Option<Started>,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) cancel: bool,
    /// Why, when the marker says (a map's dropped calls).
    pub(crate) cancel_reason: Option<String>,
    pub(crate) created_ms: u64,
    /// The call's earlier attempts, lost with their nodes.
    pub(crate) attempts: Vec<Attempt>,
    /// The call may still run again when this attempt is lost.
    pub(crate) run_again: bool,
    /// A spec could be read.
    pub(crate) has_spec: bool,
}

impl JobFiles {
    /// A job whose directory cannot be opened safely (`why`).
    fn unreadable(id: &JobId, dir: PathBuf, why: String) -> JobFiles {
        JobFiles {
            id: id.clone(),
            dir,
            fd: None,
            unreadable: Some(why),
            slurm_id: None,
            shared: None,
            claimed_by: None,
            started: None,
            outcome: None,
            cancel: false,
            cancel_reason: None,
            created_ms: now_ms(),
            attempts: Vec::new(),
            run_again: false,
            has_spec: false,
        }
    }

    /// The `started` record is that of an attempt `attempts` lists as lost
    /// (the newer attempt's record not visible yet).
    pub(crate) fn start_recorded_lost(&self) -> bool {
        self.started
            .as_ref()
            .is_some_and(|s| self.attempts.iter().any(|a| a.node == s.host && a.started_ms == s.started_ms))
    }
}

/// The most names of a job directory [`listing`] reads (a call may write
/// many files into its directory).
const MAX_LISTED: usize = 4096;

/// The names in a job directory, read from its filesystem (getdents).
/// Through a network home's client caches, a name looked up before it
/// existed stays absent for the cache's negative-lookup time (30 s on the
/// worker machines' GlusterFS home): a reader polling for `outcome` saw
/// each result that late. Listing the directory before the lookups makes
/// that cache look again (tried on that home: a new file seen at once
/// instead of 28 s later). The names are not used to skip lookups: a home
/// may cache listings too (sshfs's `dir_cache`, NFS), longer than lookups.
/// `None`: the directory could not be listed, or lists too many names.
fn listing(dir: &OwnedFd) -> Option<std::collections::HashSet<String>> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut d = nix::dir::Dir::openat(dir, ".", flags, nix::sys::stat::Mode::empty()).ok()?;
    let mut names = std::collections::HashSet::new();
    for entry in d.iter() {
        let name = entry.ok()?.file_name().to_string_lossy().into_owned();
        if names.len() == MAX_LISTED {
            return None;
        }
        names.insert(name);
    }
    Some(names)
}

impl Client {
    pub(crate) fn load(&self, id: &JobId) -> Result<JobFiles> {
        let dir = self.job_dir(id);
        let fd = match self.open_job_dir(id) {
            Ok(fd) => fd,
            // The directory exists but cannot be opened safely: the runner
            // refuses such a job too, and says so in the Slurm log beside
            // the directory.
            Err(ClientError::Protocol(e)) => return Ok(JobFiles::unreadable(id, dir, e.to_string())),
            Err(e) => return Err(e),
        };
        // (the listing refreshes a network home's cache of these names)
        let _ = listing(&fd);
        // A damaged spec does not hide the job's state: the runner reports
        // on it in the outcome.
        let spec: Option<Spec> = match optional(read_record_at(&fd, &dir, None)) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "cannot read the spec");
                None
            }
        };
        let (slurm_id, shared) = match optional(read_bounded_at(
            &fd,
            &dir,
            protocol::SLURM_ID,
            MAX_SLURM_ID_BYTES,
            None,
        ))? {
            None => (None, None),
            Some(b) => match protocol::parse_slurm_id(&String::from_utf8_lossy(&b)) {
                Some((sid, shared)) => (Some(sid), shared),
                None => {
                    tracing::warn!(job = %id, content = %String::from_utf8_lossy(&b), "ignoring a slurm-id file that holds no job id");
                    (None, None)
                }
            },
        };
        let started: Option<Started> = optional(read_record_at(&fd, &dir, None))?;
        let outcome: Option<Outcome> = optional(read_record_at(&fd, &dir, None))?;
        // (only a map's call still without an outcome asks Slurm about it)
        let claimed_by = match (shared, &outcome) {
            (Some(_), None) => optional(read_bounded_at(&fd, &dir, protocol::CLAIM, MAX_CLAIM_BYTES, None))?
                .and_then(|b| Claim::parse(&String::from_utf8_lossy(&b)))
                .map(|c| c.allocation),
            _ => None,
        };
        let cancel = exists_at(&fd, protocol::CANCEL);
        let cancel_reason = if cancel {
            protocol::cancel::read_cancel_reason(&fd, &dir)
        } else {
            None
        };
        let created_ms = match &spec {
            Some(s) => s.created_ms,
            None => fstat(&fd)
                .map(|st| (st.st_mtime.max(0) as u64) * 1000)
                .unwrap_or_else(|_| now_ms()),
        };
        let attempts = read_attempts(&fd, &dir, None);
        let retries = spec.as_ref().map_or(0, |s| s.resources.retries);
        let run_again = (attempts.len() as u64) < u64::from(retries);
        Ok(JobFiles {
            has_spec: spec.is_some(),
            attempts,
            run_again,
            id: id.clone(),
            dir,
            fd: Some(fd),
            unreadable: None,
            slurm_id,
            shared,
            claimed_by,
            started,
            outcome,
            cancel,
            cancel_reason,
            created_ms,
        })
    }

    /// The last [`LOG_TAIL_BYTES`] of Slurm's log of the job, if any.
    pub(crate) fn log_facts(&self, id: &JobId) -> LogFacts {
        let mut f = match open_regular_at(&self.root_fd, &self.root, &format!("{id}.log")) {
            Ok(Some(f)) => f,
            _ => return LogFacts::default(),
        };
        let len = f.seek(SeekFrom::End(0)).unwrap_or(0);
        let age_secs = f
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .map(|t| std::time::SystemTime::now().duration_since(t).map_or(0, |d| d.as_secs()));
        let start = len.saturating_sub(LOG_TAIL_BYTES);
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(start)).is_err() || f.take(LOG_TAIL_BYTES).read_to_end(&mut buf).is_err() {
            return LogFacts::default();
        }
        let text = String::from_utf8_lossy(&buf);
        // Drop a partial first line when the tail starts mid-file.
        let text = if start > 0 {
            text.split_once('\n').map(|(_, rest)| rest).unwrap_or("")
        } else {
            &text
        };
        LogFacts { age_secs, ..scan_log(text) }
    }
}

#[cfg(test)]
mod tests {
    use super::{listing, MAX_LISTED};

    fn dir_fd(p: &std::path::Path) -> std::os::fd::OwnedFd {
        std::fs::File::open(p).expect("open the directory").into()
    }

    #[test]
    fn a_listing_names_what_is_there_and_gives_up_past_its_bound() {
        let d = tempfile::tempdir().expect("tempdir");
        for n in ["spec", "started"] {
            std::fs::write(d.path().join(n), b"x").expect("write");
        }
        let names = listing(&dir_fd(d.path())).expect("listed");
        assert!(names.contains("spec") && names.contains("started"), "{names:?}");
        assert!(!names.contains("outcome"), "{names:?}");
        // (a call may fill its directory: then names are looked up directly)
        for i in 0..MAX_LISTED {
            std::fs::write(d.path().join(format!("f{i}")), b"").expect("write");
        }
        assert_eq!(listing(&dir_fd(d.path())), None);
    }
}

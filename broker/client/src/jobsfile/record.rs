//! The record of a jobs file's last submission: which job ids each of its
//! jobs got. Kept under the delegate root in `.jobs-files/` (a name no job
//! id can take, so listings skip it), one small JSON file per jobs file,
//! named by a hash of the jobs file's canonical path; the path is stored
//! inside too, and checked on load.

use std::path::{Path, PathBuf};

use delegate_protocol::{atomic_write_at, now_ms, open_dir_nofollow, read_bounded_at, JobId};
use nix::errno::Errno;
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

use super::Submitted;
use crate::{Client, ClientError, Result};

/// The directory of the records, inside the delegate root.
pub const RECORDS_DIR: &str = ".jobs-files";
const MAX_RECORD_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The jobs file's canonical path.
    pub path: PathBuf,
    pub submitted_ms: u64,
    /// Each job's name and its calls' ids, in file order.
    pub jobs: Vec<(String, Vec<JobId>)>,
}

impl Record {
    pub fn new(path: &Path, submitted: &Submitted) -> Record {
        Record {
            path: path.to_path_buf(),
            submitted_ms: now_ms(),
            jobs: submitted
                .iter()
                .map(|(n, hs)| (n.clone(), hs.iter().map(|h| h.id.clone()).collect()))
                .collect(),
        }
    }

    /// Every call's id, in file order.
    pub fn ids(&self) -> Vec<JobId> {
        self.jobs.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect()
    }

    pub(crate) fn save(&self, client: &Client) -> Result<()> {
        let dir = client.root().join(RECORDS_DIR);
        match nix::sys::stat::mkdirat(&client.root_fd, RECORDS_DIR, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => {
                return Err(ClientError::Io {
                    what: format!("cannot create {}", dir.display()),
                    source: e.into(),
                })
            }
        }
        let fd = open_dir_nofollow(&dir)?;
        let bytes = serde_json::to_vec(self).map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        atomic_write_at(&fd, &dir, &name_for(&self.path), &bytes, 0o600)?;
        Ok(())
    }

    pub(crate) fn load(client: &Client, path: &Path) -> Result<Record> {
        let canonical = std::fs::canonicalize(path).map_err(|e| ClientError::Io {
            what: format!("cannot read {}", path.display()),
            source: e,
        })?;
        let dir = client.root().join(RECORDS_DIR);
        let none =
            || ClientError::InvalidRequest(format!("{} has not been submitted (delegate submit -f)", path.display()));
        let fd = open_dir_nofollow(&dir).map_err(|_| none())?;
        let bytes = read_bounded_at(&fd, &dir, &name_for(&canonical), MAX_RECORD_BYTES, Some(client.uid))
            .map_err(|_| none())?;
        let rec: Record = serde_json::from_slice(&bytes).map_err(|e| {
            ClientError::InvalidRequest(format!("the record of {} is damaged ({e}); submit it again", path.display()))
        })?;
        if rec.path != canonical {
            return Err(none());
        }
        Ok(rec)
    }
}

/// The record's file name: FNV-1a (64 bit) of the canonical path, in hex.
/// Not a security boundary (the record sits in the student's own root and
/// names its path); only a short, stable name.
fn name_for(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_distinct() {
        assert_eq!(name_for(Path::new("/a/jobs.yml")), name_for(Path::new("/a/jobs.yml")));
        assert_ne!(name_for(Path::new("/a/jobs.yml")), name_for(Path::new("/b/jobs.yml")));
        assert!(name_for(Path::new("/x")).ends_with(".json"));
    }
}

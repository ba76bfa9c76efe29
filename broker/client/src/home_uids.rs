//! Whether the delegate root's filesystem keeps this user's uid, as the
//! job-directory protocol needs (the runner refuses a job directory owned by
//! another uid): a file written here now, and the `started` record the
//! runner wrote on a worker for the newest job that has one, must show this
//! process's uid. A home exported with squashed or remapped uids, or workers
//! whose uids differ from this node's, fail here. `delegate doctor` and
//! `build_cluster.sh test` ask it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use delegate_protocol::layout::STARTED;

use crate::Client;

/// How many job directories are looked at for the newest `started`.
const MAX_JOBS_SCANNED: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum HomeUidError {
    #[error("cannot write a probe file in {path}: {source}")]
    Probe { path: PathBuf, source: std::io::Error },
    #[error("a file written here shows uid {seen}, not this user's {uid}: the home's server squashes or remaps uids (export it without all_squash or anonuid, with this node's uids)")]
    Squashed { seen: u32, uid: u32 },
    #[error("job {job}'s start record, written on its worker as this user, shows uid {seen} here, not {uid}: that worker has another uid for this account, or the home's server remaps it")]
    Worker { job: String, seen: u32, uid: u32 },
}

impl Client {
    /// What was seen, or the first mismatch.
    pub fn check_home_uids(&self) -> Result<String, HomeUidError> {
        let uid = nix::unistd::geteuid().as_raw();
        let probe = self.root().join(format!(".uid-probe-{}", std::process::id()));
        let seen = std::fs::write(&probe, b"uid")
            .and_then(|()| std::fs::metadata(&probe))
            .map(|m| m.uid());
        let _ = std::fs::remove_file(&probe);
        let seen = seen.map_err(|source| HomeUidError::Probe { path: self.root().to_owned(), source })?;
        if seen != uid {
            return Err(HomeUidError::Squashed { seen, uid });
        }
        match newest_started(self.root()) {
            Some((job, seen)) if seen != uid => Err(HomeUidError::Worker { job, seen, uid }),
            Some((job, _)) => Ok(format!(
                "files written here and on job {job}'s worker show uid {uid} (not squashed, the same on the workers)"
            )),
            None => Ok(format!(
                "files written here show uid {uid} (no job has run yet to compare a worker's)"
            )),
        }
    }
}

/// The newest job directory (by name: ids begin with their time) with a
/// `started` record, and that record's owner.
fn newest_started(root: &Path) -> Option<(String, u32)> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && !n.ends_with(".log"))
        .take(MAX_JOBS_SCANNED)
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    names.into_iter().find_map(|n| {
        let m = std::fs::symlink_metadata(root.join(&n).join(STARTED)).ok()?;
        m.is_file().then(|| (n, m.uid()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_started_record_is_found() {
        let d = tempfile::tempdir().unwrap();
        for (job, started) in [
            ("20261101T000000-aa", true),
            ("20261102T000000-bb", true),
            ("20261103T000000-cc", false),
        ] {
            std::fs::create_dir(d.path().join(job)).unwrap();
            if started {
                std::fs::write(d.path().join(job).join(STARTED), b"x").unwrap();
            }
        }
        std::fs::write(d.path().join("20261104T000000-dd.log"), b"log").unwrap();
        let (job, uid) = newest_started(d.path()).unwrap();
        assert_eq!(job, "20261102T000000-bb");
        assert_eq!(uid, nix::unistd::geteuid().as_raw());
    }
}

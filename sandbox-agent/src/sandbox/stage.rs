//! The staging mount: the checked job directory, pinned by its descriptor
//! at a root-owned path (`<staging_dir>/<slurm job>`), the only path the
//! engine is given. `mount(2)` follows `/proc/self/fd/N` to the inode the
//! runner opened with `O_NOFOLLOW`; renaming anything under the user's home
//! afterwards changes nothing.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use delegate_protocol::policy::Policy;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

pub struct Staged {
    local: PathBuf,
    engine: PathBuf,
}

/// Unmounts and removes a staging entry (a leftover or our own).
fn clear(path: &Path) {
    let _ = umount2(path, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(path);
}

/// Creates the root-owned staging directory and removes leftovers of an
/// earlier agent (called at start).
pub fn prepare(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        tracing::warn!("removing a leftover staging mount {}", p.display());
        clear(&p);
    }
    Ok(())
}

/// Why the job directory could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{}: {source}", path.display())]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("bind mount onto {}: {source}", path.display())]
    Mount { path: PathBuf, source: nix::Error },
}

impl Staged {
    pub fn new(policy: &Policy, slurm_job: &str, dir: &OwnedFd) -> Result<Staged, StageError> {
        use std::os::unix::fs::DirBuilderExt;
        prepare_once(&policy.staging_dir)?;
        let local = policy.staging_dir.join(slurm_job);
        if local.exists() {
            clear(&local);
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&local)
            .map_err(|source| StageError::Dir { path: local.clone(), source })?;
        let source = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        if let Err(e) = mount(Some(&source), &local, None::<&str>, MsFlags::MS_BIND, None::<&str>) {
            let _ = std::fs::remove_dir(&local);
            return Err(StageError::Mount { path: local, source: e });
        }
        let engine_root = if policy.staging_host_dir.as_os_str().is_empty() {
            &policy.staging_dir
        } else {
            &policy.staging_host_dir
        };
        Ok(Staged {
            engine: engine_root.join(slurm_job),
            local,
        })
    }

    /// The path the engine is given.
    pub fn engine_path(&self) -> PathBuf {
        self.engine.clone()
    }
}

fn prepare_once(dir: &Path) -> Result<(), StageError> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| StageError::Dir { path: dir.to_path_buf(), source })
}

impl Drop for Staged {
    fn drop(&mut self) {
        clear(&self.local);
    }
}

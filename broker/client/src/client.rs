//! The [`Client`]: a delegate root opened safely, and the paths of its jobs.
//! Its operations are split by what they do, each in its own module
//! (`impl Client` blocks in submit.rs, load.rs, reconcile.rs, list.rs,
//! wait.rs, cancel.rs and files.rs).

use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use delegate_protocol::{check_owner, open_dir_nofollow, JobId, ProtocolError};

use crate::{ClientError, Config, Result};

pub struct Client {
    pub(crate) config: Config,
    pub(crate) root: PathBuf,
    pub(crate) root_fd: OwnedFd,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// `Ok(None)` for a file that does not exist.
pub(crate) fn optional<T>(r: Result<T, ProtocolError>) -> Result<Option<T>, ProtocolError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Waiting for (or cancelling) N jobs holds one descriptor per job
/// directory, twice over while a round re-reads them: a student's 1,000
/// futures exceed the usual soft limit of 1,024, and a job directory that
/// cannot be opened for EMFILE would look unreadable. Raise the soft limit
/// of open files to the hard limit (capped at 65,536), once per process.
fn raise_nofile_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit only read/write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                let want = lim.rlim_max.min(65_536);
                if lim.rlim_cur < want {
                    lim.rlim_cur = want;
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        tracing::debug!("could not raise the open-files limit");
                    }
                }
            }
        }
    });
}

impl Client {
    /// A client configured from the environment ([`Config::from_env`]).
    pub fn from_env() -> Result<Client> {
        Client::new(Config::from_env()?)
    }

    /// Creates the root (mode 0700, parents too) if needed and opens it. The
    /// root is used by its canonical path, which is what the runner is given.
    pub fn new(config: Config) -> Result<Client> {
        let shown = config.root.display().to_string();
        let root_err = |reason: String| ClientError::Root { path: shown.clone(), reason };
        if !config.root.is_absolute() {
            return Err(root_err("it is not an absolute path".into()));
        }
        // Refused before anything is created; the canonical path is checked
        // again below (a symlink on the way may lead elsewhere).
        crate::config::check_root_path(&config.root).map_err(root_err)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.root)
            .map_err(|e| root_err(e.to_string()))?;
        let root = std::fs::canonicalize(&config.root).map_err(|e| root_err(e.to_string()))?;
        // The batch scripts name job directories below the root, and the
        // cluster's job gate accepts only a small set of bytes in them.
        crate::config::check_root_path(&root)
            .map_err(|reason| ClientError::Root { path: root.display().to_string(), reason })?;
        let root_fd = open_dir_nofollow(&root).map_err(|e| root_err(e.to_string()))?;
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        check_owner(&root_fd, &root.display().to_string(), uid, true).map_err(|e| root_err(e.to_string()))?;
        raise_nofile_limit();
        tracing::debug!(root = %root.display(), uid, "client ready");
        Ok(Client { config, root, root_fd, uid, gid })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The canonical delegate root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn job_dir(&self, id: &JobId) -> PathBuf {
        self.root.join(id.as_str())
    }

    /// Slurm's log of the job's batch script, beside its directory.
    pub fn log_path(&self, id: &JobId) -> PathBuf {
        self.root.join(format!("{id}.log"))
    }

    /// The directory of one of the caller's own jobs: a job of this root
    /// (its status answers) whose directory, opened without following a
    /// link, is a directory the caller owns. What reads a job as the caller
    /// for someone else (the TensorBoard route of their hub server, `delegate
    /// tensorboard`) asks this first: any other id, a name in a root the
    /// caller cannot read included, is `NotYours`.
    pub fn own_job_dir(&self, id: &JobId) -> Result<PathBuf> {
        self.status(std::slice::from_ref(id))?;
        let dir = self.job_dir(id);
        let not_yours = || ClientError::NotYours {
            id: id.to_string(),
            root: self.root.display().to_string(),
        };
        let fd = open_dir_nofollow(&dir).map_err(|_| not_yours())?;
        check_owner(&fd, &dir.display().to_string(), nix::unistd::getuid().as_raw(), true).map_err(|_| not_yours())?;
        Ok(dir)
    }

    pub(crate) fn open_job_dir(&self, id: &JobId) -> Result<OwnedFd> {
        let dir = self.job_dir(id);
        match open_dir_nofollow(&dir) {
            Ok(fd) => Ok(fd),
            Err(e) if e.is_not_found() => Err(ClientError::NoSuchJob {
                id: id.to_string(),
                root: self.root.display().to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }
}

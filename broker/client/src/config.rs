//! Where the client keeps jobs and how it submits them, from the environment.

use std::path::PathBuf;

use crate::slurm::Slurm;
use crate::{ClientError, Result};

/// Environment variable naming the delegate root.
pub const ROOT_ENV: &str = "DELEGATE_ROOT";
/// Environment variable lowering the number of calls per shared allocation.
pub const CALLS_PER_ALLOCATION_ENV: &str = "DELEGATE_CALLS_PER_ALLOCATION";
/// Environment variable naming the runner the batch script executes.
pub const RUNNER_ENV: &str = "DELEGATE_RUNNER";
pub const DEFAULT_RUNNER: &str = "/usr/local/bin/sandbox-runner";

/// Where the client keeps jobs and how it submits them.
#[derive(Clone, Debug)]
pub struct Config {
    /// The delegate root: job directories live in it.
    pub root: PathBuf,
    /// The runner executed by the batch script on the worker.
    pub runner: PathBuf,
    pub slurm: Slurm,
    /// At most this many calls per shared allocation, below the site
    /// policy's `calls_per_allocation` (`$DELEGATE_CALLS_PER_ALLOCATION`;
    /// `1`: one Slurm job per call). `None`: the policy's value.
    pub calls_per_allocation: Option<u32>,
}

impl Config {
    /// Root from `$DELEGATE_ROOT` (default `~/.delegate/jobs`), runner from
    /// `$DELEGATE_RUNNER`, partition from `$DELEGATE_PARTITION`.
    pub fn from_env() -> Result<Config> {
        let root = match std::env::var_os(ROOT_ENV).filter(|v| !v.is_empty()) {
            Some(r) => PathBuf::from(r),
            None => default_root()?,
        };
        let runner = std::env::var_os(RUNNER_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNNER));
        let calls_per_allocation = match std::env::var(CALLS_PER_ALLOCATION_ENV) {
            Ok(v) if !v.trim().is_empty() => match v.trim().parse::<u32>() {
                Ok(n) if n >= 1 => Some(n),
                _ => {
                    return Err(ClientError::InvalidRequest(format!(
                        "${CALLS_PER_ALLOCATION_ENV} must be a whole number of at least 1, not {v:?}"
                    )))
                }
            },
            _ => None,
        };
        Ok(Config {
            root,
            runner,
            slurm: Slurm::from_env(),
            calls_per_allocation,
        })
    }
}

/// The user's home: `$HOME` when set to an absolute path, else the passwd
/// entry of the real uid.
pub fn home_dir() -> Result<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").map(PathBuf::from) {
        if h.is_absolute() {
            return Ok(h);
        }
    }
    let uid = nix::unistd::getuid().as_raw();
    uzers::get_user_by_uid(uid)
        .map(|u| uzers::os::unix::UserExt::home_dir(&u).to_path_buf())
        .filter(|h| h.is_absolute())
        .ok_or(ClientError::NoHome(uid))
}

/// `~/.delegate/jobs`.
pub fn default_root() -> Result<PathBuf> {
    Ok(home_dir()?.join(".delegate").join("jobs"))
}

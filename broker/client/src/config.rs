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
    /// `$DELEGATE_RUNNER` (else the site policy's `runner`), partition from `$DELEGATE_PARTITION` (else the
    /// site policy's first `partitions` entry, else Slurm's default).
    pub fn from_env() -> Result<Config> {
        let root = match std::env::var_os(ROOT_ENV).filter(|v| !v.is_empty()) {
            Some(r) => PathBuf::from(r),
            None => default_root()?,
        };
        // The site policy's runner and partition, unless the environment names them.
        let policy = delegate_protocol::policy::Policy::load_for_client().ok();
        let runner = std::env::var_os(RUNNER_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| policy.as_ref().map(|p| p.runner.clone()))
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
        let mut slurm = Slurm::from_env();
        if slurm.partition.is_none() {
            // On a shared cluster, delegate's own partition (the policy's).
            slurm.partition = policy.and_then(|p| p.partitions.into_iter().next());
        }
        Ok(Config {
            root,
            runner,
            slurm,
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

/// The bytes a job directory's path may hold: the set the cluster's job gate
/// (`slurm-conf/job_submit.lua`, `safe_path`) accepts in a batch script.
pub const ROOT_PATH_BYTES: &str = "A-Z a-z 0-9 . _ / + @ = , : -";

fn root_path_byte_ok(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._/+@=,:-".contains(&b)
}

/// Checks that a (canonical) delegate root can be named in a batch script
/// the cluster's job gate accepts: only [`ROOT_PATH_BYTES`]. Anything else (a
/// quote, a space, a newline, `$`, non-ASCII) would make slurmctld refuse
/// every job; the reason names the byte and what to do.
pub fn check_root_path(root: &std::path::Path) -> std::result::Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = root.as_os_str().as_bytes();
    match bytes.iter().position(|&b| !root_path_byte_ok(b)) {
        None => Ok(()),
        Some(i) => {
            let b = bytes[i];
            let shown = if b.is_ascii_graphic() {
                format!(" ({})", b as char)
            } else {
                String::new()
            };
            Err(format!(
                "its path holds the byte 0x{b:02x}{shown} at offset {i}; this cluster only runs job \
                 directories whose paths are made of {ROOT_PATH_BYTES}: set ${ROOT_ENV} to such a \
                 directory below your home"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn root_paths_the_job_gate_accepts() {
        for ok in [
            "/home/alice/.delegate/jobs",
            "/srv/delegate-stack/home/dlg-test1/.delegate/jobs",
            "/h/a+b@c=d,e:f-g_h.i",
        ] {
            assert_eq!(check_root_path(Path::new(ok)), Ok(()), "{ok}");
        }
        for (bad, byte) in [
            ("/home/o'k/.delegate/jobs", "0x27"),
            ("/home/a b/jobs", "0x20"),
            ("/home/a\nb/jobs", "0x0a"),
            ("/home/$x/jobs", "0x24 ($)"),
            ("/home/\u{e9}t\u{e9}/jobs", "0xc3"),
            ("/home/a\\b", "0x5c"),
            ("/home/*/jobs", "0x2a"),
        ] {
            let e = check_root_path(Path::new(bad)).unwrap_err();
            assert!(
                e.contains(byte) && e.contains(ROOT_ENV) && e.contains(ROOT_PATH_BYTES),
                "{bad}: {e}"
            );
        }
    }
}

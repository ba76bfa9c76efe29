//! The checks of a run request before anything is made: the descriptors'
//! types and owners, the policy, the job directory's path and spec, and
//! the allocation's age.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

use delegate_protocol::agent::{Answer, RunRequest};
use delegate_protocol::policy::Policy;
use delegate_protocol::{check_clean_absolute, JobId};
use nix::sys::stat::{fstat, SFlag};

use crate::caller::ident::Caller;

use super::load_policy;

/// Why an allocation may not start a call: it is older than the site's
/// max_allocation_time, `bound` seconds (security round 4, item 2: a
/// shared allocation whose limit was raised held its node for hours while
/// another student waited). Every call is checked, not only a
/// connection's later ones (a runner connects again after a refusal); a
/// job's first call starts as its batch task does. None: it may.
pub(super) fn past_allocation_bound(caller: &Caller, bound: u64) -> Option<String> {
    let age = caller.age()?;
    (bound > 0 && age.as_secs() >= bound).then(|| {
        format!(
            "this allocation has run {} s, longer than the site's max_allocation_time ({bound} s): it starts no more calls",
            age.as_secs()
        )
    })
}

/// What is wrong with a descriptor a run request carries (`what`: which
/// one, in the user's words).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum FdRefusal {
    #[error("{what}: {errno}")]
    Stat { what: &'static str, errno: nix::Error },
    #[error("{what} is not a {kind}")]
    Kind { what: &'static str, kind: &'static str },
    #[error("{what} is owned by uid {owner}, expected uid {uid}")]
    Owner { what: &'static str, owner: u32, uid: u32 },
    #[error("{what} is writable by group or others")]
    Writable { what: &'static str },
}

/// Checks a descriptor: its type and owner (and for the directory, not
/// writable by group or others).
pub(super) fn check_fd(fd: &OwnedFd, what: &'static str, uid: u32, dir: bool) -> Result<(), FdRefusal> {
    let st = fstat(fd.as_fd()).map_err(|errno| FdRefusal::Stat { what, errno })?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let want = if dir { SFlag::S_IFDIR } else { SFlag::S_IFREG };
    if kind != want {
        let kind = if dir { "directory" } else { "regular file" };
        return Err(FdRefusal::Kind { what, kind });
    }
    if st.st_uid != uid {
        return Err(FdRefusal::Owner { what, owner: st.st_uid, uid });
    }
    if dir && st.st_mode & 0o022 != 0 {
        return Err(FdRefusal::Writable { what });
    }
    Ok(())
}

/// The run request checked: the descriptors' types and owners, the site
/// policy readable and valid, the job directory's path the inode's own
/// name now, the spec valid, for this directory and within the policy.
// The error is the answer sent as it is, once per call: no need to box it.
#[allow(clippy::result_large_err)]
pub(super) fn checked_request(
    req: &RunRequest,
    uid: u32,
    [dir, out, err]: [&OwnedFd; 3],
) -> Result<(Policy, delegate_protocol::policy::Limits), Answer> {
    for (fd, what, is_dir) in [
        (dir, "the job directory", true),
        (out, "stdout", false),
        (err, "stderr", false),
    ] {
        check_fd(fd, what, uid, is_dir).map_err(|e| Answer::Refused(e.to_string()))?;
    }
    let policy = load_policy().map_err(|e| Answer::Failed(format!("{e}; ask the cluster's administrators")))?;
    let limits = policy.limits().clone();
    // The path the runner names must be where the inode is now (the
    // kernel's own name for the descriptor); the policy's job roots are
    // checked on it.
    let job_dir = PathBuf::from(&req.job_dir);
    if check_clean_absolute(&job_dir).is_err() {
        return Err(Answer::Refused(format!("{} is not a clean absolute path", req.job_dir)));
    }
    match std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
        Ok(p) if p == job_dir => {}
        _ => return Err(Answer::Failed(delegate_protocol::host::REPLACED.into())),
    }
    let spec = &req.spec;
    spec.validate().map_err(|e| Answer::Refused(e.to_string()))?;
    let name_ok = job_dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| JobId::parse(n).ok())
        .is_some_and(|id| id == spec.job_id);
    if !name_ok {
        return Err(Answer::Refused(format!(
            "the spec is for job {}, but the directory is {}",
            spec.job_id, req.job_dir
        )));
    }
    policy.check(spec, uid, &job_dir).map_err(|e| Answer::Refused(e.to_string()))?;
    Ok((policy, limits))
}

//! Per-call log files of `sandbox-runner batch`: while one call of a batch
//! runs, the runner's stderr goes to `<parent-of-job-dir>/<job-id>.log`,
//! the file that is a single job's Slurm log (the client reads the
//! `delegate: refused: ...` line from it when a job has no outcome).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use delegate_protocol::{open_dir_nofollow, JobId};
use nix::fcntl::{fcntl, openat, FcntlArg, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};

/// The log file of the job directory `job_dir`: its parent and the file
/// name `<job-id>.log`. The directory's name must be a job id.
pub fn log_location(job_dir: &Path) -> Result<(PathBuf, String), String> {
    let name = job_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{} has no valid final component", job_dir.display()))?;
    let id = JobId::parse(name).map_err(|e| e.to_string())?;
    let parent = job_dir
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", job_dir.display()))?;
    Ok((parent.to_path_buf(), format!("{}.log", id.as_str())))
}

/// Opens (creating it when missing) the log file of `job_dir` for appending,
/// without following symlinks anywhere on the way; it must be a regular
/// file owned by `uid`. The file is created as the user's group.
pub fn open_log(job_dir: &Path, uid: u32) -> Result<(OwnedFd, PathBuf), String> {
    let (parent, name) = log_location(job_dir)?;
    let shown = parent.join(&name);
    let pfd = open_dir_nofollow(&parent).map_err(|e| e.to_string())?;
    // O_NONBLOCK: a FIFO planted under the name must not block the runner
    // (ENXIO without a reader; with one, the type check refuses it).
    let fd = openat(
        pfd.as_fd(),
        name.as_str(),
        OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ELOOP => format!("{} is a symbolic link", shown.display()),
        e => format!("cannot open {}: {e}", shown.display()),
    })?;
    let st = fstat(fd.as_fd()).map_err(|e| format!("{}: {e}", shown.display()))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(format!("{} is not a regular file", shown.display()));
    }
    if st.st_uid != uid {
        return Err(format!("{} is owned by uid {}, expected uid {uid}", shown.display(), st.st_uid));
    }
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(OFlag::O_APPEND)).map_err(|e| format!("{}: {e}", shown.display()))?;
    Ok((fd, shown))
}

/// Standard error pointed at another file until dropped, then restored.
pub struct Redirect<'a> {
    saved: &'a OwnedFd,
}

impl<'a> Redirect<'a> {
    /// Points fd 2 at `to`; `saved` is a duplicate of the original fd 2.
    pub fn new(saved: &'a OwnedFd, to: &OwnedFd) -> std::io::Result<Redirect<'a>> {
        dup2_stderr(to)?;
        Ok(Redirect { saved })
    }
}

impl Drop for Redirect<'_> {
    fn drop(&mut self) {
        if let Err(e) = dup2_stderr(self.saved) {
            // Nowhere better to say it: the log file still is fd 2.
            tracing::error!("cannot restore the original standard error: {e}");
        }
    }
}

fn dup2_stderr(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: dup2 onto fd 2 only replaces what fd 2 refers to; both
    // descriptors are open for the call's duration.
    let r = unsafe { libc::dup2(fd.as_raw_fd(), libc::STDERR_FILENO) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A duplicate of the current fd 2 (close-on-exec), to restore it later.
pub fn save_stderr() -> std::io::Result<OwnedFd> {
    std::io::stderr().as_fd().try_clone_to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;

    const ID: &str = "20260101T000000-0123abcd";

    fn root() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        t
    }

    fn uid() -> u32 {
        nix::unistd::getuid().as_raw()
    }

    #[test]
    fn location_needs_a_job_id() {
        let (p, n) = log_location(Path::new(&format!("/home/a/.delegate/jobs/{ID}"))).unwrap();
        assert_eq!(p, Path::new("/home/a/.delegate/jobs"));
        assert_eq!(n, format!("{ID}.log"));
        let e = log_location(Path::new("/home/a/.delegate/jobs/../etc")).unwrap_err();
        assert!(e.starts_with("etc is not a valid job id"), "{e}");
        assert!(log_location(Path::new("/home/a/x")).unwrap_err().contains("not a valid job id"));
        assert_eq!(log_location(Path::new("/")), Err("/ has no valid final component".into()));
    }

    #[test]
    fn creates_and_appends() {
        let t = root();
        let dir = t.path().join(ID);
        let (fd, shown) = open_log(&dir, uid()).unwrap();
        assert_eq!(shown, t.path().join(format!("{ID}.log")));
        let mut f = std::fs::File::from(fd);
        f.write_all(b"one\n").unwrap();
        let (fd, _) = open_log(&dir, uid()).unwrap();
        std::fs::File::from(fd).write_all(b"two\n").unwrap();
        let mut s = String::new();
        std::fs::File::open(&shown).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "one\ntwo\n");
        let mode = std::fs::metadata(&shown).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o022, 0, "{mode:o}");
    }

    #[test]
    fn symlink_refused() {
        let t = root();
        let target = t.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, t.path().join(format!("{ID}.log"))).unwrap();
        let e = open_log(&t.path().join(ID), uid()).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // A symlink on the way to the parent is refused too.
        let link = t.path().join("linked");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        let e = open_log(&link.join(ID), uid()).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
    }

    #[test]
    fn wrong_owner_refused() {
        let t = root();
        std::fs::write(t.path().join(format!("{ID}.log")), b"").unwrap();
        let e = open_log(&t.path().join(ID), uid() + 1).unwrap_err();
        assert!(e.contains("is owned by uid"), "{e}");
    }

    #[test]
    fn non_regular_refused() {
        let t = root();
        let log = t.path().join(format!("{ID}.log"));
        std::fs::create_dir(&log).unwrap();
        let e = open_log(&t.path().join(ID), uid()).unwrap_err();
        assert_eq!(e, format!("cannot open {}: EISDIR: Is a directory", log.display()));
        let t = root();
        let log = t.path().join(format!("{ID}.log"));
        nix::unistd::mkfifo(&log, Mode::from_bits_truncate(0o600)).unwrap();
        // No reader: must fail at once rather than block.
        let e = open_log(&t.path().join(ID), uid()).unwrap_err();
        assert_eq!(e, format!("cannot open {}: ENXIO: No such device or address", log.display()));
    }
}

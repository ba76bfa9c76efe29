//! Symlink-proof file access relative to a directory descriptor: every
//! file of a job directory is opened with `O_NOFOLLOW`, bounded before it is
//! read, and written atomically.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

use crate::{ProtocolError, Result};

/// Rejects relative paths and paths with `.` or `..` components.
pub fn check_clean_absolute(path: &Path) -> Result<()> {
    let clean = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if clean {
        Ok(())
    } else {
        Err(ProtocolError::BadPath { path: path.display().to_string() })
    }
}

/// Opens a directory so that no component of its path may be a symlink.
///
/// The kernel resolves the path in one `openat2` call with
/// `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH` from `/` (Linux 5.6+). Where that
/// call is not available (`ENOSYS` on an older kernel, `EPERM` under a
/// seccomp filter that does not know it) and whenever it fails, the path is
/// walked component by component instead ([`open_dir_walk`]), which also
/// names the exact component at fault in the error.
pub fn open_dir_nofollow(path: &Path) -> Result<OwnedFd> {
    check_clean_absolute(path)?;
    match open_dir_openat2(path) {
        Some(fd) => Ok(fd),
        None => open_dir_walk(path),
    }
}

/// The one-call resolution of [`open_dir_nofollow`]; `None` on any error
/// (the walk then decides, with the precise error).
fn open_dir_openat2(path: &Path) -> Option<OwnedFd> {
    use rustix::fs::{openat2, Mode as RMode, OFlags, ResolveFlags};
    let rel = path.strip_prefix("/").ok()?;
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let root = rustix::fs::open("/", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, RMode::empty()).ok()?;
    openat2(
        &root,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        RMode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::BENEATH,
    )
    .ok()
}

/// Opens a directory by walking its components from `/` with `O_NOFOLLOW`,
/// so no component may be a symlink (no check-then-use race: each step is
/// relative to the descriptor of the previous one). The components above
/// the last are opened `O_PATH`, which needs only search permission, as the
/// kernel's own resolution does: a directory one may enter but not list
/// (the stack's shared home, 0711) does not turn a missing job into
/// "permission denied".
fn open_dir_walk(path: &Path) -> Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let through = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let names: Vec<_> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let first = if names.is_empty() { flags } else { through };
    let mut fd = nix::fcntl::open("/", first, Mode::empty()).map_err(|e| ProtocolError::io("/", e))?;
    let mut sofar = PathBuf::from("/");
    for (i, name) in names.iter().enumerate() {
        let name = *name;
        let flags = if i + 1 == names.len() { flags } else { through };
        sofar.push(name);
        fd = match openat(&fd, name, flags, Mode::empty()) {
            Ok(next) => next,
            Err(Errno::ELOOP) => return Err(ProtocolError::Symlink { path: sofar.display().to_string() }),
            Err(Errno::ENOTDIR) => {
                // O_DIRECTORY|O_NOFOLLOW on a symlink gives ENOTDIR on some kernels.
                let st = nix::sys::stat::fstatat(&fd, name, AtFlags::AT_SYMLINK_NOFOLLOW);
                if let Ok(st) = st {
                    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK {
                        return Err(ProtocolError::Symlink { path: sofar.display().to_string() });
                    }
                }
                return Err(ProtocolError::NotKind {
                    path: sofar.display().to_string(),
                    expected: "directory",
                });
            }
            Err(Errno::EACCES) => {
                let owner = nix::sys::stat::fstatat(&fd, name, AtFlags::AT_SYMLINK_NOFOLLOW);
                return Err(match owner {
                    Ok(st) => ProtocolError::NoAccess {
                        path: sofar.display().to_string(),
                        owner: st.st_uid,
                    },
                    Err(_) => ProtocolError::io(sofar.display(), Errno::EACCES),
                });
            }
            Err(e) => return Err(ProtocolError::io(sofar.display(), e)),
        };
    }
    Ok(fd)
}

/// True when `name` exists in `dir` (any type; a symlink is not followed).
pub fn exists_at(dir: impl AsFd, name: &str) -> bool {
    nix::sys::stat::fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
}

/// Opens `name` in `dir` read-only without following a symlink (`O_NONBLOCK`
/// guards the open against a FIFO) and checks it is a regular file;
/// `Ok(None)` when it does not exist. Returns the descriptor and its stat.
fn open_regular_raw(dir: impl AsFd, path: &str, name: &str) -> Result<Option<(OwnedFd, FileStat)>> {
    let fd = match openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(Errno::ELOOP) => return Err(ProtocolError::Symlink { path: path.into() }),
        Err(e) => return Err(ProtocolError::io(path, e)),
    };
    let st = fstat(&fd).map_err(|e| ProtocolError::io(path, e))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(ProtocolError::NotKind {
            path: path.into(),
            expected: "regular file",
        });
    }
    Ok(Some((fd, st)))
}

/// Opens `name` in `dir` read-only without following a symlink and checks
/// it is a regular file; `Ok(None)` when it does not exist. The descriptor
/// is blocking (`O_NONBLOCK` only guards the open against a FIFO).
pub fn open_regular_at(dir: impl AsFd, dir_path: &Path, name: &str) -> Result<Option<std::fs::File>> {
    let path = dir_path.join(name).display().to_string();
    let Some((fd, _)) = open_regular_raw(dir, &path, name)? else {
        return Ok(None);
    };
    // Blocking reads from here on (O_NONBLOCK only guarded the open).
    let _ = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()));
    Ok(Some(std::fs::File::from(fd)))
}

/// Checks that an open file is of the expected type and owned by `uid`.
pub fn check_owner(fd: impl AsFd, path: &str, uid: u32, dir: bool) -> Result<u64> {
    let st = fstat(fd.as_fd()).map_err(|e| ProtocolError::io(path, e))?;
    let fmt = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let want = if dir { SFlag::S_IFDIR } else { SFlag::S_IFREG };
    if fmt != want {
        return Err(ProtocolError::NotKind {
            path: path.into(),
            expected: if dir { "directory" } else { "regular file" },
        });
    }
    if st.st_uid != uid {
        return Err(ProtocolError::WrongOwner {
            path: path.into(),
            found: st.st_uid,
            expected: uid,
        });
    }
    if dir && st.st_mode & 0o022 != 0 {
        return Err(ProtocolError::TooOpen {
            path: path.into(),
            mode: st.st_mode & 0o7777,
        });
    }
    Ok(st.st_size as u64)
}

/// Opens `name` in `dir` read-only without following a symlink, checks it is
/// a regular file (owned by `uid` when given) of at most `limit` bytes, and
/// reads it. Reads at most `limit + 1` bytes, whatever fstat said.
pub fn read_bounded_at(dir: impl AsFd, dir_path: &Path, name: &str, limit: u64, uid: Option<u32>) -> Result<Vec<u8>> {
    let path = dir_path.join(name).display().to_string();
    let (fd, st) = open_regular_raw(dir, &path, name)?.ok_or_else(|| ProtocolError::io(&path, Errno::ENOENT))?;
    if let Some(uid) = uid {
        if st.st_uid != uid {
            return Err(ProtocolError::WrongOwner { path, found: st.st_uid, expected: uid });
        }
    }
    if st.st_size as u64 > limit {
        return Err(ProtocolError::TooLarge { path, size: st.st_size as u64, limit });
    }
    let mut buf = Vec::with_capacity(st.st_size.max(0) as usize);
    std::fs::File::from(fd)
        .take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ProtocolError::io(&path, e))?;
    if buf.len() as u64 > limit {
        return Err(ProtocolError::TooLarge { path, size: buf.len() as u64, limit });
    }
    Ok(buf)
}

/// Writes `bytes` to `name` in `dir` atomically: a temporary file in the
/// same directory, fsync, rename over `name`, fsync of the directory. A
/// reader sees either the old file (or none) or the whole new one.
pub fn atomic_write_at(dir: impl AsFd, dir_path: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
    replace_at(dir, dir_path, name, bytes, mode, true)
}

/// [`atomic_write_at`] without the two fsyncs: as atomic for readers, but
/// durable only after a later [`sync_filesystem`] of the same filesystem.
/// For writers of many files at once (a submission of 1,000 calls), which
/// make them all durable with one sync before anything depends on them.
pub fn atomic_write_at_deferred(dir: impl AsFd, dir_path: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
    replace_at(dir, dir_path, name, bytes, mode, false)
}

/// Makes everything written to the filesystem holding `fd` durable
/// (`syncfs(2)`): the one sync after [`atomic_write_at_deferred`] writes.
pub fn sync_filesystem(fd: impl AsFd, path: &Path) -> Result<()> {
    nix::unistd::syncfs(fd.as_fd()).map_err(|e| ProtocolError::io(path.display().to_string(), e))
}

fn replace_at(dir: impl AsFd, dir_path: &Path, name: &str, bytes: &[u8], mode: u32, durable: bool) -> Result<()> {
    let path = dir_path.join(name).display().to_string();
    let mut rnd = [0u8; 6];
    let _ = getrandom::fill(&mut rnd);
    let tmp = format!(
        ".{name}.tmp-{}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        std::process::id(),
        rnd[0],
        rnd[1],
        rnd[2],
        rnd[3],
        rnd[4],
        rnd[5]
    );
    let fd = openat(
        dir.as_fd(),
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map_err(|e| ProtocolError::io(&path, e))?;
    let mut f = std::fs::File::from(fd);
    let res = f
        .write_all(bytes)
        .and_then(|_| if durable { f.sync_all() } else { Ok(()) })
        .map_err(|e| ProtocolError::io(&path, e))
        .and_then(|_| renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name).map_err(|e| ProtocolError::io(&path, e)));
    if res.is_err() {
        let _ = nix::unistd::unlinkat(dir.as_fd(), tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        return res;
    }
    // Make the rename durable; failure here does not undo the write.
    if durable {
        let _ = nix::unistd::fsync(dir.as_fd());
    }
    Ok(())
}

/// Names in the directory other than `.` and `..`, at most `limit` of them
/// (an error beyond, so a directory stuffed with entries cannot exhaust memory).
pub fn list_entries(dir: impl AsFd, dir_path: &Path, limit: usize) -> Result<Vec<String>> {
    let path = dir_path.display().to_string();
    let dup = dir.as_fd().try_clone_to_owned().map_err(|e| ProtocolError::io(&path, e))?;
    let mut d = nix::dir::Dir::from_fd(dup).map_err(|e| ProtocolError::io(&path, e))?;
    let mut out = Vec::new();
    for ent in d.iter() {
        let ent = ent.map_err(|e| ProtocolError::io(&path, e))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        if out.len() >= limit {
            return Err(ProtocolError::TooLarge {
                path,
                size: out.len() as u64 + 1,
                limit: limit as u64,
            });
        }
        out.push(name);
    }
    // Rewinding is unnecessary: the duplicate shares the offset, but callers
    // only use the descriptor with *at() calls.
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::sample_spec as spec;
    use crate::{read_record_at, write_record_at, Spec};

    #[test]
    fn atomic_write_and_bounded_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_dir_nofollow(tmp.path()).unwrap();
        let s = spec();
        write_record_at(&dir, tmp.path(), &s).unwrap();
        let back: Spec = read_record_at(&dir, tmp.path(), Some(nix::unistd::getuid().as_raw())).unwrap();
        assert_eq!(back, s);
        // Overwrite: the reader sees the new whole file, no temporaries left.
        let mut s2 = s.clone();
        s2.image = "other".into();
        write_record_at(&dir, tmp.path(), &s2).unwrap();
        let back: Spec = read_record_at(&dir, tmp.path(), None).unwrap();
        assert_eq!(back.image, "other");
        let names = list_entries(&dir, tmp.path(), 10).unwrap();
        assert_eq!(names, vec!["spec".to_string()]);
        // Bounded read refuses a large file.
        atomic_write_at(&dir, tmp.path(), "big", &[1u8; 100], 0o600).unwrap();
        assert!(matches!(
            read_bounded_at(&dir, tmp.path(), "big", 10, None),
            Err(ProtocolError::TooLarge { .. })
        ));
        assert!(read_bounded_at(&dir, tmp.path(), "missing", 10, None)
            .unwrap_err()
            .is_not_found());
    }

    #[test]
    fn deferred_writes_are_atomic_and_synced_together() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_dir_nofollow(tmp.path()).unwrap();
        let s = spec();
        crate::write_record_at_deferred(&dir, tmp.path(), &s).unwrap();
        atomic_write_at_deferred(&dir, tmp.path(), "payload", b"abc", 0o600).unwrap();
        atomic_write_at_deferred(&dir, tmp.path(), "payload", b"abcd", 0o600).unwrap();
        sync_filesystem(&dir, tmp.path()).unwrap();
        let back: Spec = read_record_at(&dir, tmp.path(), None).unwrap();
        assert_eq!(back, s);
        assert_eq!(read_bounded_at(&dir, tmp.path(), "payload", 10, None).unwrap(), b"abcd");
        let mut names = list_entries(&dir, tmp.path(), 10).unwrap();
        names.sort();
        assert_eq!(names, vec!["payload".to_string(), "spec".to_string()]);
        let mode = std::fs::metadata(tmp.path().join("payload")).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
    }

    #[test]
    fn symlinks_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("spec"), b"x").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(open_dir_nofollow(&link), Err(ProtocolError::Symlink { .. })));
        let dir = open_dir_nofollow(&real).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", real.join("payload")).unwrap();
        assert!(matches!(
            read_bounded_at(&dir, &real, "payload", 1 << 20, None),
            Err(ProtocolError::Symlink { .. })
        ));
        assert!(matches!(
            open_dir_nofollow(Path::new("/tmp/../etc")),
            Err(ProtocolError::BadPath { .. })
        ));
        assert!(matches!(
            open_dir_nofollow(Path::new("relative")),
            Err(ProtocolError::BadPath { .. })
        ));
    }

    #[test]
    fn openat2_and_walk_agree() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let same = |a: &OwnedFd, b: &OwnedFd| {
            let (x, y) = (fstat(a).unwrap(), fstat(b).unwrap());
            (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino)
        };
        let walked = open_dir_walk(&real).unwrap();
        // openat2 may be missing (old kernel, seccomp): then the walk serves.
        if let Some(fd) = open_dir_openat2(&real) {
            assert!(same(&fd, &walked));
            assert!(open_dir_openat2(&link).is_none(), "openat2 followed a symlink");
            assert!(open_dir_openat2(&link.join("x")).is_none());
        }
        assert!(matches!(open_dir_walk(&link), Err(ProtocolError::Symlink { .. })));
        assert!(same(
            &open_dir_nofollow(Path::new("/")).unwrap(),
            &open_dir_walk(Path::new("/")).unwrap()
        ));
    }

    #[test]
    fn ownership_check() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_dir_nofollow(tmp.path()).unwrap();
        let me = nix::unistd::getuid().as_raw();
        std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        check_owner(&dir, "d", me, true).expect("my own 0700 directory passes");
        assert!(matches!(
            check_owner(&dir, "d", me + 1, true),
            Err(ProtocolError::WrongOwner { .. })
        ));
        std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(matches!(check_owner(&dir, "d", me, true), Err(ProtocolError::TooOpen { .. })));
    }
}

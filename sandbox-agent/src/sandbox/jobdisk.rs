//! The job directory's budget while a call runs: the bytes it holds
//! (allocated blocks, deleted files the sandbox still holds open
//! included), the files it holds, and a depth the agent can measure.
//! Security round 3, item 2: four unlinked 1 GB files, files 66
//! directories deep and 300,000 empty files all escaped the old sum. Now
//! a walk cut short by depth or by the file budget counts as over the
//! limit, and deleted-but-open files of the sandbox's processes count.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use delegate_protocol::units::format_size;

/// Deeper directories than this are not measured: a job that makes them
/// is stopped.
pub const MAX_DEPTH: u32 = 64;

/// What the site allows one job directory (0: no limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub files: u64,
}

/// What a walk of the job directory found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    pub bytes: u64,
    pub files: u64,
    /// A directory at [`MAX_DEPTH`] holds directories.
    pub too_deep: bool,
    /// Bytes of deleted files the sandbox's processes still hold open or
    /// mapped on the job directory's filesystem.
    pub deleted_bytes: u64,
}

/// Walks the directory through its descriptor (never a path), counting
/// allocated bytes and entries; stops counting files one past the budget.
pub fn measure(dir: &OwnedFd, budget: Budget) -> std::io::Result<Measured> {
    let mut m = Measured::default();
    let cap = if budget.files == 0 { u64::MAX } else { budget.files + 1 };
    walk(dir.as_fd(), 0, cap, &mut m)?;
    Ok(m)
}

fn walk(fd: BorrowedFd<'_>, depth: u32, cap: u64, m: &mut Measured) -> std::io::Result<()> {
    use nix::fcntl::{openat, AtFlags, OFlag};
    use nix::sys::stat::{fstatat, Mode, SFlag};
    let own = nix::unistd::dup(fd)?;
    let mut d = nix::dir::Dir::from_fd(own)?;
    let mut subdirs = Vec::new();
    for e in d.iter() {
        let e = e?;
        let name = e.file_name().to_owned();
        if name.as_bytes() == b"." || name.as_bytes() == b".." {
            continue;
        }
        if m.files >= cap {
            return Ok(());
        }
        m.files += 1;
        let Ok(st) = fstatat(fd, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        m.bytes = m.bytes.saturating_add((st.st_blocks as u64).saturating_mul(512));
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
            if depth >= MAX_DEPTH {
                m.too_deep = true;
                return Ok(());
            }
            subdirs.push(name);
        }
    }
    for name in subdirs {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if let Ok(sub) = openat(fd, name.as_c_str(), flags, Mode::empty()) {
            walk(sub.as_fd(), depth + 1, cap, m)?;
            if m.too_deep || m.files >= cap {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Why the call must stop, or `None` while it is within its budget.
pub fn verdict(m: &Measured, budget: Budget) -> Option<String> {
    if m.too_deep {
        return Some(format!(
            "stopped: the job directory is nested more than {MAX_DEPTH} directories deep (the site cannot measure it)"
        ));
    }
    if budget.files > 0 && m.files > budget.files {
        return Some(format!(
            "stopped: the job directory holds more than {} files, the site limit (max_job_files)",
            budget.files
        ));
    }
    let total = m.bytes.saturating_add(m.deleted_bytes);
    if budget.bytes > 0 && total > budget.bytes {
        let deleted = if m.deleted_bytes > 0 {
            format!(" ({} of it in deleted files still open)", format_size(m.deleted_bytes))
        } else {
            String::new()
        };
        return Some(format!(
            "stopped: the job directory holds {}{deleted}, more than the site limit of {} (max_job_bytes)",
            format_size(total),
            format_size(budget.bytes)
        ));
    }
    None
}

/// The processes of the container whose first process is `init` (the
/// engine's pid, from its inspect), as the /proc at `proc` shows them:
/// `None` when `init` is not that container's process there (the agent
/// runs in another pid namespace than the engine and `proc` is its own).
pub fn sandbox_pids(proc: &Path, init: i64, container_id: &str) -> Option<Vec<i32>> {
    let init = i32::try_from(init).ok().filter(|p| *p > 1)?;
    let cgroup = std::fs::read_to_string(proc.join(format!("{init}/cgroup"))).ok()?;
    if container_id.len() < 12 || !cgroup.contains(container_id) {
        return None;
    }
    let ns = std::fs::read_link(proc.join(format!("{init}/ns/pid"))).ok()?;
    let pids = std::fs::read_dir(proc)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| std::fs::read_link(proc.join(format!("{p}/ns/pid"))).is_ok_and(|n| n == ns))
        .collect();
    Some(pids)
}

/// Bytes of deleted regular files on device `dev` that `pids` (of the
/// /proc at `proc`) hold open or mapped (each file once).
pub fn deleted_bytes(proc: &Path, pids: &[i32], dev: u64) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    for pid in pids {
        for sub in ["fd", "map_files"] {
            let Ok(entries) = std::fs::read_dir(proc.join(format!("{pid}/{sub}"))) else {
                continue;
            };
            for e in entries.flatten() {
                // metadata() follows the magic link to the open file itself.
                let Ok(md) = std::fs::metadata(e.path()) else { continue };
                if md.is_file() && md.nlink() == 0 && md.dev() == dev && seen.insert(md.ino()) {
                    total = total.saturating_add(md.blocks().saturating_mul(512));
                }
            }
        }
    }
    total
}

/// The device of the directory behind `dir`.
pub fn device(dir: &OwnedFd) -> Option<u64> {
    nix::sys::stat::fstat(dir.as_fd()).ok().map(|s| s.st_dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(p: &Path) -> OwnedFd {
        std::fs::File::open(p).expect("open").into()
    }

    const NONE: Budget = Budget { bytes: 0, files: 0 };

    #[test]
    fn nested_files_are_counted() {
        let t = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(t.path().join("a")).expect("mkdir");
        std::fs::write(t.path().join("a/f"), vec![1u8; 1 << 20]).expect("write");
        std::fs::write(t.path().join("g"), vec![1u8; 1 << 20]).expect("write");
        let m = measure(&open(t.path()), NONE).expect("measure");
        assert!(m.bytes >= 2 << 20, "{m:?}");
        assert_eq!((m.files, m.too_deep), (3, false));
        assert_eq!(verdict(&m, Budget { bytes: 4 << 20, files: 3 }), None);
        let why = verdict(&m, Budget { bytes: 1 << 20, files: 0 }).expect("over");
        assert!(why.contains("max_job_bytes"), "{why}");
    }

    #[test]
    fn a_walk_cut_short_counts_as_over() {
        let t = tempfile::tempdir().expect("tempdir");
        let mut p = t.path().to_path_buf();
        for _ in 0..=MAX_DEPTH + 1 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).expect("mkdir -p");
        let m = measure(&open(t.path()), NONE).expect("measure");
        assert!(m.too_deep, "{m:?}");
        assert!(verdict(&m, NONE).expect("over").contains("deep"));
        for i in 0..50 {
            std::fs::write(t.path().join(format!("f{i}")), b"").expect("write");
        }
        let m = measure(&open(t.path()), Budget { bytes: 0, files: 10 }).expect("measure");
        assert_eq!(m.files, 11, "{m:?}");
        let why = verdict(&m, Budget { bytes: 0, files: 10 }).expect("over");
        assert!(why.contains("more than 10 files"), "{why}");
    }

    #[test]
    fn deleted_open_files_of_a_process_are_counted() {
        let t = tempfile::tempdir().expect("tempdir");
        let path = t.path().join("gone");
        let mut f = std::fs::File::create(&path).expect("create");
        std::io::Write::write_all(&mut f, &vec![7u8; 3 << 20]).expect("write");
        f.sync_all().expect("sync");
        std::fs::remove_file(&path).expect("unlink");
        let dev = device(&open(t.path())).expect("dev");
        let me = std::process::id() as i32;
        let proc = Path::new("/proc");
        assert!(deleted_bytes(proc, &[me], dev) >= 3 << 20);
        let m = Measured {
            deleted_bytes: 3 << 20,
            ..Measured::default()
        };
        let why = verdict(&m, Budget { bytes: 1 << 20, files: 0 }).expect("over");
        assert!(why.contains("in deleted files still open"), "{why}");
        drop(f);
        assert_eq!(deleted_bytes(proc, &[me], dev), 0);
    }

    #[test]
    fn a_pid_that_is_not_the_containers_is_not_used() {
        let proc = Path::new("/proc");
        assert_eq!(sandbox_pids(proc, std::process::id() as i64, "0123456789abcdef"), None);
        assert_eq!(sandbox_pids(proc, 1, "0123456789abcdef"), None);
    }
}

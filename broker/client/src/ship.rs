//! Copying the files a student ships with a job into its directory before
//! submission: each named file or directory goes to the top of the job
//! directory under its own name (the sandbox sees `/job/<name>`), and the
//! `shipped` manifest lists them for the runner. Bounded by the site
//! policy's job size (`max_job_bytes`), by a depth and an entry count;
//! symlinks inside a shipped directory are kept when they point inside it
//! and left out (with a warning) when they would lead out of it; other
//! special files are left out.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use delegate_protocol::shipped::{shipped_manifest, shipped_name_problem, MAX_SHIPPED, SHIPPED};

use crate::{ClientError, Result};

/// Deepest directory level copied.
const MAX_DEPTH: usize = 32;
/// At most this many files, directories and links in one job's shipment.
const MAX_ENTRIES: usize = 20_000;

/// What is left to copy.
struct Budget {
    bytes_left: u64,
    limit: u64,
    entries_left: usize,
}

impl Budget {
    fn take_entry(&mut self, what: &Path) -> Result<()> {
        if self.entries_left == 0 {
            return Err(refused(format!(
                "{} holds more than {MAX_ENTRIES} files and directories to ship",
                what.display()
            )));
        }
        self.entries_left -= 1;
        Ok(())
    }
}

fn refused(msg: String) -> ClientError {
    ClientError::InvalidRequest(msg)
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> ClientError {
    move |source| ClientError::Io { what, source }
}

/// The names the paths will have in the job directory, checked: each a
/// valid, distinct name; at most [`MAX_SHIPPED`].
pub fn shipped_names(paths: &[PathBuf]) -> Result<Vec<String>> {
    if paths.len() > MAX_SHIPPED {
        return Err(refused(format!("{} files to ship, more than {MAX_SHIPPED}", paths.len())));
    }
    let mut names: Vec<String> = Vec::new();
    for p in paths {
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| refused(format!("{} has no file name to ship it under", p.display())))?
            .to_owned();
        if let Some(problem) = shipped_name_problem(&name) {
            return Err(refused(format!("cannot ship {}: {problem}", p.display())));
        }
        if names.contains(&name) {
            return Err(refused(format!("two files to ship are named {name}")));
        }
        names.push(name);
    }
    Ok(names)
}

/// Copies `paths` into the job directory `dir` and writes the manifest;
/// `limit`: the most bytes the copies may take (the policy's job size).
pub fn ship(dir: &Path, paths: &[PathBuf], limit: u64) -> Result<()> {
    if paths.is_empty() {
        return Ok(());
    }
    let names = shipped_names(paths)?;
    let mut budget = Budget {
        bytes_left: limit,
        limit,
        entries_left: MAX_ENTRIES,
    };
    for (src, name) in paths.iter().zip(&names) {
        let meta = fs::metadata(src).map_err(io(format!("cannot ship {}", src.display())))?;
        let dest = dir.join(name);
        if meta.is_dir() {
            copy_tree(src, &dest, src, 0, &mut budget)?;
        } else if meta.is_file() {
            budget.take_entry(src)?;
            copy_file(src, &dest, meta.permissions().mode(), &mut budget)?;
        } else {
            return Err(refused(format!(
                "cannot ship {}: it is neither a file nor a directory",
                src.display()
            )));
        }
    }
    let manifest = shipped_manifest(&names);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(dir.join(SHIPPED))
        .map_err(io(format!("cannot write {}", dir.join(SHIPPED).display())))?;
    f.write_all(manifest.as_bytes())
        .map_err(io(format!("cannot write {}", dir.join(SHIPPED).display())))
}

/// Copies one regular file (its executable bits kept), counting its bytes
/// against the budget as they are read (a file growing meanwhile is
/// caught too).
fn copy_file(src: &Path, dest: &Path, mode: u32, budget: &mut Budget) -> Result<()> {
    let mut input = File::open(src).map_err(io(format!("cannot ship {}", src.display())))?;
    let size = input.metadata().map_err(io(format!("cannot ship {}", src.display())))?.len();
    if size > budget.bytes_left {
        return Err(too_large(budget, src));
    }
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if mode & 0o111 != 0 { 0o755 } else { 0o644 })
        .open(dest)
        .map_err(io(format!("cannot copy to {}", dest.display())))?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = input.read(&mut buf).map_err(io(format!("cannot read {}", src.display())))?;
        if n == 0 {
            return Ok(());
        }
        if n as u64 > budget.bytes_left {
            return Err(too_large(budget, src));
        }
        budget.bytes_left -= n as u64;
        out.write_all(&buf[..n])
            .map_err(io(format!("cannot write {}", dest.display())))?;
    }
}

fn too_large(budget: &Budget, at: &Path) -> ClientError {
    refused(format!(
        "the files to ship are larger than the site's job size limit of {} (max_job_bytes), at {}",
        delegate_protocol::units::format_size(budget.limit),
        at.display()
    ))
}

/// Copies the directory `src` (inside the shipped tree `root`) to `dest`.
fn copy_tree(src: &Path, dest: &Path, root: &Path, depth: usize, budget: &mut Budget) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(refused(format!("{} is nested deeper than {MAX_DEPTH} levels", src.display())));
    }
    budget.take_entry(src)?;
    fs::create_dir(dest).map_err(io(format!("cannot create {}", dest.display())))?;
    let mut entries: Vec<_> = fs::read_dir(src)
        .map_err(io(format!("cannot list {}", src.display())))?
        .collect::<std::io::Result<_>>()
        .map_err(io(format!("cannot list {}", src.display())))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let to = dest.join(e.file_name());
        let meta = fs::symlink_metadata(&path).map_err(io(format!("cannot ship {}", path.display())))?;
        let kind = meta.file_type();
        if kind.is_dir() {
            copy_tree(&path, &to, root, depth + 1, budget)?;
        } else if kind.is_file() {
            budget.take_entry(&path)?;
            copy_file(&path, &to, meta.permissions().mode(), budget)?;
        } else if kind.is_symlink() {
            budget.take_entry(&path)?;
            let target = fs::read_link(&path).map_err(io(format!("cannot read the link {}", path.display())))?;
            if stays_inside(root, path.parent().unwrap_or(root), &target) {
                std::os::unix::fs::symlink(&target, &to).map_err(io(format!("cannot create {}", to.display())))?;
            } else {
                tracing::warn!(link = %path.display(), target = %target.display(), "not shipped: the link leads out of the shipped directory");
                eprintln!(
                    "delegate: {} not shipped: the link leads out of {}",
                    path.display(),
                    root.display()
                );
            }
        } else {
            eprintln!("delegate: {} not shipped: not a file, directory or link", path.display());
        }
    }
    Ok(())
}

/// True when the link `target`, found in directory `at` of the tree
/// `root`, names something inside the tree (lexically: a relative target
/// that never climbs above `root`; absolute targets are out).
fn stays_inside(root: &Path, at: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let Ok(rel) = at.strip_prefix(root) else { return false };
    let mut depth: isize = rel.components().count() as isize;
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            _ => return false,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_inside_and_out() {
        let r = Path::new("/p");
        assert!(stays_inside(r, Path::new("/p/a"), Path::new("../b")));
        assert!(stays_inside(r, Path::new("/p"), Path::new("b/c")));
        assert!(!stays_inside(r, Path::new("/p"), Path::new("../x")));
        assert!(!stays_inside(r, Path::new("/p/a"), Path::new("../../x")));
        assert!(!stays_inside(r, Path::new("/p/a"), Path::new("/etc/passwd")));
        assert!(!stays_inside(r, Path::new("/p/a"), Path::new("b/../../../x")));
    }

    #[test]
    fn a_tree_is_copied_within_its_budget() {
        let src = tempfile::tempdir().unwrap();
        let proj = src.path().join("proj");
        fs::create_dir_all(proj.join("data")).unwrap();
        fs::write(proj.join("train.py"), b"print('hi')").unwrap();
        fs::write(proj.join("data/x.csv"), b"1,2\n").unwrap();
        std::os::unix::fs::symlink("data/x.csv", proj.join("link.csv")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", proj.join("out")).unwrap();
        std::os::unix::fs::symlink("../../secret", proj.join("data/up")).unwrap();
        let single = src.path().join("run.sh");
        fs::write(&single, b"#!/bin/sh\necho ok\n").unwrap();
        fs::set_permissions(&single, fs::Permissions::from_mode(0o700)).unwrap();
        let job = tempfile::tempdir().unwrap();
        ship(job.path(), &[proj.clone(), single.clone()], 1 << 20).unwrap();
        assert_eq!(fs::read(job.path().join("proj/train.py")).unwrap(), b"print('hi')");
        assert_eq!(fs::read(job.path().join("proj/link.csv")).unwrap(), b"1,2\n");
        assert!(
            fs::symlink_metadata(job.path().join("proj/out")).is_err(),
            "an absolute link is left out"
        );
        assert!(
            fs::symlink_metadata(job.path().join("proj/data/up")).is_err(),
            "a link out of the tree is left out"
        );
        let mode = fs::metadata(job.path().join("run.sh")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(fs::read_to_string(job.path().join(SHIPPED)).unwrap(), "proj\nrun.sh\n");
        // Over the budget: refused in one sentence.
        let job2 = tempfile::tempdir().unwrap();
        let e = ship(job2.path(), &[proj], 5).unwrap_err().to_string();
        assert!(e.contains("larger than the site's job size limit"), "{e}");
    }

    #[test]
    fn names_are_checked() {
        assert!(shipped_names(&[PathBuf::from("/x/spec")]).is_err());
        assert!(shipped_names(&[PathBuf::from("/x/a.py"), PathBuf::from("/y/a.py")]).is_err());
        assert!(shipped_names(&[PathBuf::from("/")]).is_err());
        assert_eq!(shipped_names(&[PathBuf::from("train.py")]).unwrap(), vec!["train.py"]);
    }
}

//! Copying the files a student ships with a job into its directory before
//! submission: each named file or directory goes to the top of the job
//! directory under its own name (the sandbox sees `/job/<name>`), and the
//! `shipped` manifest lists them for the runner.
//!
//! Two passes: the shipment is first walked and measured as the agent's
//! job-size watcher will count it (allocated blocks: every entry at least
//! one 4 KiB block, files rounded up), within the site policy's job size
//! (`max_job_bytes`), a depth and an entry count, and refused in one
//! sentence before anything is written; then copied, the bytes counted
//! again while read (a file that grows meanwhile is caught too). Symlinks
//! inside a shipped directory are kept when they resolve inside it and left
//! out (named on stderr) when they lead out of it; other special files are
//! left out; the delegate root itself is never walked into.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use delegate_protocol::shipped::{shipped_manifest, shipped_name_problem, MAX_SHIPPED, SHIPPED};

use crate::{ClientError, Result};

/// Deepest directory level copied.
const MAX_DEPTH: usize = 32;
/// At most this many files, directories and links in one job's shipment.
const MAX_ENTRIES: usize = 20_000;
/// What one entry takes at least, as the job-size watcher counts it.
const BLOCK: u64 = 4096;

/// One thing to create in the job directory (its path relative to it).
#[derive(Debug, PartialEq)]
enum Op {
    Dir(PathBuf),
    File { src: PathBuf, to: PathBuf, exec: bool },
    Link { target: PathBuf, to: PathBuf },
}

/// What a shipment will create, and what it was measured to take.
#[derive(Debug)]
pub struct Plan {
    names: Vec<String>,
    ops: Vec<Op>,
    /// Bytes as the job-size watcher counts them.
    pub charged: u64,
    limit: u64,
}

fn refused(msg: String) -> ClientError {
    ClientError::InvalidRequest(msg)
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> ClientError {
    move |source| ClientError::Io { what, source }
}

fn too_large(limit: u64, at: &Path) -> ClientError {
    refused(format!(
        "the files to ship are larger than the site's job size limit of {} (max_job_bytes), at {}",
        delegate_protocol::units::format_size(limit),
        at.display()
    ))
}

/// What a file of `size` bytes takes: whole 4 KiB blocks, at least one.
fn charge(size: u64) -> u64 {
    size.div_ceil(BLOCK).max(1) * BLOCK
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

/// The walk of the first pass.
struct Walk<'a> {
    ops: Vec<Op>,
    charged: u64,
    limit: u64,
    /// (device, inode) of the delegate root: never walked into.
    skip: Option<(u64, u64)>,
    warn: &'a mut dyn FnMut(String),
}

impl Walk<'_> {
    fn add(&mut self, op: Op, bytes: u64, at: &Path) -> Result<()> {
        if self.ops.len() >= MAX_ENTRIES {
            return Err(refused(format!(
                "{} holds more than {MAX_ENTRIES} files and directories to ship",
                at.display()
            )));
        }
        self.charged = self.charged.saturating_add(bytes);
        if self.charged > self.limit {
            return Err(too_large(self.limit, at));
        }
        self.ops.push(op);
        Ok(())
    }

    /// The directory `src` (inside the shipped tree `root`) as `to`.
    fn dir(&mut self, src: &Path, to: PathBuf, root: &Path, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(refused(format!("{} is nested deeper than {MAX_DEPTH} levels", src.display())));
        }
        self.add(Op::Dir(to.clone()), BLOCK, src)?;
        let mut entries: Vec<_> = fs::read_dir(src)
            .map_err(io(format!("cannot list {}", src.display())))?
            .collect::<std::io::Result<_>>()
            .map_err(io(format!("cannot list {}", src.display())))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let dest = to.join(e.file_name());
            let meta = fs::symlink_metadata(&path).map_err(io(format!("cannot ship {}", path.display())))?;
            let kind = meta.file_type();
            if kind.is_dir() {
                if self.skip == Some((meta.dev(), meta.ino())) {
                    (self.warn)(format!("{} not shipped: it is the delegate root", path.display()));
                    continue;
                }
                self.dir(&path, dest, root, depth + 1)?;
            } else if kind.is_file() {
                let exec = meta.mode() & 0o111 != 0;
                self.add(Op::File { src: path.clone(), to: dest, exec }, charge(meta.len()), &path)?;
            } else if kind.is_symlink() {
                let target = fs::read_link(&path).map_err(io(format!("cannot read the link {}", path.display())))?;
                if stays_inside(root, &path) {
                    self.add(Op::Link { target, to: dest }, BLOCK, &path)?;
                } else {
                    (self.warn)(format!(
                        "{} not shipped: the link leads out of {}",
                        path.display(),
                        root.display()
                    ));
                }
            } else {
                (self.warn)(format!("{} not shipped: not a file, directory or link", path.display()));
            }
        }
        Ok(())
    }
}

/// The first pass: every path measured, nothing written. `limit`: the most
/// bytes the shipment may take; `root`: the delegate root (never shipped);
/// `warn` is told what is left out.
pub fn plan(paths: &[PathBuf], limit: u64, root: Option<&Path>, warn: &mut dyn FnMut(String)) -> Result<Plan> {
    let names = shipped_names(paths)?;
    let root = root.and_then(|r| fs::canonicalize(r).ok());
    let skip = root.as_ref().and_then(|r| fs::metadata(r).ok()).map(|m| (m.dev(), m.ino()));
    let mut w = Walk {
        ops: Vec::new(),
        charged: 0,
        limit,
        skip,
        warn,
    };
    for (src, name) in paths.iter().zip(&names) {
        let meta = fs::metadata(src).map_err(io(format!("cannot ship {}", src.display())))?;
        if meta.is_dir() {
            let holds_root = match (&root, fs::canonicalize(src)) {
                (Some(r), Ok(s)) => r.starts_with(s),
                _ => false,
            };
            if holds_root {
                return Err(refused(format!(
                    "cannot ship {}: it holds the delegate root (your jobs' own directories)",
                    src.display()
                )));
            }
            w.dir(src, PathBuf::from(name), src, 0)?;
        } else if meta.is_file() {
            let op = Op::File {
                src: src.clone(),
                to: PathBuf::from(name),
                exec: meta.mode() & 0o111 != 0,
            };
            w.add(op, charge(meta.len()), src)?;
        } else {
            return Err(refused(format!(
                "cannot ship {}: it is neither a file nor a directory",
                src.display()
            )));
        }
    }
    Ok(Plan {
        names,
        ops: w.ops,
        charged: w.charged,
        limit,
    })
}

/// The second pass: creates the plan's entries in the job directory `dir`
/// and writes the manifest.
pub fn execute(plan: &Plan, dir: &Path) -> Result<()> {
    let mut left = plan.limit;
    for op in &plan.ops {
        match op {
            Op::Dir(to) => {
                fs::create_dir(dir.join(to)).map_err(io(format!("cannot create {}", dir.join(to).display())))?
            }
            Op::File { src, to, exec } => copy_file(src, &dir.join(to), *exec, &mut left, plan.limit)?,
            Op::Link { target, to } => std::os::unix::fs::symlink(target, dir.join(to))
                .map_err(io(format!("cannot create {}", dir.join(to).display())))?,
        }
    }
    let path = dir.join(SHIPPED);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)
        .map_err(io(format!("cannot write {}", path.display())))?;
    f.write_all(shipped_manifest(&plan.names).as_bytes())
        .map_err(io(format!("cannot write {}", path.display())))
}

/// What a shipment leaves out, told to the user (stderr) and the log.
pub fn say_left_out(m: String) {
    tracing::warn!("{m}");
    eprintln!("delegate: {m}");
}

/// Copies one regular file (executable or not), its bytes counted against
/// what is `left` as they are read.
fn copy_file(src: &Path, dest: &Path, exec: bool, left: &mut u64, limit: u64) -> Result<()> {
    let mut input = File::open(src).map_err(io(format!("cannot ship {}", src.display())))?;
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if exec { 0o755 } else { 0o644 })
        .open(dest)
        .map_err(io(format!("cannot copy to {}", dest.display())))?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = input.read(&mut buf).map_err(io(format!("cannot read {}", src.display())))?;
        if n == 0 {
            return Ok(());
        }
        *left = left.checked_sub(n as u64).ok_or_else(|| too_large(limit, src))?;
        out.write_all(&buf[..n])
            .map_err(io(format!("cannot write {}", dest.display())))?;
    }
}

/// True when the link at `link` (inside the shipped tree `root`) resolves,
/// through whatever links it passes, to something inside the tree.
fn stays_inside(root: &Path, link: &Path) -> bool {
    match (fs::canonicalize(root), fs::canonicalize(link)) {
        (Ok(r), Ok(t)) => t.starts_with(&r),
        // Dangling (or unreadable): nothing to reach, nothing to copy.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Both passes: `paths` shipped into the job directory `dir` within
    /// `limit` bytes; `root`: the delegate root (never shipped).
    pub fn ship(dir: &Path, paths: &[PathBuf], limit: u64, root: Option<&Path>) -> Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        let p = plan(paths, limit, root, &mut say_left_out)?;
        execute(&p, dir)
    }

    fn quiet() -> impl FnMut(String) {
        |_| {}
    }

    #[test]
    fn links_are_resolved_not_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p");
        fs::create_dir_all(p.join("a")).unwrap();
        fs::write(p.join("b"), b"").unwrap();
        std::os::unix::fs::symlink("../b", p.join("a/up")).unwrap();
        std::os::unix::fs::symlink(".", p.join("d")).unwrap();
        std::os::unix::fs::symlink("d/d/../../x", p.join("e")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", p.join("abs")).unwrap();
        assert!(stays_inside(&p, &p.join("a/up")));
        assert!(stays_inside(&p, &p.join("d")));
        assert!(!stays_inside(&p, &p.join("e")), "a chain of links out of the tree");
        assert!(!stays_inside(&p, &p.join("abs")));
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
        ship(job.path(), &[proj.clone(), single.clone()], 1 << 20, None).unwrap();
        assert_eq!(fs::read(job.path().join("proj/train.py")).unwrap(), b"print('hi')");
        assert_eq!(fs::read(job.path().join("proj/link.csv")).unwrap(), b"1,2\n");
        let e = fs::symlink_metadata(job.path().join("proj/out")).expect_err("an absolute link is left out");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "an absolute link is left out");
        let e = fs::symlink_metadata(job.path().join("proj/data/up")).expect_err("a link out of the tree is left out");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "a link out of the tree is left out");
        let mode = fs::metadata(job.path().join("run.sh")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(fs::read_to_string(job.path().join(SHIPPED)).unwrap(), "proj\nrun.sh\n");
        // Measured as the watcher counts: 2 dirs, 2 files, 1 link, 1 file.
        let p = plan(&[proj.clone(), single], 1 << 20, None, &mut quiet()).unwrap();
        assert_eq!(p.charged, 6 * BLOCK);
        // Over the budget: refused in one sentence, before anything is written.
        let job2 = tempfile::tempdir().unwrap();
        let e = ship(job2.path(), &[proj], 3 * BLOCK, None).unwrap_err().to_string();
        assert!(e.contains("larger than the site's job size limit"), "{e}");
        assert_eq!(fs::read_dir(job2.path()).unwrap().count(), 0, "nothing was written");
    }

    #[test]
    fn the_delegate_root_is_never_shipped() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("alice");
        let root = home.join(".delegate/jobs");
        fs::create_dir_all(root.join("20260101T000000-00000000")).unwrap();
        fs::write(home.join("notes.txt"), b"n").unwrap();
        let job = tempfile::tempdir().unwrap();
        let e = ship(job.path(), std::slice::from_ref(&home), 1 << 30, Some(&root))
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds the delegate root"), "{e}");
    }

    #[test]
    fn names_are_checked() {
        let why_refused = |paths: &[&str]| {
            let paths: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
            match shipped_names(&paths) {
                Err(ClientError::InvalidRequest(why)) => why,
                other => panic!("{paths:?}: expected a refusal, got {other:?}"),
            }
        };
        assert_eq!(
            why_refused(&["/x/spec"]),
            "cannot ship /x/spec: the name \"spec\" is one of delegate's own files in the job directory; rename it"
        );
        assert_eq!(why_refused(&["/x/a.py", "/y/a.py"]), "two files to ship are named a.py");
        assert_eq!(why_refused(&["/"]), "/ has no file name to ship it under");
        assert_eq!(shipped_names(&[PathBuf::from("train.py")]).unwrap(), vec!["train.py"]);
    }
}

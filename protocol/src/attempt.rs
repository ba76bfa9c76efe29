//! The attempts of a call: a call whose attempt ended without an outcome
//! because of its node (the node failed or was set down and Slurm requeued
//! the allocation) runs again, up to its `retries`
//! ([`crate::Resources::retries`]), each attempt from a clean start.
//!
//! A new attempt begins with [`start_afresh`]: the call's inputs (the
//! client's files and the shipped entries) move into a fresh directory
//! that takes the job directory's name, and the lost attempt's directory,
//! with everything it wrote, is kept beside it as `<job-id>.attempt-<n>`.
//! The fence is the directory itself: a lost attempt that comes back (a
//! machine cut off the network, then reconnected) holds the old
//! directory's descriptor and its sandbox the old directory's mount, so
//! whatever it still writes lands in `<job-id>.attempt-<n>`, never in the
//! new attempt's directory; readers only ever read the job directory's
//! name. The [`ATTEMPTS`] record in the new directory lists every earlier
//! attempt: its number, node, start, end and why it ended.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{renameat, renameat2, RenameFlags};
use nix::sys::stat::{mkdirat, Mode};

use crate::fsio::{atomic_write_at, open_dir_nofollow, read_bounded_at};
use crate::layout::{ATTEMPTS, CLIENT_FILES, SHIPPED};
use crate::shipped::parse_shipped_manifest;
use crate::{ProtocolError, Result};

/// The retries a call gets when it asks for none (or the site's
/// `max_retries` when lower).
pub const DEFAULT_RETRIES: u32 = 2;
/// The most retries any call or site may have.
pub const MAX_RETRIES: u32 = 10;
/// The bound of the [`ATTEMPTS`] record.
pub const MAX_ATTEMPTS_BYTES: u64 = 16 * 1024;
/// The longest reason kept for an attempt.
const MAX_WHY: usize = 300;

/// One earlier attempt of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub n: u32,
    /// The node it ran on (`-` when it never started).
    pub node: String,
    /// When its sandbox started (ms since the epoch; 0: never started).
    pub started_ms: u64,
    /// When the next attempt took over from it (ms since the epoch).
    pub ended_ms: u64,
    /// Why it ended, for people.
    pub why: String,
}

impl Attempt {
    /// The record's line: `<n> <node> <started_ms> <ended_ms> <why>`.
    pub fn to_line(&self) -> String {
        let why: String = crate::one_line(&self.why).chars().take(MAX_WHY).collect();
        let node = if node_ok(&self.node) { self.node.as_str() } else { "-" };
        format!("{} {node} {} {} {why}\n", self.n, self.started_ms, self.ended_ms)
    }

    /// Parses one line; `None` for anything else.
    pub fn parse(line: &str) -> Option<Attempt> {
        let mut w = line.trim_end_matches('\n').splitn(5, ' ');
        let n = w.next()?.parse().ok()?;
        let node = w.next().filter(|n| node_ok(n) || *n == "-")?.to_owned();
        let started_ms = w.next()?.parse().ok()?;
        let ended_ms = w.next()?.parse().ok()?;
        let why = w.next().unwrap_or("").chars().take(MAX_WHY).collect();
        Some(Attempt { n, node, started_ms, ended_ms, why })
    }
}

fn node_ok(node: &str) -> bool {
    !node.is_empty() && node.len() <= 64 && node.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// The attempts a record lists, in order (lines that do not parse are
/// left out: the record is the student's own file, shown, and counted
/// only to bound the re-runs).
pub fn parse_attempts(text: &str) -> Vec<Attempt> {
    text.lines().filter_map(Attempt::parse).collect()
}

/// The record's text.
pub fn attempts_text(attempts: &[Attempt]) -> String {
    attempts.iter().map(Attempt::to_line).collect()
}

/// The earlier attempts recorded in the job directory `dir` (none when it
/// has no record or the record cannot be read).
pub fn read_attempts(dir: impl AsFd, dir_path: &Path, uid: Option<u32>) -> Vec<Attempt> {
    match read_bounded_at(dir, dir_path, ATTEMPTS, MAX_ATTEMPTS_BYTES, uid) {
        Ok(b) => parse_attempts(&String::from_utf8_lossy(&b)),
        Err(_) => Vec::new(),
    }
}

/// One line for people: "ran again on worker1: worker2 was lost", or for
/// several earlier attempts, each of them.
pub fn history_line(attempts: &[Attempt], now_on: Option<&str>) -> Option<String> {
    let last = attempts.last()?;
    let lost = |a: &Attempt| match a.node.as_str() {
        "-" => format!("attempt {} was lost before it started", a.n),
        n => format!("{n} was lost"),
    };
    let whys: Vec<String> = attempts.iter().map(lost).collect();
    let head = match now_on {
        Some(h) if !h.is_empty() => format!("ran again on {h} (attempt {})", last.n + 1),
        _ => format!("runs again (attempt {})", last.n + 1),
    };
    Some(format!("{head}: {}", whys.join(", then ")))
}

/// The name the lost attempt `n` of job `name` is kept under, beside it.
pub fn aside_name(name: &str, n: u32) -> String {
    format!("{name}.attempt-{n}")
}

/// Starts a new attempt of the job directory `name` under `parent`: the
/// inputs of `old` (the job directory as the lost attempt left it) move
/// into a fresh directory holding `attempts` as its record and `extra`
/// files (a map's new claim), which then takes the name; the old
/// directory is kept as [`aside_name`]`(name, lost)`. Returns the new
/// directory's descriptor.
pub fn start_afresh(
    parent: impl AsFd,
    parent_path: &Path,
    name: &str,
    old: impl AsFd,
    attempts: &[Attempt],
    extra: &[(&str, &[u8])],
) -> Result<OwnedFd> {
    let lost = attempts.last().map_or(1, |a| a.n);
    let io = |what: &str, e: Errno| ProtocolError::io(parent_path.join(what).display().to_string(), e);
    let fresh = format!(".{name}.attempt-{}.new", lost + 1);
    match mkdirat(parent.as_fd(), fresh.as_str(), Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(io(&fresh, e)),
    }
    let fresh_path = parent_path.join(&fresh);
    let new = open_dir_nofollow(&fresh_path)?;
    atomic_write_at(&new, &fresh_path, ATTEMPTS, attempts_text(attempts).as_bytes(), 0o644)?;
    for (file, bytes) in extra {
        atomic_write_at(&new, &fresh_path, file, bytes, 0o644)?;
    }
    for input in inputs(&old, &parent_path.join(name)) {
        match renameat(old.as_fd(), input.as_str(), new.as_fd(), input.as_str()) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(io(&format!("{name}/{input}"), e)),
        }
    }
    let aside = aside_name(name, lost);
    let (p, dirs) = (parent.as_fd(), (fresh.as_str(), name));
    match renameat2(p, dirs.0, p, dirs.1, RenameFlags::RENAME_EXCHANGE) {
        Ok(()) => renameat(p, dirs.0, p, aside.as_str()).map_err(|e| io(&aside, e))?,
        // A filesystem without the exchange (some FUSE ones): two renames,
        // the name missing for a moment between them.
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {
            renameat(p, name, p, aside.as_str()).map_err(|e| io(&aside, e))?;
            renameat(p, dirs.0, p, name).map_err(|e| io(name, e))?;
        }
        Err(e) => return Err(io(name, e)),
    }
    Ok(new)
}

/// The call's inputs in `dir`: the client's files and the shipped entries.
fn inputs(dir: impl AsFd, dir_path: &Path) -> Vec<String> {
    let mut names: Vec<String> = CLIENT_FILES.iter().map(|s| (*s).to_owned()).collect();
    if let Ok(b) = read_bounded_at(&dir, dir_path, SHIPPED, 64 * 1024, None) {
        if let Ok(shipped) = parse_shipped_manifest(&String::from_utf8_lossy(&b)) {
            names.extend(shipped);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn lost(n: u32, node: &str) -> Attempt {
        Attempt {
            n,
            node: node.into(),
            started_ms: 1_000 * u64::from(n),
            ended_ms: 2_000 * u64::from(n),
            why: "its node was lost (Slurm requeued the call: NODE_FAIL)".into(),
        }
    }

    #[test]
    fn lines_round_trip_and_junk_is_left_out() {
        let a = vec![lost(1, "worker2"), lost(2, "node-1.lab")];
        assert_eq!(parse_attempts(&attempts_text(&a)), a);
        assert_eq!(parse_attempts("x worker1 1 2 why\n1 a/b 1 2 why\n1 w 1\n"), vec![]);
        let odd = Attempt {
            node: "bad node\n".into(),
            why: "two\nlines".into(),
            ..lost(1, "w")
        };
        let back = parse_attempts(&odd.to_line());
        assert_eq!(back[0].node, "-");
        assert_eq!(back[0].why, "two lines");
    }

    #[test]
    fn the_history_names_every_lost_attempt() {
        assert_eq!(history_line(&[], Some("w1")), None);
        assert_eq!(
            history_line(&[lost(1, "worker2")], Some("worker1")).as_deref(),
            Some("ran again on worker1 (attempt 2): worker2 was lost")
        );
        assert_eq!(
            history_line(&[lost(1, "worker2"), lost(2, "-")], None).as_deref(),
            Some("runs again (attempt 3): worker2 was lost, then attempt 2 was lost before it started")
        );
    }

    /// The new attempt's directory holds the inputs and the record, under
    /// the job's name; the lost attempt's outputs stay in the old inode,
    /// kept aside, and what it writes later lands there.
    #[test]
    fn a_fresh_start_moves_the_inputs_and_fences_the_old_directory() {
        let root = tempfile::tempdir().unwrap();
        let job = root.path().join("J");
        fs::create_dir(&job).unwrap();
        for (f, t) in [
            ("spec", "S"),
            ("payload", "P"),
            ("shipped", "data\n"),
            ("started", "T"),
            ("stdout", "1"),
        ] {
            fs::write(job.join(f), t).unwrap();
        }
        fs::create_dir(job.join("data")).unwrap();
        fs::write(job.join("data/x"), "x").unwrap();
        fs::write(job.join("made-by-the-call"), "junk").unwrap();
        let parent = open_dir_nofollow(root.path()).unwrap();
        let old = open_dir_nofollow(&job).unwrap();
        let rec = [lost(1, "worker2")];
        let new = start_afresh(&parent, root.path(), "J", &old, &rec, &[("claim", b"1_0 w 1\n")]).unwrap();
        let mut names: Vec<_> = fs::read_dir(&job).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["attempts", "claim", "data", "payload", "shipped", "spec"]);
        assert_eq!(fs::read_to_string(job.join("data/x")).unwrap(), "x");
        assert_eq!(read_attempts(&new, &job, None), rec);
        let aside = root.path().join("J.attempt-1");
        assert!(aside.join("started").exists() && aside.join("made-by-the-call").exists());
        // The lost attempt writes through its old descriptor: not into J.
        atomic_write_at(&old, &aside, "outcome", b"late", 0o644).unwrap();
        assert!(!job.join("outcome").exists() && aside.join("outcome").exists());
    }
}

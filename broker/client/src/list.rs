//! Listing the jobs of a delegate root, and what each one runs (the
//! command, or the name of the Python function).

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;

use delegate_protocol::{
    list_entries, open_regular_at, read_bounded_at, read_record_at, Fingerprint, JobId, Spec, State, Task, PAYLOAD,
    RAISED,
};
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, SFlag};
use serde::{Deserialize, Serialize};

use crate::{Client, JobStatus, Result};

const MAX_JOBS_LISTED: usize = 100_000;
/// The magic of a Python payload (python/pysrc/delegate_sandbox): the
/// header that follows it is one line of JSON, at most
/// [`MAX_PAYLOAD_HEADER`] bytes.
use delegate_protocol::PYTHON_PAYLOAD_MAGIC as PAYLOAD_MAGIC;
const MAX_PAYLOAD_HEADER: usize = 4096;
/// Longest description shown for a job (characters).
pub const MAX_WHAT_CHARS: usize = 80;

/// A job's status and what it runs, as `delegate list` and
/// `delegate.jobs()` show it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobSummary {
    #[serde(flatten)]
    pub status: JobStatus,
    /// The command line (`echo hi`), or the Python function's name
    /// (`square()`), or `python call` when the payload does not name it.
    pub what: String,
    /// The state in the user's words: `raised ZeroDivisionError` for a
    /// Python call that completed by raising, `cancelled: <why>` when the
    /// cancellation said why, else the state's name.
    pub outcome: String,
    /// The CPU model of the machine the call ran on, and its hardware
    /// class (crate `delegate_protocol::Fingerprint::class`), when the
    /// worker recorded them.
    pub cpu: Option<String>,
    pub machine: Option<String>,
}

/// The part of a payload's JSON header that names the call.
#[derive(Deserialize)]
struct PayloadHeader {
    #[serde(default)]
    function: Option<String>,
}

impl Client {
    /// The ids of all job directories in the root, oldest first.
    pub fn job_ids(&self) -> Result<Vec<JobId>> {
        let names = list_entries(&self.root_fd, &self.root, MAX_JOBS_LISTED)?;
        let mut ids: Vec<JobId> = names
            .iter()
            .filter_map(|n| JobId::parse(n).ok())
            .filter(|id| {
                fstatat(&self.root_fd, id.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// All jobs in the root, oldest first; unreadable directories are
    /// skipped with a warning.
    pub fn list(&self) -> Result<Vec<JobStatus>> {
        self.list_ids(self.job_ids()?)
    }

    /// The `limit` most recent jobs (all with `None`), oldest first, each
    /// with what it runs (and, with `machines`, the machine it ran on: one
    /// more file per job, for the listings that show it). One Slurm query
    /// for all of them.
    pub fn list_summaries(&self, limit: Option<usize>, machines: bool) -> Result<Vec<JobSummary>> {
        let mut ids = self.job_ids()?;
        let mut jobs = match limit {
            Some(n) => {
                // Ids order jobs by their second only: the jobs of the
                // boundary second are all read, ordered by submission time,
                // before the last n are kept.
                let mut from = ids.len().saturating_sub(n);
                if let Some(edge) = ids.get(from).map(|id| second_of(id).to_owned()) {
                    while from > 0 && second_of(&ids[from - 1]) == edge {
                        from -= 1;
                    }
                }
                let mut jobs = self.list_ids(ids.split_off(from))?;
                jobs = jobs.split_off(jobs.len().saturating_sub(n));
                jobs
            }
            None => self.list_ids(ids)?,
        };
        jobs.shrink_to_fit();
        Ok(jobs
            .into_iter()
            .map(|status| {
                // One open of the job directory for both.
                let dir = self.job_dir(&status.id);
                let fd = self.open_job_dir(&status.id).ok();
                let what = fd.as_ref().map_or_else(|| "?".to_owned(), |fd| what_at(fd, &dir));
                let outcome = words(&status, || fd.as_ref().and_then(|fd| self.raised_at(fd, &dir)));
                let fp: Option<Fingerprint> = fd
                    .as_ref()
                    .filter(|_| machines)
                    .and_then(|fd| read_record_at(fd, &dir, None).ok());
                let cpu = fp.as_ref().and_then(|f| f.cpu_model.clone());
                let machine = fp.as_ref().map(Fingerprint::class);
                JobSummary { status, what, outcome, cpu, machine }
            })
            .collect())
    }

    fn list_ids(&self, ids: Vec<JobId>) -> Result<Vec<JobStatus>> {
        let mut jobs = Vec::new();
        for id in ids {
            match self.load(&id) {
                Ok(mut j) => {
                    // A finished job needs its directory no more: a root of
                    // thousands of jobs must not hold thousands of
                    // descriptors (EMFILE would make jobs look unreadable).
                    if j.outcome.is_some() {
                        j.fd = None;
                    }
                    jobs.push(j)
                }
                Err(e) => tracing::warn!(job = %id, error = %e, "skipping an unreadable job directory"),
            }
        }
        let mut jobs = self.reconcile(&mut jobs, true)?;
        order_by_submission(&mut jobs);
        Ok(jobs)
    }

    /// What a job runs, in one short line: its command, or the name of
    /// its Python function from the payload's header. Everything read is
    /// the user's own (untrusted) data: bounded, control characters
    /// replaced; `?` when the spec cannot be read.
    pub fn what(&self, id: &JobId) -> String {
        match self.open_job_dir(id) {
            Ok(fd) => what_at(&fd, &self.job_dir(id)),
            Err(_) => "?".to_owned(),
        }
    }

    /// A job's state in the user's words (see [`JobSummary::outcome`]).
    pub fn outcome_words(&self, s: &JobStatus) -> String {
        words(s, || {
            let fd = self.open_job_dir(&s.id).ok()?;
            self.raised_at(&fd, &self.job_dir(&s.id))
        })
    }

    /// The type name in the `raised` file of the job directory `fd`
    /// (`dir`), when it holds one.
    fn raised_at(&self, fd: &OwnedFd, dir: &Path) -> Option<String> {
        let raw = read_bounded_at(fd, dir, RAISED, 256, Some(self.uid)).ok()?;
        exception_name(&raw)
    }
}

/// What the job in directory `fd` (`dir`) runs (see [`Client::what`]).
fn what_at(fd: &OwnedFd, dir: &Path) -> String {
    let spec: Spec = match read_record_at(fd, dir, None) {
        Ok(s) => s,
        Err(_) => return "?".to_owned(),
    };
    match spec.task {
        Task::Command { argv } => describe_argv(&argv),
        Task::Python { .. } => {
            let header = open_regular_at(fd, dir, PAYLOAD).ok().flatten().and_then(|f| {
                let mut buf = Vec::new();
                f.take((PAYLOAD_MAGIC.len() + MAX_PAYLOAD_HEADER) as u64)
                    .read_to_end(&mut buf)
                    .ok()?;
                python_function(&buf)
            });
            match header {
                Some(name) => format!("{}()", clean(&name)),
                None => "python call".to_owned(),
            }
        }
    }
}

/// A job's state in the user's words; `raised` reads the `raised` file
/// (only for a completed job).
fn words(s: &JobStatus, raised: impl FnOnce() -> Option<String>) -> String {
    match s.state {
        State::Completed => raised().map_or_else(|| "completed".to_owned(), |t| format!("raised {t}")),
        State::Cancelled if s.reason.starts_with("cancelled: ") => s.reason.clone(),
        other => other.as_str().to_owned(),
    }
}

/// An exception's (qualified) type name: a dotted identifier of at most
/// 200 characters; None for anything else.
fn exception_name(raw: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(raw).ok()?.trim();
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.split('.').all(|p| {
            p.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && p.chars().all(|c| c.is_alphanumeric() || c == '_')
        });
    ok.then(|| name.to_owned())
}

/// The function named by a payload's header (the payload's first bytes).
fn python_function(head: &[u8]) -> Option<String> {
    let rest = head.strip_prefix(PAYLOAD_MAGIC)?;
    let end = rest.iter().position(|&b| b == b'\n')?;
    let header: PayloadHeader = serde_json::from_slice(&rest[..end]).ok()?;
    header.function.filter(|f| !f.trim().is_empty())
}

/// A command line as a shell would show it (arguments with spaces or quotes
/// single-quoted), bounded.
fn describe_argv(argv: &[String]) -> String {
    // A jobs file's Python job: `module:function` rather than its bootstrap.
    if let [py, c, boot, module, function, ..] = argv {
        if py == "python3" && c == "-c" && boot == crate::jobsfile::PYTHON_BOOTSTRAP {
            return format!("{}:{}()", clean(module), clean(function));
        }
    }
    let mut out = String::new();
    for (i, a) in argv.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let plain = !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
        if plain {
            out.push_str(a);
        } else {
            out.push('\'');
            out.push_str(&a.replace('\'', r"'\''"));
            out.push('\'');
        }
        if out.chars().count() > MAX_WHAT_CHARS {
            break;
        }
    }
    clean(&out)
}

/// One line of at most [`MAX_WHAT_CHARS`] characters, control characters
/// shown as `?`.
fn clean(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX_WHAT_CHARS)
        .collect();
    if s.chars().count() > MAX_WHAT_CHARS {
        out.pop();
        out.push('…');
    }
    out
}

/// The second a job id was made in (its part before the random suffix).
fn second_of(id: &JobId) -> &str {
    let s = id.as_str();
    s.split_once('-').map_or(s, |(t, _)| t)
}

/// Oldest first: by the id's second, then by the spec's creation time in
/// milliseconds (ids of one second differ only by their random part).
fn order_by_submission(jobs: &mut [JobStatus]) {
    jobs.sort_by(|a, b| {
        (second_of(&a.id), a.submitted_ms.unwrap_or(0), a.id.as_str()).cmp(&(
            second_of(&b.id),
            b.submitted_ms.unwrap_or(0),
            b.id.as_str(),
        ))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_header_names_the_function() {
        let p = b"DLGTPY1\n{\"cloudpickle\": \"3.1.2\", \"function\": \"square\", \"python\": \"3.11.2\"}\n\x80\x04...";
        assert_eq!(python_function(p).as_deref(), Some("square"));
        assert_eq!(python_function(b"DLGTPY1\n{\"python\": \"3.11\"}\nxx"), None);
        assert_eq!(python_function(b"DLGTPY1\n{\"function\": \"f\"}"), None, "no end of header");
        assert_eq!(python_function(b"garbage\n{}\n"), None);
        assert_eq!(python_function(b"DLGTPY1\n[1]\n"), None);
    }

    #[test]
    fn only_dotted_names_are_exception_names() {
        assert_eq!(exception_name(b"ZeroDivisionError").as_deref(), Some("ZeroDivisionError"));
        assert_eq!(exception_name(b"mod.sub.MyError\n").as_deref(), Some("mod.sub.MyError"));
        assert_eq!(exception_name(b"\x1b[31mEvil"), None);
        assert_eq!(exception_name(b"a b"), None);
        assert_eq!(exception_name(b"1abc"), None);
        assert_eq!(exception_name(b"a..b"), None);
        assert_eq!(exception_name(b""), None);
        assert_eq!(exception_name("x".repeat(201).as_bytes()), None);
    }

    #[test]
    fn jobs_of_one_second_in_submission_order() {
        let job = |id: &str, ms: u64| JobStatus {
            id: JobId::parse(id).unwrap(),
            slurm_id: None,
            state: delegate_protocol::outcome::State::Completed,
            reason: String::new(),
            exit_code: None,
            refused: false,
            oom_killed: false,
            host: None,
            submitted_ms: Some(ms),
            started_ms: None,
            finished_ms: None,
            elapsed_secs: None,
        };
        let mut jobs = vec![
            job("20261124T054846-ffffffff", 1_000),
            job("20261124T054847-00000001", 2_900),
            job("20261124T054847-aaaaaaaa", 2_100),
            job("20261124T054847-0000000b", 2_500),
        ];
        order_by_submission(&mut jobs);
        let order: Vec<u64> = jobs.iter().filter_map(|j| j.submitted_ms).collect();
        assert_eq!(order, vec![1_000, 2_100, 2_500, 2_900]);
        assert_eq!(second_of(&jobs[1].id), "20261124T054847");
    }

    #[test]
    fn argv_is_quoted_and_bounded() {
        let argv: Vec<String> = ["echo", "hi there", "it's"].iter().map(|s| s.to_string()).collect();
        let boot = crate::jobsfile::PYTHON_BOOTSTRAP.to_owned();
        let py = ["python3", "-c", &boot, "train", "main", "[1]", "{}"].map(String::from);
        assert_eq!(describe_argv(&py), "train:main()");
        assert_eq!(describe_argv(&argv), r"echo 'hi there' 'it'\''s'");
        let long = vec!["x".repeat(500)];
        let d = describe_argv(&long);
        assert_eq!(d.chars().count(), MAX_WHAT_CHARS);
        assert!(d.ends_with('…'));
        assert_eq!(clean("a\nb\x1b[31m"), "a?b?[31m");
    }
}

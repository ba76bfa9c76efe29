//! Jobs files (`delegate submit -f jobs.yml`): a list of jobs, each with its
//! command (or Python `module:function` and arguments), image, resources,
//! count and environment. The file is read and validated whole — syntax,
//! meaning ([`schema`]) and the site policy — before anything is submitted,
//! every problem reported with its line; then all its calls are submitted
//! together (calls with the same resources share one submission), and
//! either all are submitted or none stays. What was submitted is recorded
//! under the delegate root ([`record`]) so `status -f` / `wait -f` follow it.

pub mod record;
pub mod schema;
pub mod yaml;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use delegate_protocol::policy::Policy;
use delegate_protocol::JobId;

pub use record::Record;
pub use schema::{Entry, MAX_CALLS, PYTHON_BOOTSTRAP};

use crate::{Client, ClientError, JobHandle, Result, SubmitRequest};

/// The bound of a jobs file's size.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// A problem of a jobs file and its line (1-based; 0: the file as a whole).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    pub line: usize,
    pub message: String,
}

/// Every problem found in one jobs file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct JobsFileError {
    pub path: PathBuf,
    pub errors: Vec<LineError>,
}

impl fmt::Display for JobsFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(
            f,
            "{} has {n} problem{}; nothing was submitted:",
            self.path.display(),
            if n == 1 { "" } else { "s" }
        )?;
        for e in &self.errors {
            write!(f, "\n  {}:{}: {}", self.path.display(), e.line, e.message)?;
        }
        Ok(())
    }
}

/// A jobs file, read and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct JobsFile {
    /// Its canonical path (the key of its record).
    pub path: PathBuf,
    pub entries: Vec<Entry>,
}

impl JobsFile {
    /// Reads and checks the file (syntax and meaning, not yet the policy).
    pub fn load(path: &Path) -> std::result::Result<JobsFile, JobsFileError> {
        let fail = |line, message: String| JobsFileError {
            path: path.to_path_buf(),
            errors: vec![LineError { line, message }],
        };
        let canonical = std::fs::canonicalize(path).map_err(|e| fail(0, format!("cannot read it: {e}")))?;
        let text = read_bounded(&canonical).map_err(|m| fail(0, m))?;
        let root = yaml::parse(&text)
            .map_err(|e| fail(e.line, e.message))?
            .ok_or_else(|| fail(0, "the file is empty".into()))?;
        let base = canonical.parent().unwrap_or(Path::new("/"));
        let entries =
            schema::entries(&root, base).map_err(|errors| JobsFileError { path: path.to_path_buf(), errors })?;
        Ok(JobsFile { path: canonical, entries })
    }

    /// Every call's request, in file order.
    pub fn requests(&self) -> impl Iterator<Item = &SubmitRequest> {
        self.entries.iter().flat_map(|e| e.requests.iter())
    }
}

fn read_bounded(path: &Path) -> std::result::Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".into())
}

/// What `submit_jobs_file` did: each job's name and its calls' handles.
pub type Submitted = Vec<(String, Vec<JobHandle>)>;

impl Client {
    /// Checks every call of `file` against the site policy (the rules the
    /// worker applies), so a refusal is named with its line before anything
    /// is submitted.
    pub fn check_jobs_file(&self, file: &JobsFile) -> Result<()> {
        let policy = Policy::load_for_client()?;
        let probe_dir = self.root().join("jobs-file-check");
        let mut errors = Vec::new();
        for e in &file.entries {
            let Some(req) = e.requests.first() else { continue };
            let image = req.image.clone().unwrap_or_else(|| policy.default_image.clone());
            let problem = self
                .spec_for(req, &image, req.retries.unwrap_or(0))
                .map_err(|e| e.to_string())
                .and_then(|spec| policy.check(&spec, self.uid, &probe_dir).map_err(|v| v.to_string()));
            if let Err(message) = problem {
                errors.push(LineError {
                    line: e.line,
                    message: format!("job `{}`: {message}", e.name),
                });
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ClientError::JobsFile(JobsFileError { path: file.path.clone(), errors }))
        }
    }

    /// Submits every call of `file`: calls asking for the same resources
    /// and image go in one submission ([`Client::submit_many`]); when one
    /// submission fails, the calls already submitted are cancelled, so the
    /// file is submitted whole or not at all. Records the result for
    /// [`Client::jobs_file_record`].
    pub fn submit_jobs_file(&self, file: &JobsFile) -> Result<Submitted> {
        self.check_jobs_file(file)?;
        // Group the calls by what a submission must share, keeping file order.
        type Key = (delegate_protocol::Resources, Option<String>);
        let mut groups: BTreeMap<Key, Vec<(usize, usize)>> = BTreeMap::new();
        let mut order: Vec<Key> = Vec::new();
        for (ei, e) in file.entries.iter().enumerate() {
            for (ci, r) in e.requests.iter().enumerate() {
                let k = (r.resources.clone(), r.image.clone());
                if !groups.contains_key(&k) {
                    order.push(k.clone());
                }
                groups.entry(k).or_default().push((ei, ci));
            }
        }
        let mut handles: Vec<Vec<Option<JobHandle>>> =
            file.entries.iter().map(|e| vec![None; e.requests.len()]).collect();
        let mut submitted: Vec<JobId> = Vec::new();
        for k in &order {
            let members = &groups[k];
            // A multi-node call is submitted alone (its own allocation).
            let per = if k.0.nodes > 1 { 1 } else { crate::MAX_ARRAY };
            for chunk in members.chunks(per) {
                let reqs: Vec<SubmitRequest> =
                    chunk.iter().map(|&(e, c)| file.entries[e].requests[c].clone()).collect();
                match self.submit_many(&reqs) {
                    Ok(hs) => {
                        for (&(e, c), h) in chunk.iter().zip(hs) {
                            submitted.push(h.id.clone());
                            handles[e][c] = Some(h);
                        }
                    }
                    Err(err) => {
                        if !submitted.is_empty() {
                            if let Err(c) = self.cancel(&submitted) {
                                tracing::warn!(error = %c, "cannot cancel the calls already submitted");
                            }
                        }
                        return Err(err);
                    }
                }
            }
        }
        let out: Submitted = file
            .entries
            .iter()
            .zip(handles)
            .map(|(e, hs)| (e.name.clone(), hs.into_iter().flatten().collect()))
            .collect();
        let rec = Record::new(&file.path, &out);
        rec.save(self)?;
        Ok(out)
    }

    /// The record of the last submission of the jobs file at `path`.
    pub fn jobs_file_record(&self, path: &Path) -> Result<Record> {
        Record::load(self, path)
    }
}

//! The user side: submit, status, wait, cancel, list, and readers for a
//! job's files. Used by the `delegate` CLI and (through PyO3) the Python
//! shim, so nothing here prints or exits.
//!
//! All state lives in the job directory and in Slurm, so any new process can
//! reattach to any job by id. The state of a job is computed by one function,
//! [`decide`], shared by status, wait, cancel and list.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
use serde::Serialize;

use crate::policy::{Policy, PolicyError};
use crate::protocol::{
    self, atomic_write_at, check_owner, encode, now_ms, open_dir_nofollow, read_bounded_at, read_record_at,
    write_record_at, JobId, Outcome, ProtocolError, Resources, Spec, Started, State, Task, Writer,
    MAX_PAYLOAD_BYTES,
};
use crate::slurm::{self, BatchRequest, Slurm, SlurmError, SlurmJob, SlurmPhase};

/// Environment variable naming the delegate root.
pub const ROOT_ENV: &str = "DELEGATE_ROOT";
/// Environment variable lowering the number of calls per shared allocation.
pub const CALLS_PER_ALLOCATION_ENV: &str = "DELEGATE_CALLS_PER_ALLOCATION";
/// Environment variable naming the runner the batch script executes.
pub const RUNNER_ENV: &str = "DELEGATE_RUNNER";
pub const DEFAULT_RUNNER: &str = "/usr/local/bin/sandbox-runner";
/// A job directory without a `slurm-id` after this long was never submitted.
pub const SUBMIT_GRACE_SECS: u64 = 60;
/// How much of the end of Slurm's log of a job is read.
pub const LOG_TAIL_BYTES: u64 = 64 * 1024;
/// The line prefix with which the runner explains a refusal in Slurm's log.
pub const REFUSED_PREFIX: &str = "delegate: refused: ";
/// How often `wait` asks Slurm about the jobs still waited for.
pub const SLURM_INTERVAL: Duration = Duration::from_secs(2);
/// How long `cancel` waits for the jobs to end.
pub const CANCEL_WAIT: Duration = Duration::from_secs(15);
const MAX_JOBS_LISTED: usize = 100_000;
const MAX_SLURM_ID_BYTES: u64 = 64;
/// Upper bound of one job array (Slurm's default MaxArraySize is 1001).
pub const MAX_ARRAY: usize = 1000;
/// Slurm time allowed per call of a shared allocation on top of the call's
/// own limit (container create, start, removal; output draining).
pub const SHARED_CALL_ALLOWANCE_SECS: u64 = 30;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot find the home directory: $HOME is unset and uid {0} has no passwd entry")]
    NoHome(u32),
    #[error("cannot use the delegate root {path}: {reason}")]
    Root { path: String, reason: String },
    #[error("no job {id} in {root}")]
    NoSuchJob { id: String, root: String },
    #[error("invalid job request: {0}")]
    InvalidRequest(String),
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
    #[error("{0}")]
    Policy(#[from] PolicyError),
    #[error("{0}")]
    Slurm(#[from] SlurmError),
    #[error("job {id} could not be submitted: {reason}")]
    SubmitFailed { id: JobId, reason: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

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
    /// `$DELEGATE_RUNNER`, partition from `$DELEGATE_PARTITION`.
    pub fn from_env() -> Result<Config> {
        let root = match std::env::var_os(ROOT_ENV).filter(|v| !v.is_empty()) {
            Some(r) => PathBuf::from(r),
            None => default_root()?,
        };
        let runner = std::env::var_os(RUNNER_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
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
        Ok(Config {
            root,
            runner,
            slurm: Slurm::from_env(),
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

/// What to run and with which resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubmitRequest {
    pub task: Task,
    /// `None`: the site policy's default image.
    pub image: Option<String>,
    pub cpus: u32,
    pub mem_bytes: u64,
    pub time_limit_secs: u64,
    pub env: Vec<(String, String)>,
    /// Opaque bytes for the sandbox (a pickled call); at most [`MAX_PAYLOAD_BYTES`].
    pub payload: Option<Vec<u8>>,
    /// Submit held: the job stays pending until `scontrol release <slurm-id>`.
    pub hold: bool,
}

impl SubmitRequest {
    /// A request with the default resources (1 CPU, 1G, 10 minutes).
    pub fn new(task: Task) -> SubmitRequest {
        let r = Resources::default();
        SubmitRequest {
            task,
            image: None,
            cpus: r.cpus,
            mem_bytes: r.mem_bytes,
            time_limit_secs: r.time_limit_secs,
            env: Vec::new(),
            payload: None,
            hold: false,
        }
    }

    /// A command job (argv, no shell).
    pub fn command(argv: Vec<String>) -> SubmitRequest {
        SubmitRequest::new(Task::Command { argv })
    }
}

/// A submitted job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JobHandle {
    pub id: JobId,
    pub slurm_id: String,
    pub dir: PathBuf,
}

fn serialize_state<S: serde::Serializer>(s: &State, ser: S) -> std::result::Result<S::Ok, S::Error> {
    ser.serialize_str(s.as_str())
}

/// What is known about a job, for humans and for `--json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobStatus {
    pub id: JobId,
    pub slurm_id: Option<String>,
    /// `pending`, `running`, `completed`, `failed`, `timed-out`, `cancelled`, `lost`.
    #[serde(serialize_with = "serialize_state")]
    pub state: State,
    /// One human-readable sentence.
    pub reason: String,
    pub exit_code: Option<i32>,
    pub refused: bool,
    pub oom_killed: bool,
    pub host: Option<String>,
    pub submitted_ms: Option<u64>,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    pub elapsed_secs: Option<f64>,
}

impl JobStatus {
    pub fn is_terminal(&self) -> bool {
        self.state.is_terminal()
    }
}

/// Which output stream of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn file_name(self) -> &'static str {
        match self {
            Stream::Stdout => protocol::STDOUT,
            Stream::Stderr => protocol::STDERR,
        }
    }
}

// ---------------------------------------------------------------------------
// The reconciliation decision (pure)
// ---------------------------------------------------------------------------

/// What Slurm says about a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlurmView<'a> {
    /// Slurm was not asked this time (a file-only check).
    NotAsked,
    /// Slurm could not be asked (squeue failed); the job's fate is unknown.
    Unavailable,
    /// squeue does not list the job any more.
    Absent,
    Present(&'a SlurmJob),
}

/// What the job directory and Slurm say about a job without an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts<'a> {
    /// A `slurm-id` file exists.
    pub submitted: bool,
    /// Seconds since the job was created.
    pub age_secs: u64,
    /// A `started` file exists; the host it names.
    pub started: Option<&'a str>,
    /// The `cancel` marker exists.
    pub cancel_requested: bool,
    /// The call shares its Slurm allocation with other calls of the same
    /// submission, which run one after another in it.
    pub shared: bool,
    pub slurm: SlurmView<'a>,
}

/// What Slurm's log of the batch script says, read only when needed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogFacts {
    /// The text after [`REFUSED_PREFIX`] on the last such line.
    pub refusal: Option<String>,
    /// The last non-empty line, for a lost job's reason.
    pub last_line: Option<String>,
}

/// The decision for a job without an outcome file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Still pending or running.
    Live { state: State, reason: String },
    /// Over without an outcome from the runner: one must be derived and
    /// written (unless the runner's appears meanwhile).
    Ended { state: State, reason: String, refused: bool },
}

/// How the calls of one submission share exclusive allocations: `None` for
/// one Slurm job per call, else the calls (indices) of each allocation, in
/// the order each runs them. Calls are dealt round-robin so a map's results
/// arrive roughly in order; there are at least as many allocations as the
/// partition has usable nodes (up to one per call), none holds more than
/// `per_allocation` calls, and each fits the partition's time limit with
/// [`SHARED_CALL_ALLOWANCE_SECS`] per call. Sharing only pays off when some
/// allocation runs at least two calls.
pub fn plan_allocations(
    calls: usize,
    per_allocation: u32,
    time_limit_secs: u64,
    partition: &slurm::PartitionInfo,
) -> Option<Vec<Vec<usize>>> {
    if calls < 2 || per_allocation < 2 {
        return None;
    }
    let per_call = time_limit_secs.saturating_add(SHARED_CALL_ALLOWANCE_SECS);
    // Slurm's limit is rounded up to minutes with one minute of slack.
    let fit_by_time = match partition.max_time_secs {
        Some(max) => (max.saturating_sub(120) / per_call.max(1)) as usize,
        None => usize::MAX,
    };
    let per = (per_allocation as usize).min(fit_by_time);
    if per < 2 {
        return None;
    }
    let k = calls
        .min(partition.nodes.max(1) as usize)
        .max(calls.div_ceil(per))
        .min(MAX_ARRAY);
    if k >= calls || calls.div_ceil(k) > per {
        return None;
    }
    let mut groups = vec![Vec::with_capacity(calls.div_ceil(k)); k];
    for i in 0..calls {
        groups[i % k].push(i);
    }
    Some(groups)
}

/// Decides the state of a job that has no outcome file. `log` is called
/// only when the job is over according to Slurm.
pub fn decide(f: &Facts<'_>, log: impl FnOnce() -> LogFacts) -> Verdict {
    let cancel_note = if f.cancel_requested { "; cancellation requested" } else { "" };
    let live_running = || Verdict::Live {
        state: State::Running,
        reason: match f.started {
            Some(h) if !h.is_empty() => format!("running on {h}{cancel_note}"),
            _ => format!("running{cancel_note}"),
        },
    };
    if !f.submitted {
        if f.age_secs > SUBMIT_GRACE_SECS {
            return if f.cancel_requested {
                Verdict::Ended {
                    state: State::Cancelled,
                    reason: "cancelled by the user before it was submitted to Slurm".into(),
                    refused: false,
                }
            } else {
                Verdict::Ended {
                    state: State::Failed,
                    reason: format!(
                        "the job was never submitted (no Slurm job id was recorded within {SUBMIT_GRACE_SECS} s)"
                    ),
                    refused: false,
                }
            };
        }
        return Verdict::Live {
            state: State::Pending,
            reason: format!("being submitted to Slurm{cancel_note}"),
        };
    }
    if f.shared && f.started.is_none() && f.cancel_requested {
        // Its allocation runs other calls too, so Slurm is not asked to
        // cancel it: the call is over now. (A runner reaching it later
        // skips it; one starting it at this moment sees the marker and
        // stops it.)
        return Verdict::Ended {
            state: State::Cancelled,
            reason: "cancelled by the user before it started".into(),
            refused: false,
        };
    }
    let (slurm_state, slurm_reason) = match f.slurm {
        SlurmView::NotAsked | SlurmView::Unavailable => {
            return if f.started.is_some() {
                live_running()
            } else {
                Verdict::Live {
                    state: State::Pending,
                    reason: if f.slurm == SlurmView::Unavailable {
                        format!("submitted; Slurm could not be asked about it{cancel_note}")
                    } else {
                        format!("submitted{cancel_note}")
                    },
                }
            };
        }
        SlurmView::Present(j) => match slurm::phase(&j.state) {
            SlurmPhase::Queued if f.started.is_none() => {
                let why = match j.reason.as_str() {
                    "" | "None" => String::new(),
                    r => format!(" ({r})"),
                };
                return Verdict::Live {
                    state: State::Pending,
                    reason: format!("waiting in Slurm's queue{why}{cancel_note}"),
                };
            }
            SlurmPhase::Active if f.shared && f.started.is_none() => {
                return Verdict::Live {
                    state: State::Pending,
                    reason: "waiting for its turn in its shared allocation".into(),
                };
            }
            SlurmPhase::Queued | SlurmPhase::Active => return live_running(),
            SlurmPhase::Ended => (j.state.as_str(), j.reason.as_str()),
        },
        SlurmView::Absent => ("gone", ""),
    };
    // Over according to Slurm, and the runner wrote no outcome.
    if f.cancel_requested {
        return Verdict::Ended {
            state: State::Cancelled,
            reason: "cancelled by the user".into(),
            refused: false,
        };
    }
    let before_start = f.shared && f.started.is_none();
    match slurm_state {
        "CANCELLED" if before_start => {
            return Verdict::Ended {
                state: State::Cancelled,
                reason: "cancelled by Slurm: its allocation was cancelled before this call started".into(),
                refused: false,
            }
        }
        "TIMEOUT" if before_start => {
            return Verdict::Ended {
                state: State::Cancelled,
                reason: "its allocation reached Slurm's time limit before this call started".into(),
                refused: false,
            }
        }
        "CANCELLED" => {
            return Verdict::Ended {
                state: State::Cancelled,
                reason: "cancelled by Slurm".into(),
                refused: false,
            }
        }
        "TIMEOUT" => {
            return Verdict::Ended {
                state: State::TimedOut,
                reason: "Slurm's time limit was reached before the runner wrote an outcome".into(),
                refused: false,
            }
        }
        _ => {}
    }
    let log = log();
    if let Some(r) = log.refusal {
        return Verdict::Ended {
            state: State::Failed,
            reason: r,
            refused: true,
        };
    }
    let why = match slurm_reason {
        "" if slurm_state == "gone" => "it is no longer in Slurm's queue",
        "" | "None" => "Slurm gives no reason",
        r => r,
    };
    let mut reason = if before_start {
        format!("Slurm reports its allocation {slurm_state} and this call never started ({why})")
    } else {
        format!("Slurm reports the job {slurm_state} and the runner wrote no outcome ({why})")
    };
    if let Some(l) = log.last_line {
        reason.push_str(&format!("; Slurm's log of the job ends with: {l}"));
    }
    Verdict::Ended {
        state: State::Lost,
        reason,
        refused: false,
    }
}

/// Extracts the refusal and the last line from the tail of a Slurm log.
pub fn scan_log(tail: &str) -> LogFacts {
    let mut facts = LogFacts::default();
    for line in tail.lines() {
        let line = line.trim_end();
        if let Some(r) = line.strip_prefix(REFUSED_PREFIX) {
            facts.refusal = Some(r.trim().chars().take(1000).collect());
        }
        if !line.trim().is_empty() {
            facts.last_line = Some(line.trim().chars().take(300).collect());
        }
    }
    facts
}

/// The exit status a CLI reports for a job: the job's own exit code when it
/// ran to an exit, 124 timed out, 130 cancelled, 125 any other failure, and
/// `None` while it is not over.
pub fn exit_status_for(s: &JobStatus) -> Option<i32> {
    let clamp = |c: i32| if (0..=255).contains(&c) { c } else { 125 };
    match s.state {
        State::Pending | State::Running => None,
        State::Completed => Some(s.exit_code.map(clamp).unwrap_or(0)),
        State::Failed => Some(match s.exit_code {
            Some(c) if c != 0 && !s.refused => clamp(c),
            _ => 125,
        }),
        State::TimedOut => Some(124),
        State::Cancelled => Some(130),
        State::Lost => Some(125),
    }
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

/// The files of one job directory, read once.
struct JobFiles {
    id: JobId,
    dir: PathBuf,
    /// `None` when the directory cannot be opened safely (a symlink, another
    /// owner, no permission): `unreadable` says why.
    fd: Option<OwnedFd>,
    unreadable: Option<String>,
    slurm_id: Option<String>,
    /// Calls of the allocation this call runs in, when it shares one.
    shared: Option<u32>,
    started: Option<Started>,
    outcome: Option<Outcome>,
    cancel: bool,
    created_ms: u64,
}

pub struct Client {
    config: Config,
    root: PathBuf,
    root_fd: OwnedFd,
    uid: u32,
    gid: u32,
}

/// When Slurm was last asked by a wait, per delegate root, for the whole
/// process: consecutive waits (the Python waiter's rounds, each with a
/// client of its own) share the one-query-per-interval budget instead of
/// each asking at its start.
fn last_slurm_map() -> std::sync::MutexGuard<'static, std::collections::HashMap<PathBuf, Instant>> {
    static LAST: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<PathBuf, Instant>>> =
        std::sync::OnceLock::new();
    LAST.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

fn optional<T>(r: Result<T, ProtocolError>) -> Result<Option<T>, ProtocolError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

fn exists_at(dir: impl AsFd, name: &str) -> bool {
    fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
}

/// Waiting for (or cancelling) N jobs holds one descriptor per job
/// directory, twice over while a round re-reads them: a student's 1,000
/// futures exceed the usual soft limit of 1,024, and a job directory that
/// cannot be opened for EMFILE would look unreadable. Raise the soft limit
/// of open files to the hard limit (capped at 65,536), once per process.
fn raise_nofile_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit only read/write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                let want = lim.rlim_max.min(65_536);
                if lim.rlim_cur < want {
                    lim.rlim_cur = want;
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        tracing::debug!("could not raise the open-files limit");
                    }
                }
            }
        }
    });
}

impl Client {
    /// A client configured from the environment ([`Config::from_env`]).
    pub fn from_env() -> Result<Client> {
        Client::new(Config::from_env()?)
    }

    /// Creates the root (mode 0700, parents too) if needed and opens it. The
    /// root is used by its canonical path, which is what the runner is given.
    pub fn new(config: Config) -> Result<Client> {
        let shown = config.root.display().to_string();
        let root_err = |reason: String| ClientError::Root {
            path: shown.clone(),
            reason,
        };
        if !config.root.is_absolute() {
            return Err(root_err("it is not an absolute path".into()));
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.root)
            .map_err(|e| root_err(e.to_string()))?;
        let root = std::fs::canonicalize(&config.root).map_err(|e| root_err(e.to_string()))?;
        let root_fd = open_dir_nofollow(&root).map_err(|e| root_err(e.to_string()))?;
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        check_owner(&root_fd, &root.display().to_string(), uid, true).map_err(|e| root_err(e.to_string()))?;
        raise_nofile_limit();
        tracing::debug!(root = %root.display(), uid, "client ready");
        Ok(Client {
            config,
            root,
            root_fd,
            uid,
            gid,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The canonical delegate root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn job_dir(&self, id: &JobId) -> PathBuf {
        self.root.join(id.as_str())
    }

    /// Slurm's log of the job's batch script, beside its directory.
    pub fn log_path(&self, id: &JobId) -> PathBuf {
        self.root.join(format!("{id}.log"))
    }

    fn open_job_dir(&self, id: &JobId) -> Result<OwnedFd> {
        let dir = self.job_dir(id);
        match open_dir_nofollow(&dir) {
            Ok(fd) => Ok(fd),
            Err(e) if e.is_not_found() => Err(ClientError::NoSuchJob {
                id: id.to_string(),
                root: self.root.display().to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    // --- submit -----------------------------------------------------------

    /// Creates the job directory, writes the spec and payload, submits one
    /// batch job and records its Slurm id.
    pub fn submit(&self, req: &SubmitRequest) -> Result<JobHandle> {
        let mut handles = self.submit_many(std::slice::from_ref(req))?;
        handles.pop().ok_or_else(|| ClientError::InvalidRequest("nothing was submitted".into()))
    }

    /// Submits every request with ONE `sbatch`: a plain batch job for one
    /// request, a Slurm job array for several (element `i` runs the runner
    /// on the `i`-th job directory, so each call still gets its own job
    /// directory, outcome and single-use sandbox, and status, wait, cancel
    /// and reattach work per call). Several requests must ask for the same
    /// resources and image (they come from one `map`). Returns the handles
    /// in the order of `reqs`.
    pub fn submit_many(&self, reqs: &[SubmitRequest]) -> Result<Vec<JobHandle>> {
        let Some(first) = reqs.first() else {
            return Ok(Vec::new());
        };
        if reqs.len() > MAX_ARRAY {
            return Err(ClientError::InvalidRequest(format!(
                "{} calls in one submission, more than the limit of {MAX_ARRAY} of one job array",
                reqs.len()
            )));
        }
        let same = |r: &SubmitRequest| {
            (r.cpus, r.mem_bytes, r.time_limit_secs, &r.image, r.hold)
                == (first.cpus, first.mem_bytes, first.time_limit_secs, &first.image, first.hold)
        };
        if !reqs.iter().all(same) {
            return Err(ClientError::InvalidRequest(
                "the calls of one job array must ask for the same resources and image".into(),
            ));
        }
        let policy = Policy::load_for_client();
        let image = match &first.image {
            Some(i) => i.clone(),
            None => policy.as_ref().map_err(|e| ClientError::Policy(e.clone()))?.default_image.clone(),
        };
        let site = policy.as_ref().map_or(1, |p| p.calls_per_allocation);
        let per_allocation = self.config.calls_per_allocation.map_or(site, |n| n.min(site));
        let specs = reqs
            .iter()
            .map(|r| self.spec_for(r, &image))
            .collect::<Result<Vec<_>>>()?;
        let mut jobs: Vec<(JobId, PathBuf, OwnedFd)> = Vec::with_capacity(reqs.len());
        for (spec, req) in specs.into_iter().zip(reqs) {
            match self.prepare(spec, req.payload.as_deref()) {
                Ok(j) => jobs.push(j),
                Err(e) => {
                    self.fail_all(&jobs, &format!("another call of the same submission could not be prepared: {e}"));
                    return Err(e);
                }
            }
        }
        let ids: Vec<JobId> = jobs.iter().map(|j| j.0.clone()).collect();
        let dirs: Vec<PathBuf> = jobs.iter().map(|j| j.1.clone()).collect();
        let groups = if jobs.len() > 1 && per_allocation > 1 {
            match self.config.slurm.partition_info() {
                Ok(info) => plan_allocations(jobs.len(), per_allocation, first.time_limit_secs, &info),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot ask Slurm about the partition; one Slurm job per call");
                    None
                }
            }
        } else {
            None
        };
        // For each call: its allocation (array element) and how many calls share it.
        let mut placement: Vec<(usize, Option<u32>)> = (0..jobs.len()).map(|i| (i, None)).collect();
        let batch = if let Some(groups) = &groups {
            for (k, g) in groups.iter().enumerate() {
                for &i in g {
                    placement[i] = (k, Some(g.len() as u32));
                }
            }
            let longest = groups.iter().map(Vec::len).max().unwrap_or(1) as u64;
            let dir_groups: Vec<Vec<PathBuf>> = groups.iter().map(|g| g.iter().map(|&i| dirs[i].clone()).collect()).collect();
            BatchRequest {
                job_name: format!("{}-shared", ids[0]),
                chdir: self.root.clone(),
                output: self.root.join(if groups.len() == 1 {
                    format!("{}.shared.log", ids[0])
                } else {
                    format!("{}.shared-%a.log", ids[0])
                }),
                cpus: first.cpus,
                time_limit_secs: longest.saturating_mul(first.time_limit_secs.saturating_add(SHARED_CALL_ALLOWANCE_SECS)),
                script: slurm::shared_script(&self.config.runner, &dir_groups),
                hold: first.hold,
            }
        } else if jobs.len() == 1 {
            BatchRequest {
                job_name: ids[0].to_string(),
                chdir: self.root.clone(),
                output: self.log_path(&ids[0]),
                cpus: first.cpus,
                time_limit_secs: first.time_limit_secs,
                script: slurm::batch_script(&self.config.runner, &dirs[0]),
                hold: first.hold,
            }
        } else {
            let logs: Vec<PathBuf> = ids.iter().map(|id| self.log_path(id)).collect();
            BatchRequest {
                job_name: format!("{}-array", ids[0]),
                chdir: self.root.clone(),
                output: self.root.join(format!("{}.array.log", ids[0])),
                cpus: first.cpus,
                time_limit_secs: first.time_limit_secs,
                script: slurm::array_script(&self.config.runner, &dirs, &logs),
                hold: first.hold,
            }
        };
        let slurm_id = match self.config.slurm.submit(&batch) {
            Ok(s) => s,
            Err(e) => {
                let why = match &e {
                    SlurmError::Failed { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                let reason = format!("sbatch failed: {why}");
                self.fail_all(&jobs, &reason);
                return Err(ClientError::SubmitFailed { id: ids[0].clone(), reason });
            }
        };
        let mut handles = Vec::with_capacity(jobs.len());
        let elements = groups.as_ref().map_or(jobs.len(), Vec::len);
        // The Slurm id of allocation (array element) `k`.
        let sid_of = |k: usize| if elements == 1 { slurm_id.clone() } else { format!("{slurm_id}_{k}") };
        if let Some(groups) = &groups {
            // The calls of each allocation, for a cancel that reaches its
            // last live call one by one. Best effort: without the list only
            // a cancel of all its calls at once cancels the allocation.
            for (k, g) in groups.iter().enumerate() {
                let sid = sid_of(k);
                let text: String = g.iter().map(|&i| format!("{}\n", ids[i])).collect();
                if let Err(e) = atomic_write_at(&self.root_fd, &self.root, &protocol::shared_calls_name(&sid), text.as_bytes(), 0o644) {
                    tracing::warn!(error = %e, slurm_id = %sid, "cannot record the calls of a shared allocation");
                }
            }
        }
        for (i, (id, dir, fd)) in jobs.iter().enumerate() {
            let (element, shared) = placement[i];
            let sid = sid_of(element);
            let text = protocol::format_slurm_id(&sid, shared);
            if let Err(e) = atomic_write_at(fd, dir, protocol::SLURM_ID, text.as_bytes(), 0o644) {
                // Without the id nobody can follow the job: withdraw it.
                let _ = self.config.slurm.cancel(std::slice::from_ref(&slurm_id));
                let reason = format!("its Slurm id could not be recorded ({e}); Slurm job {slurm_id} was cancelled");
                self.fail_all(&jobs, &reason);
                return Err(ClientError::SubmitFailed { id: id.clone(), reason });
            }
            handles.push(JobHandle {
                id: id.clone(),
                slurm_id: sid,
                dir: dir.clone(),
            });
        }
        tracing::info!(jobs = handles.len(), allocations = elements, slurm_id = %slurm_id, "submitted");
        Ok(handles)
    }

    /// The spec of a request, checked for bounds before anything is written.
    fn spec_for(&self, req: &SubmitRequest, image: &str) -> Result<Spec> {
        if let Some(p) = &req.payload {
            if p.len() as u64 > MAX_PAYLOAD_BYTES {
                return Err(ClientError::InvalidRequest(format!(
                    "the payload is {} bytes, more than the limit of {MAX_PAYLOAD_BYTES}",
                    p.len()
                )));
            }
        }
        let spec = Spec {
            job_id: JobId::new(),
            uid: self.uid,
            gid: self.gid,
            created_ms: now_ms(),
            image: image.to_owned(),
            task: req.task.clone(),
            resources: Resources {
                cpus: req.cpus,
                mem_bytes: req.mem_bytes,
                time_limit_secs: req.time_limit_secs,
                ..Resources::default()
            },
            env: req.env.clone(),
        };
        spec.validate().map_err(|e| match e {
            ProtocolError::InvalidSpec(m) => ClientError::InvalidRequest(m),
            other => other.into(),
        })?;
        encode(&spec).map_err(|e| ClientError::InvalidRequest(format!("the spec is too large ({e})")))?;
        Ok(spec)
    }

    /// Creates a fresh job directory (mode 0700) and writes the spec and
    /// payload into it. A collision of ids is astronomically unlikely, but
    /// retried rather than sharing a directory.
    fn prepare(&self, mut spec: Spec, payload: Option<&[u8]>) -> Result<(JobId, PathBuf, OwnedFd)> {
        let mut attempts = 0;
        let fd = loop {
            match nix::sys::stat::mkdirat(&self.root_fd, spec.job_id.as_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) => break self.open_job_dir(&spec.job_id)?,
                Err(Errno::EEXIST) if attempts < 5 => {
                    attempts += 1;
                    spec.job_id = JobId::new();
                }
                Err(e) => {
                    return Err(ClientError::Io {
                        what: format!("cannot create the job directory {}", self.job_dir(&spec.job_id).display()),
                        source: e.into(),
                    })
                }
            }
        };
        let dir = self.job_dir(&spec.job_id);
        write_record_at(&fd, &dir, &spec)?;
        if let Some(p) = payload {
            atomic_write_at(&fd, &dir, protocol::PAYLOAD, p, 0o600)?;
        }
        Ok((spec.job_id, dir, fd))
    }

    /// Marks every prepared job failed with `reason` (best effort).
    fn fail_all(&self, jobs: &[(JobId, PathBuf, OwnedFd)], reason: &str) {
        for (_, dir, fd) in jobs {
            let _ = self.write_client_outcome(fd, dir, State::Failed, reason, false, None);
        }
    }

    /// Writes an outcome unless one exists (link of a complete temporary file,
    /// so two writers never clobber each other, also on NFS). Returns the
    /// outcome in effect.
    fn write_client_outcome(
        &self,
        fd: &OwnedFd,
        dir: &Path,
        state: State,
        reason: &str,
        refused: bool,
        started: Option<&Started>,
    ) -> Result<Outcome> {
        let outcome = Outcome {
            refused,
            started_ms: started.map(|s| s.started_ms),
            ..Outcome::ended(state, reason, started.map(|s| s.host.clone()).unwrap_or_default(), Writer::Client)
        };
        let bytes = encode(&outcome)?;
        let mut rnd = [0u8; 4];
        let _ = getrandom::fill(&mut rnd);
        let tmp = format!(".outcome.client-{}-{:08x}", std::process::id(), u32::from_le_bytes(rnd));
        if let Err(e) = atomic_write_at(fd, dir, &tmp, &bytes, 0o644) {
            // A full (or read-only) delegate root: the verdict still stands,
            // it just cannot be recorded; say so instead of failing the
            // status of the job (the next reader derives it again).
            let full = matches!(&e, ProtocolError::Io { source, .. }
                if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS)));
            if !full {
                return Err(e.into());
            }
            let _ = nix::unistd::unlinkat(fd, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
            let why = match &e {
                ProtocolError::Io { source, .. } => source.to_string(),
                e => e.to_string(),
            };
            tracing::warn!(dir = %dir.display(), "cannot record the client outcome: {why}");
            let mut outcome = outcome;
            outcome.reason.push_str(&format!("; this verdict could not be recorded in the job directory: {why}"));
            return Ok(outcome);
        }
        let linked = nix::unistd::linkat(fd, tmp.as_str(), fd, protocol::OUTCOME, AtFlags::empty());
        let _ = nix::unistd::unlinkat(fd, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        match linked {
            Ok(()) => {
                let _ = nix::unistd::fsync(fd);
                tracing::info!(dir = %dir.display(), state = %state, reason, "wrote a client outcome");
                Ok(outcome)
            }
            Err(Errno::EEXIST) => Ok(read_record_at::<Outcome>(fd, dir, None)?),
            Err(e) => Err(ProtocolError::io(dir.join(protocol::OUTCOME).display(), e).into()),
        }
    }

    // --- reading and reconciling ------------------------------------------

    fn load(&self, id: &JobId) -> Result<JobFiles> {
        let dir = self.job_dir(id);
        let fd = match self.open_job_dir(id) {
            Ok(fd) => fd,
            Err(ClientError::Protocol(e)) => {
                // The directory exists but cannot be opened safely: the
                // runner refuses such a job too, and says so in the Slurm
                // log beside the directory.
                return Ok(JobFiles {
                    id: id.clone(),
                    dir,
                    fd: None,
                    unreadable: Some(e.to_string()),
                    slurm_id: None,
                    shared: None,
                    started: None,
                    outcome: None,
                    cancel: false,
                    created_ms: now_ms(),
                });
            }
            Err(e) => return Err(e),
        };
        // A damaged spec does not hide the job's state: the runner reports
        // on it in the outcome.
        let spec: Option<Spec> = match optional(read_record_at(&fd, &dir, None)) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "cannot read the spec");
                None
            }
        };
        let (slurm_id, shared) = match optional(read_bounded_at(&fd, &dir, protocol::SLURM_ID, MAX_SLURM_ID_BYTES, None))? {
            None => (None, None),
            Some(b) => match protocol::parse_slurm_id(&String::from_utf8_lossy(&b)) {
                Some((sid, shared)) => (Some(sid), shared),
                None => {
                    tracing::warn!(job = %id, content = %String::from_utf8_lossy(&b), "ignoring a slurm-id file that holds no job id");
                    (None, None)
                }
            },
        };
        let started: Option<Started> = optional(read_record_at(&fd, &dir, None))?;
        let outcome: Option<Outcome> = optional(read_record_at(&fd, &dir, None))?;
        let cancel = exists_at(&fd, protocol::CANCEL);
        let created_ms = match &spec {
            Some(s) => s.created_ms,
            None => fstat(&fd)
                .map(|st| (st.st_mtime.max(0) as u64) * 1000)
                .unwrap_or_else(|_| now_ms()),
        };
        Ok(JobFiles {
            id: id.clone(),
            dir,
            fd: Some(fd),
            unreadable: None,
            slurm_id,
            shared,
            started,
            outcome,
            cancel,
            created_ms,
        })
    }

    /// The last [`LOG_TAIL_BYTES`] of Slurm's log of the job, if any.
    fn log_facts(&self, id: &JobId) -> LogFacts {
        let name = format!("{id}.log");
        let fd = match openat(
            &self.root_fd,
            name.as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(_) => return LogFacts::default(),
        };
        match fstat(&fd) {
            Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG => {}
            _ => return LogFacts::default(),
        }
        let mut f = File::from(fd);
        let len = f.seek(SeekFrom::End(0)).unwrap_or(0);
        let start = len.saturating_sub(LOG_TAIL_BYTES);
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(start)).is_err() || f.take(LOG_TAIL_BYTES).read_to_end(&mut buf).is_err() {
            return LogFacts::default();
        }
        let text = String::from_utf8_lossy(&buf);
        // Drop a partial first line when the tail starts mid-file.
        let text = if start > 0 {
            text.split_once('\n').map(|(_, rest)| rest).unwrap_or("")
        } else {
            &text
        };
        scan_log(text)
    }

    fn status_of(&self, f: &JobFiles, outcome: &Outcome) -> JobStatus {
        let started_ms = outcome.started_ms.or(f.started.as_ref().map(|s| s.started_ms));
        let host = Some(outcome.host.clone())
            .filter(|h| !h.is_empty())
            .or_else(|| f.started.as_ref().map(|s| s.host.clone()));
        JobStatus {
            id: f.id.clone(),
            slurm_id: f.slurm_id.clone(),
            state: outcome.state,
            reason: outcome.reason.clone(),
            exit_code: outcome.exit_code,
            refused: outcome.refused,
            oom_killed: outcome.oom_killed,
            host,
            submitted_ms: Some(f.created_ms),
            started_ms,
            finished_ms: Some(outcome.finished_ms),
            elapsed_secs: started_ms.map(|s| outcome.finished_ms.saturating_sub(s) as f64 / 1000.0),
        }
    }

    fn live_status(&self, f: &JobFiles, state: State, reason: String) -> JobStatus {
        let started_ms = f.started.as_ref().map(|s| s.started_ms);
        JobStatus {
            id: f.id.clone(),
            slurm_id: f.slurm_id.clone(),
            state,
            reason,
            exit_code: None,
            refused: false,
            oom_killed: false,
            host: f.started.as_ref().map(|s| s.host.clone()),
            submitted_ms: Some(f.created_ms),
            started_ms,
            finished_ms: None,
            elapsed_secs: started_ms.map(|s| now_ms().saturating_sub(s) as f64 / 1000.0),
        }
    }

    /// Reconciles loaded jobs; asks Slurm once (when `ask_slurm`) about all
    /// the jobs that have no outcome yet.
    fn reconcile(&self, jobs: &mut [JobFiles], ask_slurm: bool) -> Result<Vec<JobStatus>> {
        let need_slurm = ask_slurm && jobs.iter().any(|j| j.outcome.is_none() && j.slurm_id.is_some());
        let queue = if need_slurm {
            match self.config.slurm.query_user(self.uid) {
                Ok(q) => Some(q),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot ask Slurm about the jobs");
                    None
                }
            }
        } else {
            None
        };
        let mut out = Vec::with_capacity(jobs.len());
        for f in jobs.iter_mut() {
            if let Some(o) = &f.outcome {
                out.push(self.status_of(f, o));
                continue;
            }
            let fd = match (&f.fd, &f.unreadable) {
                (Some(fd), _) => fd,
                (None, why) => {
                    let why = why.clone().unwrap_or_default();
                    out.push(match self.log_facts(&f.id).refusal {
                        Some(reason) => {
                            let mut st = self.live_status(f, State::Failed, format!("refused: {reason}"));
                            st.refused = true;
                            st.finished_ms = Some(now_ms());
                            st
                        }
                        None => self.live_status(
                            f,
                            State::Pending,
                            format!("the job directory cannot be read ({why}); waiting for the runner's verdict"),
                        ),
                    });
                    continue;
                }
            };
            let view = match (&f.slurm_id, ask_slurm, &queue) {
                (_, false, _) => SlurmView::NotAsked,
                (None, true, _) => SlurmView::NotAsked,
                (Some(_), true, None) => SlurmView::Unavailable,
                (Some(sid), true, Some(q)) => slurm::lookup(q, sid).map_or(SlurmView::Absent, SlurmView::Present),
            };
            let facts = Facts {
                submitted: f.slurm_id.is_some(),
                age_secs: now_ms().saturating_sub(f.created_ms) / 1000,
                started: f.started.as_ref().map(|s| s.host.as_str()),
                cancel_requested: f.cancel,
                shared: f.shared.is_some(),
                slurm: view,
            };
            match decide(&facts, || self.log_facts(&f.id)) {
                Verdict::Live { state, reason } => out.push(self.live_status(f, state, reason)),
                Verdict::Ended { state, reason, refused } => {
                    // The runner writes its outcome before it exits: look again.
                    let outcome = match optional(read_record_at::<Outcome>(fd, &f.dir, None))? {
                        Some(o) => o,
                        None => {
                            self.write_client_outcome(fd, &f.dir, state, &reason, refused, f.started.as_ref())?
                        }
                    };
                    out.push(self.status_of(f, &outcome));
                    f.outcome = Some(outcome);
                }
            }
        }
        Ok(out)
    }

    /// The state of each job, asking Slurm once for all of them.
    pub fn status(&self, ids: &[JobId]) -> Result<Vec<JobStatus>> {
        let mut jobs = ids.iter().map(|id| self.load(id)).collect::<Result<Vec<_>>>()?;
        self.reconcile(&mut jobs, true)
    }

    /// The spec of a job.
    pub fn spec(&self, id: &JobId) -> Result<Spec> {
        let fd = self.open_job_dir(id)?;
        Ok(read_record_at(&fd, &self.job_dir(id), None)?)
    }

    /// The ids of all job directories in the root, oldest first.
    pub fn job_ids(&self) -> Result<Vec<JobId>> {
        let names = protocol::list_entries(&self.root_fd, &self.root, MAX_JOBS_LISTED)?;
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
        let mut jobs = Vec::new();
        for id in self.job_ids()? {
            match self.load(&id) {
                Ok(j) => jobs.push(j),
                Err(e) => tracing::warn!(job = %id, error = %e, "skipping an unreadable job directory"),
            }
        }
        self.reconcile(&mut jobs, true)
    }

    /// Waits until every job is over or `timeout` passes; returns the last
    /// statuses (some may still be pending or running after a timeout).
    ///
    /// Wakes on inotify events in the job directories, else polls with a
    /// backoff from 50 ms to 1 s (NFS gives no events), and asks Slurm once
    /// every [`SLURM_INTERVAL`] about all jobs still waited for.
    pub fn wait(&self, ids: &[JobId], timeout: Option<Duration>) -> Result<Vec<JobStatus>> {
        self.wait_with(ids, timeout, || false)
    }

    /// [`Client::wait`] that also stops, returning the current statuses, as
    /// soon as `stop` returns true; `stop` is called at least once a second
    /// (e.g. to notice Ctrl-C, or Python's pending signals).
    pub fn wait_with(
        &self,
        ids: &[JobId],
        timeout: Option<Duration>,
        stop: impl FnMut() -> bool,
    ) -> Result<Vec<JobStatus>> {
        self.wait_inner(ids, timeout, stop, false, false)
    }

    /// [`Client::wait_with`] that also returns as soon as any one of the
    /// jobs is over (the Python waiter: each future is resolved when its
    /// own job ends, not when the round does).
    pub fn wait_any_with(
        &self,
        ids: &[JobId],
        timeout: Option<Duration>,
        stop: impl FnMut() -> bool,
    ) -> Result<Vec<JobStatus>> {
        self.wait_inner(ids, timeout, stop, false, true)
    }

    /// Claims this interval's Slurm query: true (and the interval restarts)
    /// when no wait of this process asked about jobs of this root in the
    /// last [`SLURM_INTERVAL`], or when `force`.
    fn slurm_due(&self, force: bool) -> bool {
        let mut map = last_slurm_map();
        let due = force || map.get(&self.root).is_none_or(|t| t.elapsed() >= SLURM_INTERVAL);
        if due {
            map.insert(self.root.clone(), Instant::now());
        }
        due
    }

    fn last_slurm(&self) -> Option<Instant> {
        last_slurm_map().get(&self.root).copied()
    }

    /// The wait loop; `fresh`: ask Slurm in the first round whatever the
    /// interval (after a scancel, to see the cancellation at once).
    fn wait_inner(
        &self,
        ids: &[JobId],
        timeout: Option<Duration>,
        mut stop: impl FnMut() -> bool,
        fresh: bool,
        any: bool,
    ) -> Result<Vec<JobStatus>> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut jobs = ids.iter().map(|id| self.load(id)).collect::<Result<Vec<_>>>()?;
        let inotify = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::debug!(error = %e, "no inotify; polling only");
                None
            }
        };
        if let Some(ino) = &inotify {
            let mask = AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CREATE | AddWatchFlags::IN_CLOSE_WRITE;
            for j in &jobs {
                if let Err(e) = ino.add_watch(&j.dir, mask) {
                    tracing::debug!(dir = %j.dir.display(), error = %e, "cannot watch; polling");
                }
            }
        }
        let mut statuses: Vec<Option<JobStatus>> = vec![None; jobs.len()];
        let mut first = true;
        let mut backoff = Duration::from_millis(50);
        loop {
            let ask = self.slurm_due(fresh && first);
            first = false;
            // Re-read the jobs not over yet, then reconcile them together.
            let open: Vec<usize> = (0..jobs.len())
                .filter(|&i| !statuses[i].as_ref().is_some_and(JobStatus::is_terminal))
                .collect();
            let mut batch = Vec::with_capacity(open.len());
            for &i in &open {
                batch.push(self.load(&jobs[i].id)?);
            }
            let fresh = self.reconcile(&mut batch, ask)?;
            for ((&i, s), f) in open.iter().zip(fresh).zip(batch) {
                // A file-only check knows less than the last Slurm answer:
                // keep that one unless the files show progress.
                let keep_previous = !ask
                    && !s.is_terminal()
                    && statuses[i]
                        .as_ref()
                        .is_some_and(|p| !(p.state == State::Pending && s.state == State::Running));
                if !keep_previous {
                    statuses[i] = Some(s);
                }
                jobs[i] = f;
            }
            let done = statuses.iter().all(|s| s.as_ref().is_some_and(JobStatus::is_terminal));
            let one_over = any && open.iter().any(|&i| statuses[i].as_ref().is_some_and(JobStatus::is_terminal));
            let now = Instant::now();
            if done || one_over || deadline.is_some_and(|d| now >= d) || stop() {
                return Ok(statuses.into_iter().flatten().collect());
            }
            let mut sleep = backoff;
            if let Some(t) = self.last_slurm() {
                sleep = sleep.min((t + SLURM_INTERVAL).saturating_duration_since(now));
            }
            if let Some(d) = deadline {
                sleep = sleep.min(d.saturating_duration_since(now));
            }
            let sleep = sleep.max(Duration::from_millis(1));
            let woke = match &inotify {
                Some(ino) => wait_readable(ino, sleep),
                None => {
                    std::thread::sleep(sleep);
                    false
                }
            };
            if woke {
                if let Some(ino) = &inotify {
                    while matches!(ino.read_events(), Ok(ev) if !ev.is_empty()) {}
                }
                backoff = Duration::from_millis(50);
            } else {
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }

    /// Asks for the jobs to end: writes the `cancel` marker in each, cancels
    /// them in Slurm with one `scancel` (an allocation shared with calls not
    /// being cancelled is left running: its runner stops just the cancelled
    /// call, and a call that has not started there is over at once), then waits up to [`CANCEL_WAIT`]
    /// for each to be over. Returns the last statuses.
    pub fn cancel(&self, ids: &[JobId]) -> Result<Vec<JobStatus>> {
        let jobs = ids.iter().map(|id| self.load(id)).collect::<Result<Vec<_>>>()?;
        let mut slurm_ids = Vec::new();
        for j in &jobs {
            if j.outcome.is_some() {
                continue;
            }
            let Some(fd) = &j.fd else {
                return Err(ClientError::Protocol(ProtocolError::NotKind {
                    path: j.dir.display().to_string(),
                    expected: "job directory delegate can open (it cannot cancel this job)",
                }));
            };
            atomic_write_at(fd, &j.dir, protocol::CANCEL, b"", 0o644)?;
            if let (Some(s), None) = (&j.slurm_id, j.shared) {
                slurm_ids.push(s.clone());
            }
        }
        // An allocation shared by several calls is cancelled in Slurm only
        // when none of its calls is left to run; otherwise the runner stops
        // the cancelled call (it watches the marker) and goes on.
        let mut shared: std::collections::HashMap<&str, (u32, std::collections::HashSet<&JobId>)> =
            std::collections::HashMap::new();
        for j in &jobs {
            if let (Some(s), Some(n), None) = (&j.slurm_id, j.shared, &j.outcome) {
                shared.entry(s.as_str()).or_insert_with(|| (n, Default::default())).1.insert(&j.id);
            }
        }
        for (sid, (n, members)) in shared {
            if members.len() as u32 >= n || self.no_other_live_call(sid, &members) {
                slurm_ids.push(sid.to_owned());
            }
        }
        if let Err(e) = self.config.slurm.cancel(&slurm_ids) {
            // Jobs that ended meanwhile make scancel fail; the wait decides.
            tracing::warn!(error = %e, "scancel reported an error");
        }
        self.wait_inner(ids, Some(CANCEL_WAIT), || false, true, false)
    }

    /// True when every call of the shared allocation `sid` other than
    /// `cancelling` is over or being cancelled (its list of calls says which
    /// they are; false when that list cannot be read).
    fn no_other_live_call(&self, sid: &str, cancelling: &std::collections::HashSet<&JobId>) -> bool {
        let name = protocol::shared_calls_name(sid);
        let text = match read_bounded_at(&self.root_fd, &self.root, &name, 64 * 1024, Some(self.uid)) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) => {
                tracing::debug!(error = %e, "no list of the calls of allocation {sid}");
                return false;
            }
        };
        let calls = protocol::parse_shared_calls(&text);
        !calls.is_empty()
            && calls.iter().all(|id| {
                cancelling.contains(id)
                    || self
                        .open_job_dir(id)
                        .map(|fd| exists_at(&fd, protocol::OUTCOME) || exists_at(&fd, protocol::CANCEL))
                        .unwrap_or(false)
            })
    }

    // --- readers ----------------------------------------------------------

    /// Opens a job's stdout or stderr file for streaming; `None` while it
    /// does not exist yet.
    pub fn open_output(&self, id: &JobId, stream: Stream) -> Result<Option<File>> {
        let fd = self.open_job_dir(id)?;
        self.open_file_at(&fd, id, stream.file_name())
    }

    fn open_file_at(&self, dir: &OwnedFd, id: &JobId, name: &str) -> Result<Option<File>> {
        let path = self.job_dir(id).join(name).display().to_string();
        let fd = match openat(
            dir,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP) => return Err(ProtocolError::Symlink { path }.into()),
            Err(e) => return Err(ProtocolError::io(path, e).into()),
        };
        let st = fstat(&fd).map_err(|e| ProtocolError::io(&path, e))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(ProtocolError::NotKind {
                path,
                expected: "regular file",
            }
            .into());
        }
        // Blocking reads from here on (O_NONBLOCK only guarded the open).
        let _ = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()));
        Ok(Some(File::from(fd)))
    }

    /// Reads at most `limit` bytes of a job's stdout or stderr; `None` while
    /// it does not exist.
    pub fn read_output(&self, id: &JobId, stream: Stream, limit: u64) -> Result<Option<Vec<u8>>> {
        let fd = self.open_job_dir(id)?;
        Ok(optional(read_bounded_at(&fd, &self.job_dir(id), stream.file_name(), limit, None))?)
    }

    /// The `result` file (a pickled return value or exception), bounded by
    /// [`MAX_PAYLOAD_BYTES`]; `None` when the job wrote none.
    pub fn read_result(&self, id: &JobId) -> Result<Option<Vec<u8>>> {
        let fd = self.open_job_dir(id)?;
        Ok(optional(read_bounded_at(
            &fd,
            &self.job_dir(id),
            protocol::RESULT,
            MAX_PAYLOAD_BYTES,
            None,
        ))?)
    }

    /// True when the job's outcome file exists.
    pub fn has_outcome(&self, id: &JobId) -> Result<bool> {
        let fd = self.open_job_dir(id)?;
        Ok(exists_at(&fd, protocol::OUTCOME))
    }
}

/// Waits until the inotify descriptor is readable or `timeout` passes.
fn wait_readable(fd: &impl AsFd, timeout: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let t = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    matches!(poll(&mut fds, t), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(slurm: SlurmView<'a>) -> Facts<'a> {
        Facts {
            submitted: true,
            age_secs: 5,
            started: None,
            cancel_requested: false,
            shared: false,
            slurm,
        }
    }
    fn sj(state: &str, reason: &str) -> SlurmJob {
        SlurmJob {
            state: state.into(),
            reason: reason.into(),
        }
    }
    fn no_log() -> LogFacts {
        LogFacts::default()
    }
    fn state_of(v: &Verdict) -> State {
        match v {
            Verdict::Live { state, .. } | Verdict::Ended { state, .. } => *state,
        }
    }

    #[test]
    fn live_states() {
        let p = sj("PENDING", "Priority");
        let v = decide(&facts(SlurmView::Present(&p)), || panic!("log read for a live job"));
        assert_eq!(
            v,
            Verdict::Live {
                state: State::Pending,
                reason: "waiting in Slurm's queue (Priority)".into()
            }
        );
        let c = sj("CONFIGURING", "None");
        assert_eq!(state_of(&decide(&facts(SlurmView::Present(&c)), no_log)), State::Pending);
        for s in ["RUNNING", "COMPLETING"] {
            let r = sj(s, "None");
            assert_eq!(state_of(&decide(&facts(SlurmView::Present(&r)), no_log)), State::Running);
        }
        // A started file makes a job running whatever Slurm's queue says.
        let mut f = facts(SlurmView::Present(&p));
        f.started = Some("node1");
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live {
                state: State::Running,
                reason: "running on node1".into()
            }
        );
        // Slurm unreachable or not asked: never a terminal verdict.
        for view in [SlurmView::Unavailable, SlurmView::NotAsked] {
            assert_eq!(state_of(&decide(&facts(view), || panic!())), State::Pending);
            let mut f = facts(view);
            f.started = Some("n");
            assert_eq!(state_of(&decide(&f, || panic!())), State::Running);
        }
    }

    #[test]
    fn ended_without_outcome() {
        let gone = decide(&facts(SlurmView::Absent), no_log);
        assert_eq!(
            gone,
            Verdict::Ended {
                state: State::Lost,
                reason: "Slurm reports the job gone and the runner wrote no outcome (it is no longer in Slurm's queue)"
                    .into(),
                refused: false
            }
        );
        let nf = sj("NODE_FAIL", "NodeDown");
        match decide(&facts(SlurmView::Present(&nf)), no_log) {
            Verdict::Ended { state: State::Lost, reason, .. } => assert_eq!(
                reason,
                "Slurm reports the job NODE_FAIL and the runner wrote no outcome (NodeDown)"
            ),
            other => panic!("{other:?}"),
        }
        let failed = sj("FAILED", "NonZeroExitCode");
        let v = decide(&facts(SlurmView::Present(&failed)), || LogFacts {
            refusal: None,
            last_line: Some("exec: /usr/local/bin/sandbox-runner: not found".into()),
        });
        match v {
            Verdict::Ended { state: State::Lost, reason, .. } => {
                assert!(reason.ends_with("ends with: exec: /usr/local/bin/sandbox-runner: not found"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // A refusal in the log.
        let done = sj("COMPLETED", "None");
        assert_eq!(
            decide(&facts(SlurmView::Present(&done)), || scan_log(
                "noise\ndelegate: refused: image \"x\" is not allowed\nmore\n"
            )),
            Verdict::Ended {
                state: State::Failed,
                reason: "image \"x\" is not allowed".into(),
                refused: true
            }
        );
        let to = sj("TIMEOUT", "TimeLimit");
        assert_eq!(state_of(&decide(&facts(SlurmView::Present(&to)), no_log)), State::TimedOut);
        let ca = sj("CANCELLED", "None");
        assert_eq!(
            decide(&facts(SlurmView::Present(&ca)), no_log),
            Verdict::Ended {
                state: State::Cancelled,
                reason: "cancelled by Slurm".into(),
                refused: false
            }
        );
        let mut f = facts(SlurmView::Absent);
        f.cancel_requested = true;
        assert_eq!(
            decide(&f, || panic!()),
            Verdict::Ended {
                state: State::Cancelled,
                reason: "cancelled by the user".into(),
                refused: false
            }
        );
    }

    #[test]
    fn shared_allocations() {
        let running = sj("RUNNING", "None");
        let mut f = facts(SlurmView::Present(&running));
        f.shared = true;
        // Its allocation runs an earlier call.
        assert_eq!(
            decide(&f, no_log),
            Verdict::Live { state: State::Pending, reason: "waiting for its turn in its shared allocation".into() }
        );
        f.started = Some("n1");
        assert_eq!(state_of(&decide(&f, no_log)), State::Running);
        // Cancelled before it started: over at once, whatever Slurm says.
        f.started = None;
        f.cancel_requested = true;
        for view in [SlurmView::NotAsked, SlurmView::Present(&running), SlurmView::Absent] {
            f.slurm = view;
            assert_eq!(
                decide(&f, no_log),
                Verdict::Ended { state: State::Cancelled, reason: "cancelled by the user before it started".into(), refused: false }
            );
        }
        // Started, then cancelled: the runner stops it; still running meanwhile.
        f.started = Some("n1");
        f.slurm = SlurmView::Present(&running);
        assert_eq!(state_of(&decide(&f, no_log)), State::Running);
        // The allocation ended before the call started.
        f.started = None;
        f.cancel_requested = false;
        let cancelled = sj("CANCELLED", "None");
        f.slurm = SlurmView::Present(&cancelled);
        assert_eq!(
            decide(&f, no_log),
            Verdict::Ended {
                state: State::Cancelled,
                reason: "cancelled by Slurm: its allocation was cancelled before this call started".into(),
                refused: false
            }
        );
        let timeout = sj("TIMEOUT", "TimeLimit");
        f.slurm = SlurmView::Present(&timeout);
        assert_eq!(state_of(&decide(&f, no_log)), State::Cancelled);
        f.slurm = SlurmView::Absent;
        match decide(&f, no_log) {
            Verdict::Ended { state: State::Lost, reason, .. } => assert!(reason.contains("this call never started"), "{reason}"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn never_submitted() {
        let mut f = facts(SlurmView::NotAsked);
        f.submitted = false;
        assert_eq!(state_of(&decide(&f, || panic!())), State::Pending);
        f.age_secs = SUBMIT_GRACE_SECS + 1;
        match decide(&f, || panic!()) {
            Verdict::Ended { state: State::Failed, reason, .. } => assert!(reason.contains("never submitted")),
            other => panic!("{other:?}"),
        }
        f.cancel_requested = true;
        assert_eq!(state_of(&decide(&f, || panic!())), State::Cancelled);
    }

    #[test]
    fn log_scanning() {
        assert_eq!(scan_log(""), LogFacts::default());
        let l = scan_log("a\n\ndelegate: refused: first\nb\ndelegate: refused: second  \n\n");
        assert_eq!(l.refusal.as_deref(), Some("second"));
        assert_eq!(l.last_line.as_deref(), Some("delegate: refused: second"));
    }

    fn st(state: State, exit: Option<i32>, refused: bool) -> JobStatus {
        JobStatus {
            id: JobId::new(),
            slurm_id: None,
            state,
            reason: String::new(),
            exit_code: exit,
            refused,
            oom_killed: false,
            host: None,
            submitted_ms: None,
            started_ms: None,
            finished_ms: None,
            elapsed_secs: None,
        }
    }

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status_for(&st(State::Running, None, false)), None);
        assert_eq!(exit_status_for(&st(State::Completed, Some(0), false)), Some(0));
        assert_eq!(exit_status_for(&st(State::Completed, Some(3), false)), Some(3));
        assert_eq!(exit_status_for(&st(State::Failed, Some(3), false)), Some(3));
        assert_eq!(exit_status_for(&st(State::Failed, None, true)), Some(125));
        assert_eq!(exit_status_for(&st(State::Failed, Some(-1), false)), Some(125));
        assert_eq!(exit_status_for(&st(State::TimedOut, None, false)), Some(124));
        assert_eq!(exit_status_for(&st(State::Cancelled, Some(143), false)), Some(130));
        assert_eq!(exit_status_for(&st(State::Lost, None, false)), Some(125));
    }

    #[test]
    fn json_state_is_kebab_case() {
        let j = serde_json::to_value(st(State::TimedOut, None, false)).unwrap();
        assert_eq!(j["state"], "timed-out");
    }

    /// What the runner writes when a job exited with `code`, `ran_ms` after it started.
    fn write_completed(dir: &Path, code: i32, reason: &str, ran_ms: u64) {
        let fd = open_dir_nofollow(dir).unwrap();
        let o = Outcome {
            exit_code: Some(code),
            started_ms: Some(now_ms() - ran_ms),
            ..Outcome::ended(State::Completed, reason, "n1", Writer::Runner)
        };
        write_record_at(&fd, dir, &o).unwrap();
    }

    fn write_started(dir: &Path) {
        let fd = open_dir_nofollow(dir).unwrap();
        let st = Started {
            host: "n1".into(),
            started_ms: now_ms(),
            container_id: "c".into(),
            perf_mode: "seccomp".into(),
        };
        write_record_at(&fd, dir, &st).unwrap();
    }

    fn fake_slurm(dir: &Path, sbatch_body: &str, squeue_body: &str) -> Slurm {
        use std::os::unix::fs::PermissionsExt;
        let mk = |name: &str, body: &str| {
            let p = dir.join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        Slurm {
            partition: None,
            sbatch: mk("sbatch", sbatch_body),
            squeue: mk("squeue", squeue_body),
            scancel: mk("scancel", "exit 0"),
            // No partition information: one Slurm job per call.
            sinfo: mk("sinfo", "exit 1"),
        }
    }

    fn client(tmp: &Path, slurm: Slurm) -> Client {
        Client::new(Config {
            root: tmp.join("home/.delegate/jobs"),
            runner: "/nonexistent/runner".into(),
            slurm,
            calls_per_allocation: None,
        })
        .unwrap()
    }

    #[test]
    fn submit_many_is_one_sbatch_of_an_array() {
        let tmp = tempfile::tempdir().unwrap();
        let calls = tmp.path().join("calls");
        let slurm = fake_slurm(
            tmp.path(),
            &format!("cat > {d}/script; echo x >> {d}/calls; echo 77", d = tmp.path().display()),
            "exit 0",
        );
        let c = client(tmp.path(), slurm);
        let mut reqs: Vec<SubmitRequest> =
            (0..3).map(|i| SubmitRequest::command(vec!["echo".into(), i.to_string()])).collect();
        for r in &mut reqs {
            r.image = Some("img:1".into());
        }
        let hs = c.submit_many(&reqs).unwrap();
        assert_eq!(std::fs::read_to_string(&calls).unwrap(), "x\n");
        let sids: Vec<_> = hs.iter().map(|h| h.slurm_id.as_str()).collect();
        assert_eq!(sids, ["77_0", "77_1", "77_2"]);
        let script = std::fs::read_to_string(tmp.path().join("script")).unwrap();
        assert!(script.contains("#SBATCH --array=0-2"), "{script}");
        for (i, h) in hs.iter().enumerate() {
            assert!(script.contains(&format!("{i}) exec >>'{}'", c.log_path(&h.id).display())), "{script}");
            assert_eq!(std::fs::read_to_string(h.dir.join("slurm-id")).unwrap(), format!("77_{i}\n"));
        }
        // Mixed resources cannot share one array.
        reqs[1].cpus = 2;
        assert!(matches!(c.submit_many(&reqs), Err(ClientError::InvalidRequest(_))));
        assert_eq!(std::fs::read_to_string(&calls).unwrap(), "x\n");
    }

    #[test]
    fn allocation_plans() {
        let part = |nodes, max: Option<u64>| slurm::PartitionInfo { name: "p".into(), nodes, max_time_secs: max };
        // One node: everything in one allocation, in order.
        assert_eq!(plan_allocations(3, 100, 60, &part(1, Some(7200))), Some(vec![vec![0, 1, 2]]));
        // Two nodes: dealt round-robin.
        assert_eq!(plan_allocations(5, 100, 60, &part(2, None)), Some(vec![vec![0, 2, 4], vec![1, 3]]));
        // At most per_allocation calls each.
        let g = plan_allocations(200, 64, 60, &part(1, None)).unwrap();
        assert_eq!(g.len(), 4);
        assert!(g.iter().all(|g| g.len() <= 64));
        assert_eq!(g.iter().map(Vec::len).sum::<usize>(), 200);
        // The partition's time limit bounds the calls per allocation:
        // (2 h - 2 min) / (10 min + 30 s) = 11.
        let g = plan_allocations(30, 100, 600, &part(1, Some(7200))).unwrap();
        assert_eq!(g.len(), 3);
        assert!(g.iter().all(|g| g.len() <= 11));
        // Nothing to share: one call, one call per node, sharing off, or
        // calls too long for two to fit.
        assert_eq!(plan_allocations(1, 100, 60, &part(1, None)), None);
        assert_eq!(plan_allocations(4, 100, 60, &part(4, None)), None);
        assert_eq!(plan_allocations(4, 1, 60, &part(1, None)), None);
        assert_eq!(plan_allocations(4, 100, 3600, &part(1, Some(7200))), None);
    }

    #[test]
    fn shared_submission_and_cancel() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let mut slurm = fake_slurm(
            &bin,
            &format!("echo \"$@\" > {d}/args; cat > {d}/script; echo 77", d = bin.display()),
            "echo '77|RUNNING|None'",
        );
        let log = bin.join("scancel.log");
        std::fs::write(&slurm.scancel, format!("#!/bin/sh\necho \"$@\" >> {}\n", log.display())).unwrap();
        std::fs::write(&slurm.sinfo, "#!/bin/sh\necho 'delegate*|1|2:00:00|idle'\n").unwrap();
        slurm.partition = None;
        let c = client(tmp.path(), slurm);
        let reqs: Vec<SubmitRequest> = (0..3)
            .map(|i| {
                let mut r = SubmitRequest::command(vec!["echo".into(), i.to_string()]);
                r.image = Some("img:1".into());
                r.time_limit_secs = 60;
                r
            })
            .collect();
        let hs = c.submit_many(&reqs).unwrap();
        let script = std::fs::read_to_string(bin.join("script")).unwrap();
        assert!(!script.contains("--array"), "{script}");
        let dirs: Vec<String> = hs.iter().map(|h| format!("'{}'", h.dir.display())).collect();
        assert_eq!(script, format!("#!/bin/sh\nexec '/nonexistent/runner' batch {}\n", dirs.join(" ")));
        // Slurm's time: 3 x (60 s + allowance), plus a minute of slack.
        let args = std::fs::read_to_string(bin.join("args")).unwrap();
        assert!(args.contains(&format!("--time={}", slurm::time_limit_minutes(3 * (60 + SHARED_CALL_ALLOWANCE_SECS)))), "{args}");
        for h in &hs {
            assert_eq!(h.slurm_id, "77");
            assert_eq!(std::fs::read_to_string(h.dir.join("slurm-id")).unwrap(), "77\nshared 3\n");
        }
        // The first call runs; the others wait their turn in the allocation.
        write_started(&hs[0].dir);
        let st = c.status(&hs.iter().map(|h| h.id.clone()).collect::<Vec<_>>()).unwrap();
        assert_eq!(st[0].state, State::Running);
        assert_eq!(st[1].state, State::Pending);
        assert_eq!(st[1].reason, "waiting for its turn in its shared allocation");
        // Cancelling one call that has not started ends it at once, without scancel.
        let st = c.cancel(std::slice::from_ref(&hs[2].id)).unwrap();
        assert_eq!(st[0].state, State::Cancelled);
        assert_eq!(st[0].reason, "cancelled by the user before it started");
        assert!(!log.exists(), "scancel must not be called for a shared allocation");
        assert_eq!(c.status(std::slice::from_ref(&hs[1].id)).unwrap()[0].state, State::Pending);
        // Cancelling the last live call cancels the allocation in Slurm, once
        // (the list of its calls says the others are over).
        let list = c.root().join("shared-77.calls");
        let want: String = hs.iter().map(|h| format!("{}\n", h.id)).collect();
        assert_eq!(std::fs::read_to_string(&list).unwrap(), want);
        write_completed(&hs[0].dir, 0, "exited with code 0", 5);
        let _ = c.cancel(std::slice::from_ref(&hs[1].id));
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "77\n");
        // Without the list, only a cancel of all its live calls at once does.
        std::fs::remove_file(&log).unwrap();
        let hs = c.submit_many(&reqs).unwrap();
        std::fs::remove_file(c.root().join("shared-77.calls")).unwrap();
        let _ = c.cancel(std::slice::from_ref(&hs[0].id));
        assert!(!log.exists());
        let _ = c.cancel(&hs[1..].iter().map(|h| h.id.clone()).collect::<Vec<_>>());
        assert!(!log.exists(), "two of three calls: the allocation still has one to run");
        let _ = c.cancel(&hs.iter().map(|h| h.id.clone()).collect::<Vec<_>>());
        assert!(!log.exists(), "all are over already: nothing left for scancel");
    }

    #[test]
    fn root_is_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let c = client(tmp.path(), Slurm::default());
        for p in [tmp.path().join("home/.delegate"), tmp.path().join("home/.delegate/jobs")] {
            assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o700);
        }
        assert!(c.root().is_absolute());
        let id = JobId::new();
        assert_eq!(c.job_dir(&id), c.root().join(id.as_str()));
        assert!(matches!(c.status(&[id]), Err(ClientError::NoSuchJob { .. })));
        let rel = Client::new(Config {
            root: "relative/root".into(),
            runner: "/x".into(),
            slurm: Slurm::default(),
            calls_per_allocation: None,
        });
        assert!(matches!(rel, Err(ClientError::Root { .. })));
    }

    #[test]
    fn submit_then_lost_then_stable() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        // sbatch records its arguments and stdin; squeue lists nothing.
        let slurm = fake_slurm(
            &bin,
            &format!("echo \"$@\" > {0}/args; cat > {0}/script; echo '42;cluster'", bin.display()),
            "exit 0",
        );
        let c = client(tmp.path(), slurm);
        let mut req = SubmitRequest::command(vec!["echo".into(), "hi".into()]);
        req.image = Some("img:1".into());
        req.payload = Some(b"abc".to_vec());
        let h = c.submit(&req).unwrap();
        assert_eq!(h.slurm_id, "42");
        let args = std::fs::read_to_string(bin.join("args")).unwrap();
        assert!(args.contains(&format!("--job-name={}", h.id)), "{args}");
        assert!(args.contains("--time=11"), "{args}");
        let script = std::fs::read_to_string(bin.join("script")).unwrap();
        assert_eq!(script, format!("#!/bin/sh\nexec '/nonexistent/runner' '{}'\n", h.dir.display()));
        assert_eq!(std::fs::read(h.dir.join("payload")).unwrap(), b"abc");
        assert_eq!(c.spec(&h.id).unwrap().image, "img:1");
        // Slurm no longer lists it and there is no outcome: lost, written once.
        std::fs::write(c.log_path(&h.id), "slurm_script: exec: /nonexistent/runner: not found\n").unwrap();
        let s = c.status(std::slice::from_ref(&h.id)).unwrap();
        assert_eq!(s[0].state, State::Lost);
        assert!(s[0].reason.contains("gone"), "{}", s[0].reason);
        assert!(s[0].reason.contains("not found"), "{}", s[0].reason);
        let again = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_secs(5))).unwrap();
        assert_eq!(again[0].reason, s[0].reason);
        assert_eq!(again[0].finished_ms, s[0].finished_ms);
        let listed = c.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, h.id);
    }

    #[test]
    fn refused_and_sbatch_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let c = client(
            tmp.path(),
            fake_slurm(&bin, "echo 'sbatch: error: Batch job submission failed: Invalid partition' >&2; exit 1", ""),
        );
        let mut req = SubmitRequest::command(vec!["true".into()]);
        req.image = Some("img".into());
        match c.submit(&req) {
            Err(ClientError::SubmitFailed { id, reason }) => {
                assert_eq!(reason, "sbatch failed: sbatch: error: Batch job submission failed: Invalid partition");
                let s = c.status(&[id]).unwrap();
                assert_eq!(s[0].state, State::Failed);
                assert_eq!(s[0].reason, reason);
            }
            other => panic!("{other:?}"),
        }
        // A job the runner refused: Slurm says COMPLETED, the log says why.
        let c = client(
            tmp.path(),
            fake_slurm(&bin, "echo 7", "echo '7|COMPLETED|None'; echo '8|RUNNING|None'"),
        );
        let h = c.submit(&req).unwrap();
        std::fs::write(c.log_path(&h.id), "delegate: refused: cpus 99 is more than the site maximum of 2\n").unwrap();
        let s = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_secs(5))).unwrap();
        assert_eq!(s[0].state, State::Failed);
        assert!(s[0].refused);
        assert_eq!(s[0].reason, "cpus 99 is more than the site maximum of 2");
    }

    #[test]
    fn cancel_marks_and_scancels_once() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let mut slurm = fake_slurm(&bin, "echo $$", "exit 0");
        // scancel records its arguments (all ids in one call).
        let log = bin.join("scancel.log");
        std::fs::write(&slurm.scancel, format!("#!/bin/sh\necho \"$@\" >> {}\n", log.display())).unwrap();
        slurm.squeue = bin.join("squeue");
        let c = client(tmp.path(), slurm);
        let mut req = SubmitRequest::command(vec!["true".into()]);
        req.image = Some("img".into());
        let a = c.submit(&req).unwrap();
        let b = c.submit(&req).unwrap();
        let st = c.cancel(&[a.id.clone(), b.id.clone()]).unwrap();
        assert!(st.iter().all(|s| s.state == State::Cancelled && s.reason == "cancelled by the user"));
        assert!(a.dir.join("cancel").exists());
        let calls = std::fs::read_to_string(&log).unwrap();
        assert_eq!(calls.trim(), format!("{} {}", a.slurm_id, b.slurm_id));
        // Cancelling a finished job changes nothing and calls no scancel.
        let again = c.cancel(std::slice::from_ref(&a.id)).unwrap();
        assert_eq!(again[0].finished_ms, st[0].finished_ms);
        assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
    }

    #[test]
    fn wait_wakes_on_outcome_and_times_out() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let c = client(tmp.path(), fake_slurm(&bin, "echo 9", "echo '9|RUNNING|None'"));
        let mut req = SubmitRequest::command(vec!["true".into()]);
        req.image = Some("img".into());
        let h = c.submit(&req).unwrap();
        let s = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_millis(300))).unwrap();
        assert_eq!(s[0].state, State::Running, "{:?}", s);
        let dir = h.dir.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            write_completed(&dir, 3, "exited with 3", 1000);
        });
        let t0 = Instant::now();
        let s = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_secs(10))).unwrap();
        writer.join().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(s[0].state, State::Completed);
        assert_eq!(s[0].exit_code, Some(3));
        assert_eq!(exit_status_for(&s[0]), Some(3));
        assert_eq!(s[0].host.as_deref(), Some("n1"));
    }

    #[test]
    fn consecutive_waits_share_one_squeue_per_interval() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let log = tmp.path().join("squeue-calls");
        let c = client(
            tmp.path(),
            fake_slurm(&bin, "echo 9", &format!("echo x >> {}; echo '9|PENDING|Resources'", log.display())),
        );
        let mut req = SubmitRequest::command(vec!["true".into()]);
        req.image = Some("img".into());
        let h = c.submit(&req).unwrap();
        // Short rounds, as the Python waiter makes them: the first asks
        // Slurm, the next ones within the interval read only the files.
        for _ in 0..4 {
            let s = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_millis(100))).unwrap();
            assert_eq!(s[0].state, State::Pending, "{s:?}");
        }
        // So do the waits of another client of the same root (Python makes
        // one per call).
        let c2 = Client::new(c.config().clone()).unwrap();
        c2.wait(std::slice::from_ref(&h.id), Some(Duration::from_millis(100))).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
    }

    #[test]
    fn wait_any_returns_when_one_job_is_over() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let c = client(tmp.path(), fake_slurm(&bin, "echo 9", "echo '9|RUNNING|None'"));
        let mut req = SubmitRequest::command(vec!["true".into()]);
        req.image = Some("img".into());
        let a = c.submit(&req).unwrap();
        let b = c.submit(&req).unwrap();
        let dir = b.dir.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            write_completed(&dir, 0, "exited with code 0", 100);
        });
        let t0 = Instant::now();
        let s = c.wait_any_with(&[a.id.clone(), b.id.clone()], Some(Duration::from_secs(10)), || false).unwrap();
        writer.join().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert_eq!(s.len(), 2);
        assert!(!s[0].is_terminal(), "{s:?}");
        assert_eq!(s[1].state, State::Completed);
    }
}

//! The job-directory protocol: the whole contract between the user side
//! (CLI, Python shim) and the worker side (`sandbox-runner`).
//!
//! A job lives in one directory, `<delegate-root>/<job-id>/`, on the shared
//! filesystem. Files and who writes them:
//!
//! | file       | writer           | content                                              |
//! |------------|------------------|------------------------------------------------------|
//! | `spec`     | client           | [`Spec`], encoded (header + postcard), bounded        |
//! | `payload`  | client, optional | opaque bytes (a pickled call); never parsed by Rust   |
//! | `slurm-id` | client           | the Slurm job id, text (see [`format_slurm_id`])      |
//! | `cancel`   | client, optional | marker: the user asked to cancel                      |
//! | `started`  | runner           | [`Started`], encoded                                  |
//! | `stdout`   | runner           | the container's standard output, streamed             |
//! | `stderr`   | runner           | the container's standard error, streamed              |
//! | `outcome`  | runner (client when the runner never ran) | [`Outcome`], encoded          |
//! | `result`   | the sandbox      | opaque bytes (a pickled return value or exception)    |
//!
//! Slurm's own log of the batch script goes to `<delegate-root>/<job-id>.log`,
//! beside (not inside) the directory, so a runner that refuses a directory can
//! still explain why. Calls that share an allocation (`sandbox-runner batch`,
//! one after another) have the runner write that file per call instead, and
//! the client lists the calls of each such allocation in
//! `<delegate-root>/shared-<slurm-id>.calls` (job ids, one per line; see
//! [`shared_calls_name`]) so that cancelling its last live call one by one
//! also cancels the allocation.
//!
//! Every encoded file starts with an 8-byte header: the magic `DLGT`, a
//! one-byte kind, a reserved zero byte and the protocol version (u16, little
//! endian); the body is postcard. Every file a reader may see is written
//! atomically ([`atomic_write_at`]): temporary name, fsync, rename, fsync of
//! the directory.
//!
//! Everything here treats the directory as untrusted: files are opened
//! relative to a directory descriptor with `O_NOFOLLOW`, sizes are bounded
//! before reading, versions are checked before decoding.

use std::fmt;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Version of every encoded file of the protocol. Bump on any change of
/// [`Spec`], [`Started`] or [`Outcome`].
pub const PROTOCOL_VERSION: u16 = 1;
/// First four bytes of every encoded file.
pub const MAGIC: &[u8; 4] = b"DLGT";
const HEADER_LEN: usize = 8;

/// Upper bound on the size of an encoded spec.
pub const MAX_SPEC_BYTES: u64 = 64 * 1024;
/// Upper bound on the size of an encoded started record or outcome.
pub const MAX_RECORD_BYTES: u64 = 64 * 1024;
/// Upper bound on the size of the opaque payload.
pub const MAX_PAYLOAD_BYTES: u64 = 256 * 1024 * 1024;
/// Upper bound on the number of argv entries and environment variables.
pub const MAX_ARGS: usize = 4096;
pub const MAX_ENV: usize = 128;
/// Upper bound on a single string inside the spec.
pub const MAX_STRING: usize = 8 * 1024;

pub const SPEC: &str = "spec";
pub const PAYLOAD: &str = "payload";
pub const SLURM_ID: &str = "slurm-id";
pub const CANCEL: &str = "cancel";
pub const STARTED: &str = "started";
pub const STDOUT: &str = "stdout";
pub const STDERR: &str = "stderr";
pub const OUTCOME: &str = "outcome";
pub const RESULT: &str = "result";
/// Files the client writes before the runner starts; anything else present
/// when the runner starts is refused.
/// The content of a `slurm-id` file: the Slurm id of the job (`123`) or job
/// array element (`123_4`) that runs the call, and, when that allocation
/// runs `shared` calls of one submission one after another (each in its own
/// container), a second line `shared <n>`.
pub fn format_slurm_id(slurm_id: &str, shared: Option<u32>) -> String {
    match shared {
        Some(n) => format!("{slurm_id}\nshared {n}\n"),
        None => format!("{slurm_id}\n"),
    }
}

/// The name (in the delegate root) of the list of the calls that share the
/// allocation `slurm_id`.
pub fn shared_calls_name(slurm_id: &str) -> String {
    format!("shared-{slurm_id}.calls")
}

/// Parses a list of calls ([`shared_calls_name`]): the valid job ids in it
/// (anything else is ignored).
pub fn parse_shared_calls(text: &str) -> Vec<JobId> {
    text.lines().filter_map(|l| JobId::parse(l.trim()).ok()).collect()
}

/// Parses a `slurm-id` file ([`format_slurm_id`]); `None` when it holds no
/// job id (junk is never trusted as one).
pub fn parse_slurm_id(text: &str) -> Option<(String, Option<u32>)> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let id = lines.next()?;
    let id_ok = id.bytes().next().is_some_and(|b| b.is_ascii_digit())
        && id.bytes().all(|c| c.is_ascii_digit() || c == b'_')
        && id.matches('_').count() <= 1
        && !id.ends_with('_');
    if !id_ok {
        return None;
    }
    let shared = match lines.next() {
        None => None,
        Some(l) => match l.strip_prefix("shared ").and_then(|n| n.trim().parse::<u32>().ok()) {
            Some(n) if n >= 1 => Some(n),
            _ => return None,
        },
    };
    if lines.next().is_some() {
        return None;
    }
    Some((id.to_owned(), shared))
}

pub const CLIENT_FILES: &[&str] = &[SPEC, PAYLOAD, SLURM_ID, CANCEL];
/// Where the job directory appears inside the sandbox.
pub const SANDBOX_JOB_DIR: &str = "/job";

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a valid job id (expected YYYYMMDDTHHMMSS-xxxxxxxx)")]
    BadJobId(String),
    #[error("{path} is {size} bytes, more than the limit of {limit}")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("{path} is not a delegate file (bad magic)")]
    BadMagic { path: String },
    #[error("{path} has protocol version {found}, this program speaks version {expected}")]
    VersionMismatch {
        path: String,
        found: u16,
        expected: u16,
    },
    #[error("{path} holds a {found} record where a {expected} record was expected")]
    WrongKind {
        path: String,
        found: char,
        expected: char,
    },
    #[error("{path} could not be decoded: {reason}")]
    Decode { path: String, reason: String },
    #[error("{path} is a symbolic link; delegate never follows links in job directories")]
    Symlink { path: String },
    #[error("{path} is not a {expected}")]
    NotKind { path: String, expected: &'static str },
    #[error("{path} is owned by uid {found}, expected uid {expected}")]
    WrongOwner {
        path: String,
        found: u32,
        expected: u32,
    },
    #[error("{path} is owned by uid {owner} and cannot be opened (permission denied)")]
    NoAccess { path: String, owner: u32 },
    #[error("{path} is writable by group or others (mode {mode:o})")]
    TooOpen { path: String, mode: u32 },
    #[error("{path} is not a clean absolute path (it must be absolute, without '..' or '.')")]
    BadPath { path: String },
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
}

impl ProtocolError {
    pub fn io(path: impl fmt::Display, source: impl Into<std::io::Error>) -> Self {
        ProtocolError::Io {
            path: path.to_string(),
            source: source.into(),
        }
    }
    /// True when the error means "the file does not exist".
    pub fn is_not_found(&self) -> bool {
        matches!(self, ProtocolError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

pub type Result<T, E = ProtocolError> = std::result::Result<T, E>;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Job ids
// ---------------------------------------------------------------------------

/// A job id: `YYYYMMDDTHHMMSS-xxxxxxxx` (UTC time of creation and 32 random
/// bits in hex). Unique without coordination, valid as a file name and as a
/// Slurm job name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(String);

impl JobId {
    pub fn new() -> Self {
        let secs = now_ms() / 1000;
        let mut rnd = [0u8; 4];
        // getrandom only fails when the kernel has no entropy source at all;
        // fall back to the clock's nanoseconds mixed with the pid.
        if getrandom::fill(&mut rnd).is_err() {
            let n = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
                ^ std::process::id().rotate_left(16);
            rnd = n.to_le_bytes();
        }
        let (y, mo, d, h, mi, s) = civil_from_unix(secs as i64);
        JobId(format!(
            "{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}-{:08x}",
            u32::from_le_bytes(rnd)
        ))
    }

    pub fn parse(s: &str) -> Result<Self> {
        let b = s.as_bytes();
        let ok = b.len() == 24
            && b[..8].iter().all(u8::is_ascii_digit)
            && b[8] == b'T'
            && b[9..15].iter().all(u8::is_ascii_digit)
            && b[15] == b'-'
            && b[16..]
                .iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
        if ok {
            Ok(JobId(s.to_owned()))
        } else {
            Err(ProtocolError::BadJobId(s.chars().take(64).collect()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for JobId {
    type Error = ProtocolError;
    fn try_from(s: String) -> Result<Self> {
        JobId::parse(&s)
    }
}

impl From<JobId> for String {
    fn from(j: JobId) -> String {
        j.0
    }
}

/// Days-from-civil inverse (Howard Hinnant's algorithm), UTC.
fn civil_from_unix(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        ((rem % 3600) / 60) as u32,
        (rem % 60) as u32,
    )
}

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

/// What the sandbox runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Task {
    /// Run argv (no shell) in the image, working directory [`SANDBOX_JOB_DIR`].
    Command { argv: Vec<String> },
    /// Run the Python executor on `payload`; it writes `result`. The versions
    /// are the caller's, so the executor can name a mismatch.
    Python {
        python_version: String,
        cloudpickle_version: String,
    },
}

/// Resources asked for. The runner checks each against the site policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub cpus: u32,
    pub mem_bytes: u64,
    pub time_limit_secs: u64,
    /// Nodes of the allocation (one container per node). 1 for now.
    pub nodes: u32,
    /// GPUs per node passed through to the container. 0 for now.
    pub gpus: u32,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: 1,
            mem_bytes: 1 << 30,
            time_limit_secs: 600,
            nodes: 1,
            gpus: 0,
        }
    }
}

/// The job's request, written once by the client before submission.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub job_id: JobId,
    /// The uid the job must run as; the runner checks it is its own real uid.
    pub uid: u32,
    pub gid: u32,
    pub created_ms: u64,
    pub image: String,
    pub task: Task,
    pub resources: Resources,
    /// Extra environment for the sandbox (names `[A-Z_][A-Z0-9_]*`).
    pub env: Vec<(String, String)>,
}

impl Spec {
    /// Structural checks that need no site policy: bounds and well-formedness.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ProtocolError::InvalidSpec(m));
        if self.image.is_empty() || self.image.len() > 256 {
            return bad("the image name must be 1 to 256 characters".into());
        }
        match &self.task {
            Task::Command { argv } => {
                if argv.is_empty() {
                    return bad("the command is empty".into());
                }
                if argv.len() > MAX_ARGS {
                    return bad(format!("more than {MAX_ARGS} arguments"));
                }
                if argv.iter().any(|a| a.len() > MAX_STRING || a.contains('\0')) {
                    return bad(format!(
                        "an argument is longer than {MAX_STRING} bytes or contains NUL"
                    ));
                }
            }
            Task::Python {
                python_version,
                cloudpickle_version,
            } => {
                if python_version.len() > 64 || cloudpickle_version.len() > 64 {
                    return bad("version strings longer than 64 bytes".into());
                }
            }
        }
        if self.env.len() > MAX_ENV {
            return bad(format!("more than {MAX_ENV} environment variables"));
        }
        for (k, v) in &self.env {
            let valid_name = !k.is_empty()
                && k.len() <= 128
                && k.bytes().enumerate().all(|(i, c)| {
                    c == b'_' || c.is_ascii_uppercase() || (i > 0 && c.is_ascii_digit())
                });
            if !valid_name {
                return bad(format!("invalid environment variable name {k:?}"));
            }
            if v.len() > MAX_STRING || v.contains('\0') {
                return bad(format!("environment variable {k} is too long or contains NUL"));
            }
        }
        let r = &self.resources;
        if r.cpus == 0 || r.mem_bytes == 0 || r.time_limit_secs == 0 || r.nodes == 0 {
            return bad("cpus, memory, time limit and nodes must be positive".into());
        }
        Ok(())
    }
}

/// Written by the runner when the container has started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub host: String,
    pub started_ms: u64,
    pub container_id: String,
    /// How perf counters are reachable: "perfmon", "seccomp" or "off".
    pub perf_mode: String,
}

/// Lifecycle of a job. Terminal states carry a reason in the [`Outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum State {
    Pending,
    Running,
    Completed,
    Failed,
    TimedOut,
    Cancelled,
    /// Slurm says the job is gone and no outcome exists.
    Lost,
}

impl State {
    pub fn is_terminal(self) -> bool {
        !matches!(self, State::Pending | State::Running)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Completed => "completed",
            State::Failed => "failed",
            State::TimedOut => "timed-out",
            State::Cancelled => "cancelled",
            State::Lost => "lost",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who wrote an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Writer {
    Runner,
    Client,
}

/// The end of a job, written once, atomically.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Always terminal.
    pub state: State,
    /// The main process's exit code, when it ran to an exit.
    pub exit_code: Option<i32>,
    /// Human-readable, one sentence.
    pub reason: String,
    /// The runner refused the job before creating any container.
    pub refused: bool,
    pub oom_killed: bool,
    pub started_ms: Option<u64>,
    pub finished_ms: u64,
    pub host: String,
    pub writer: Writer,
}

impl Outcome {
    /// An outcome of a job that did not run to an exit (no exit code, no
    /// start time), finished now.
    pub fn ended(state: State, reason: impl Into<String>, host: impl Into<String>, writer: Writer) -> Outcome {
        Outcome {
            state,
            exit_code: None,
            reason: reason.into(),
            refused: false,
            oom_killed: false,
            started_ms: None,
            finished_ms: now_ms(),
            host: host.into(),
            writer,
        }
    }
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

/// A record type of the protocol: its one-byte kind and its size bound.
pub trait Record: Serialize + DeserializeOwned {
    const KIND: u8;
    const MAX_BYTES: u64;
    const NAME: &'static str;
}

impl Record for Spec {
    const KIND: u8 = b'S';
    const MAX_BYTES: u64 = MAX_SPEC_BYTES;
    const NAME: &'static str = SPEC;
}
impl Record for Started {
    const KIND: u8 = b'T';
    const MAX_BYTES: u64 = MAX_RECORD_BYTES;
    const NAME: &'static str = STARTED;
}
impl Record for Outcome {
    const KIND: u8 = b'O';
    const MAX_BYTES: u64 = MAX_RECORD_BYTES;
    const NAME: &'static str = OUTCOME;
}

/// Header + postcard body.
pub fn encode<R: Record>(r: &R) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(MAGIC);
    out.push(R::KIND);
    out.push(0);
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    let body = postcard::to_allocvec(r).map_err(|e| ProtocolError::Decode {
        path: R::NAME.into(),
        reason: format!("encoding failed: {e}"),
    })?;
    out.extend_from_slice(&body);
    if out.len() as u64 > R::MAX_BYTES {
        return Err(ProtocolError::TooLarge {
            path: R::NAME.into(),
            size: out.len() as u64,
            limit: R::MAX_BYTES,
        });
    }
    Ok(out)
}

/// Checks size, magic, kind and version, then decodes. `path` names the
/// source in errors.
pub fn decode<R: Record>(bytes: &[u8], path: &str) -> Result<R> {
    if bytes.len() as u64 > R::MAX_BYTES {
        return Err(ProtocolError::TooLarge {
            path: path.into(),
            size: bytes.len() as u64,
            limit: R::MAX_BYTES,
        });
    }
    if bytes.len() < HEADER_LEN || &bytes[..4] != MAGIC {
        return Err(ProtocolError::BadMagic { path: path.into() });
    }
    let version = u16::from_le_bytes([bytes[6], bytes[7]]);
    if version != PROTOCOL_VERSION {
        return Err(ProtocolError::VersionMismatch {
            path: path.into(),
            found: version,
            expected: PROTOCOL_VERSION,
        });
    }
    if bytes[4] != R::KIND {
        return Err(ProtocolError::WrongKind {
            path: path.into(),
            found: bytes[4] as char,
            expected: R::KIND as char,
        });
    }
    let (value, rest) =
        postcard::take_from_bytes::<R>(&bytes[HEADER_LEN..]).map_err(|e| ProtocolError::Decode {
            path: path.into(),
            reason: e.to_string(),
        })?;
    if !rest.is_empty() {
        return Err(ProtocolError::Decode {
            path: path.into(),
            reason: format!("{} trailing bytes", rest.len()),
        });
    }
    Ok(value)
}

// ---------------------------------------------------------------------------
// Safe file access relative to a directory descriptor
// ---------------------------------------------------------------------------

/// Rejects relative paths and paths with `.` or `..` components.
pub fn check_clean_absolute(path: &Path) -> Result<()> {
    let clean = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if clean {
        Ok(())
    } else {
        Err(ProtocolError::BadPath {
            path: path.display().to_string(),
        })
    }
}

/// Opens a directory by walking its components from `/` with `O_NOFOLLOW`,
/// so no component may be a symlink (no check-then-use race: each step is
/// relative to the descriptor of the previous one).
pub fn open_dir_nofollow(path: &Path) -> Result<OwnedFd> {
    check_clean_absolute(path)?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut fd = nix::fcntl::open("/", flags, Mode::empty()).map_err(|e| ProtocolError::io("/", e))?;
    let mut sofar = PathBuf::from("/");
    for comp in path.components() {
        if let Component::Normal(name) = comp {
            sofar.push(name);
            fd = match openat(&fd, name, flags, Mode::empty()) {
                Ok(next) => next,
                Err(Errno::ELOOP) => {
                    return Err(ProtocolError::Symlink {
                        path: sofar.display().to_string(),
                    })
                }
                Err(Errno::ENOTDIR) => {
                    // O_DIRECTORY|O_NOFOLLOW on a symlink gives ENOTDIR on some kernels.
                    let st = nix::sys::stat::fstatat(&fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
                    if let Ok(st) = st {
                        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK {
                            return Err(ProtocolError::Symlink {
                                path: sofar.display().to_string(),
                            });
                        }
                    }
                    return Err(ProtocolError::NotKind {
                        path: sofar.display().to_string(),
                        expected: "directory",
                    });
                }
                Err(Errno::EACCES) => {
                    let owner = nix::sys::stat::fstatat(&fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
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
    }
    Ok(fd)
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
pub fn read_bounded_at(
    dir: impl AsFd,
    dir_path: &Path,
    name: &str,
    limit: u64,
    uid: Option<u32>,
) -> Result<Vec<u8>> {
    let path = dir_path.join(name).display().to_string();
    let fd = match openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return Err(ProtocolError::Symlink { path }),
        Err(e) => return Err(ProtocolError::io(&path, e)),
    };
    let st = fstat(&fd).map_err(|e| ProtocolError::io(&path, e))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(ProtocolError::NotKind {
            path,
            expected: "regular file",
        });
    }
    if let Some(uid) = uid {
        if st.st_uid != uid {
            return Err(ProtocolError::WrongOwner {
                path,
                found: st.st_uid,
                expected: uid,
            });
        }
    }
    if st.st_size as u64 > limit {
        return Err(ProtocolError::TooLarge {
            path,
            size: st.st_size as u64,
            limit,
        });
    }
    let mut buf = Vec::with_capacity(st.st_size.max(0) as usize);
    std::fs::File::from(fd)
        .take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ProtocolError::io(&path, e))?;
    if buf.len() as u64 > limit {
        return Err(ProtocolError::TooLarge {
            path,
            size: buf.len() as u64,
            limit,
        });
    }
    Ok(buf)
}

/// Reads and decodes a record from `dir`.
pub fn read_record_at<R: Record>(dir: impl AsFd, dir_path: &Path, uid: Option<u32>) -> Result<R> {
    let bytes = read_bounded_at(dir, dir_path, R::NAME, R::MAX_BYTES, uid)?;
    decode(&bytes, &dir_path.join(R::NAME).display().to_string())
}

/// Writes `bytes` to `name` in `dir` atomically: a temporary file in the
/// same directory, fsync, rename over `name`, fsync of the directory. A
/// reader sees either the old file (or none) or the whole new one.
pub fn atomic_write_at(dir: impl AsFd, dir_path: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
    let path = dir_path.join(name).display().to_string();
    let mut rnd = [0u8; 6];
    let _ = getrandom::fill(&mut rnd);
    let tmp = format!(
        ".{name}.tmp-{}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        std::process::id(),
        rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]
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
        .and_then(|_| f.sync_all())
        .map_err(|e| ProtocolError::io(&path, e))
        .and_then(|_| {
            renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name).map_err(|e| ProtocolError::io(&path, e))
        });
    if res.is_err() {
        let _ = nix::unistd::unlinkat(dir.as_fd(), tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        return res;
    }
    // Make the rename durable; failure here does not undo the write.
    let _ = nix::unistd::fsync(dir.as_fd());
    Ok(())
}

/// Encodes and atomically writes a record into `dir`.
pub fn write_record_at<R: Record>(dir: impl AsFd, dir_path: &Path, r: &R) -> Result<()> {
    let bytes = encode(r)?;
    atomic_write_at(dir, dir_path, R::NAME, &bytes, 0o644)
}

/// Names in the directory other than `.` and `..`, at most `limit` of them
/// (an error beyond, so a directory stuffed with entries cannot exhaust memory).
pub fn list_entries(dir: impl AsFd, dir_path: &Path, limit: usize) -> Result<Vec<String>> {
    let path = dir_path.display().to_string();
    let dup = dir
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| ProtocolError::io(&path, e))?;
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

    fn spec() -> Spec {
        Spec {
            job_id: JobId::new(),
            uid: 1000,
            gid: 1000,
            created_ms: now_ms(),
            image: "delegate-sandbox:latest".into(),
            task: Task::Command {
                argv: vec!["echo".into(), "hi".into()],
            },
            resources: Resources::default(),
            env: vec![("FOO".into(), "bar".into())],
        }
    }

    #[test]
    fn job_id_format_and_parse() {
        let id = JobId::new();
        assert_eq!(JobId::parse(id.as_str()).unwrap(), id);
        assert!(JobId::parse("../etc").is_err());
        assert!(JobId::parse("20261123T103000-ABCDEF01").is_err());
        assert!(JobId::parse("20261123T103000-abcdef01").is_ok());
        assert_ne!(JobId::new(), JobId::new());
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_unix(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(civil_from_unix(1_795_425_059), (2026, 11, 23, 9, 10, 59));
        assert_eq!(civil_from_unix(951_782_400), (2000, 2, 29, 0, 0, 0));
    }

    #[test]
    fn round_trip() {
        let s = spec();
        let b = encode(&s).unwrap();
        assert_eq!(&b[..4], MAGIC);
        assert_eq!(decode::<Spec>(&b, "spec").unwrap(), s);
        let o = Outcome {
            state: State::TimedOut,
            exit_code: None,
            reason: "time limit of 5s reached".into(),
            refused: false,
            oom_killed: false,
            started_ms: Some(1),
            finished_ms: 2,
            host: "n1".into(),
            writer: Writer::Runner,
        };
        assert_eq!(decode::<Outcome>(&encode(&o).unwrap(), "outcome").unwrap(), o);
    }

    #[test]
    fn version_mismatch_is_named() {
        let mut b = encode(&spec()).unwrap();
        b[6] = 99;
        match decode::<Spec>(&b, "spec") {
            Err(ProtocolError::VersionMismatch { found: 99, expected: 1, .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn wrong_kind_bad_magic_trailing_and_garbage() {
        let b = encode(&spec()).unwrap();
        assert!(matches!(decode::<Outcome>(&b, "x"), Err(ProtocolError::WrongKind { .. })));
        assert!(matches!(decode::<Spec>(b"nope", "x"), Err(ProtocolError::BadMagic { .. })));
        let mut t = b.clone();
        t.push(0);
        assert!(matches!(decode::<Spec>(&t, "x"), Err(ProtocolError::Decode { .. })));
        let mut g = b[..HEADER_LEN].to_vec();
        g.extend_from_slice(&[0xff; 40]);
        assert!(decode::<Spec>(&g, "x").is_err());
    }

    #[test]
    fn size_bound() {
        let big = vec![0u8; MAX_SPEC_BYTES as usize + 1];
        assert!(matches!(decode::<Spec>(&big, "x"), Err(ProtocolError::TooLarge { .. })));
        let mut s = spec();
        s.task = Task::Command {
            argv: vec!["x".repeat(MAX_STRING); 9],
        };
        assert!(matches!(encode(&s), Err(ProtocolError::TooLarge { .. })));
    }

    #[test]
    fn validate_rejects() {
        let mut s = spec();
        s.task = Task::Command { argv: vec![] };
        assert!(s.validate().is_err());
        let mut s = spec();
        s.env = vec![("lower".into(), "x".into())];
        assert!(s.validate().is_err());
        let mut s = spec();
        s.resources.cpus = 0;
        assert!(s.validate().is_err());
        assert!(spec().validate().is_ok());
    }

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
        assert!(read_bounded_at(&dir, tmp.path(), "missing", 10, None).unwrap_err().is_not_found());
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
        assert!(matches!(open_dir_nofollow(Path::new("relative")), Err(ProtocolError::BadPath { .. })));
    }

    #[test]
    fn ownership_check() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_dir_nofollow(tmp.path()).unwrap();
        let me = nix::unistd::getuid().as_raw();
        std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        assert!(check_owner(&dir, "d", me, true).is_ok());
        assert!(matches!(check_owner(&dir, "d", me + 1, true), Err(ProtocolError::WrongOwner { .. })));
        std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(matches!(check_owner(&dir, "d", me, true), Err(ProtocolError::TooOpen { .. })));
    }
}

/// Property tests of the decoder (issue 5): whatever bytes a student puts in
/// `spec` (or a broken filesystem puts in `started`/`outcome`), decoding never
/// panics, every rejection is one of the decoder's typed errors, and memory
/// stays bounded (a length prefix of 2^63 is an error, not an allocation).
#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// Counts, per thread, the bytes allocated and the largest single
    /// allocation, so a test can bound what one decode costs.
    struct Counting;
    thread_local! {
        static TOTAL: Cell<usize> = const { Cell::new(0) };
        static LARGEST: Cell<usize> = const { Cell::new(0) };
    }
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            let _ = TOTAL.try_with(|t| t.set(t.get() + l.size()));
            let _ = LARGEST.try_with(|m| m.set(m.get().max(l.size())));
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            let _ = TOTAL.try_with(|t| t.set(t.get() + new));
            let _ = LARGEST.try_with(|m| m.set(m.get().max(new)));
            unsafe { System.realloc(p, l, new) }
        }
    }
    #[global_allocator]
    static ALLOC: Counting = Counting;

    /// serde caps a sequence's pre-allocation at 1 MiB whatever its length
    /// prefix says; everything else a decode allocates is bounded by the input
    /// (itself at most MAX_SPEC_BYTES).
    const DECODE_ALLOC_BOUND: usize = 2 * 1024 * 1024;

    /// Decodes and returns (result, total bytes allocated, largest allocation).
    fn measured<R: Record>(bytes: &[u8]) -> (Result<R>, usize, usize) {
        TOTAL.with(|t| t.set(0));
        LARGEST.with(|m| m.set(0));
        let r = decode::<R>(bytes, "spec");
        (r, TOTAL.with(|t| t.get()), LARGEST.with(|m| m.get()))
    }

    /// The only errors `decode` may return: no I/O, no path errors, no panic.
    fn typed_rejection(e: &ProtocolError) -> bool {
        matches!(
            e,
            ProtocolError::TooLarge { .. }
                | ProtocolError::BadMagic { .. }
                | ProtocolError::VersionMismatch { .. }
                | ProtocolError::WrongKind { .. }
                | ProtocolError::Decode { .. }
        )
    }

    fn check<R: Record + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> std::result::Result<(), TestCaseError> {
        let (r, total, largest) = measured::<R>(bytes);
        prop_assert!(total <= DECODE_ALLOC_BOUND + 4 * bytes.len(), "decode allocated {total} bytes for {} input bytes", bytes.len());
        prop_assert!(largest <= DECODE_ALLOC_BOUND, "one allocation of {largest} bytes");
        match r {
            Err(e) => {
                prop_assert!(typed_rejection(&e), "untyped rejection {e:?}");
                // The message is one printable sentence.
                prop_assert!(!e.to_string().is_empty());
            }
            // Whatever decodes re-encodes to a value that decodes the same.
            Ok(v) => {
                if let Ok(again) = encode(&v) {
                    prop_assert_eq!(decode::<R>(&again, "spec").unwrap(), v);
                }
            }
        }
        Ok(())
    }

    fn header(kind: u8) -> Vec<u8> {
        let mut h = MAGIC.to_vec();
        h.push(kind);
        h.push(0);
        h.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        h
    }

    fn arb_spec() -> impl Strategy<Value = Spec> {
        let task = prop_oneof![
            proptest::collection::vec(".{0,40}", 0..8).prop_map(|argv| Task::Command { argv }),
            (".{0,10}", ".{0,10}").prop_map(|(p, c)| Task::Python {
                python_version: p,
                cloudpickle_version: c
            }),
        ];
        (
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            ".{0,40}",
            task,
            (any::<u32>(), any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>()),
            proptest::collection::vec(("[A-Z_]{0,8}", ".{0,20}"), 0..4),
        )
            .prop_map(|(uid, gid, created_ms, image, task, (cpus, mem_bytes, time_limit_secs, nodes, gpus), env)| Spec {
                job_id: JobId::new(),
                uid,
                gid,
                created_ms,
                image,
                task,
                resources: Resources {
                    cpus,
                    mem_bytes,
                    time_limit_secs,
                    nodes,
                    gpus,
                },
                env,
            })
    }

    #[derive(Debug, Clone)]
    enum Mutation {
        Flip(usize, u8),
        Truncate(usize),
        Insert(usize, Vec<u8>),
        Append(Vec<u8>),
    }

    fn arb_mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
            any::<usize>().prop_map(Mutation::Truncate),
            (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, v)| Mutation::Insert(i, v)),
            proptest::collection::vec(any::<u8>(), 1..16).prop_map(Mutation::Append),
        ]
    }

    fn apply(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
        for m in muts {
            let n = b.len().max(1);
            match m {
                Mutation::Flip(i, x) if !b.is_empty() => b[i % n] ^= x | 1,
                Mutation::Flip(..) => {}
                Mutation::Truncate(i) => b.truncate(i % n),
                Mutation::Insert(i, v) => {
                    let at = i % (b.len() + 1);
                    b.splice(at..at, v.iter().copied());
                }
                Mutation::Append(v) => b.extend_from_slice(v),
            }
        }
        b
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512), kind in prop_oneof![Just(b'S'), Just(b'T'), Just(b'O'), any::<u8>()]) {
            // Raw garbage, and garbage behind a valid header (to reach postcard).
            check::<Spec>(&body)?;
            let mut b = header(kind);
            b.extend_from_slice(&body);
            check::<Spec>(&b)?;
            check::<Started>(&b)?;
            check::<Outcome>(&b)?;
        }

        #[test]
        fn mutated_valid_specs_never_panic(s in arb_spec(), muts in proptest::collection::vec(arb_mutation(), 1..4)) {
            let b = encode(&s).unwrap();
            prop_assert_eq!(decode::<Spec>(&b, "spec").unwrap(), s.clone());
            let m = apply(b, &muts);
            check::<Spec>(&m)?;
            // A spec that still decodes may be refused later, never crash the checks.
            if let Ok(s) = decode::<Spec>(&m, "spec") {
                let _ = s.validate();
            }
        }

        #[test]
        fn any_trailing_bytes_are_refused(s in arb_spec(), extra in proptest::collection::vec(any::<u8>(), 1..64)) {
            // The spec has no field for privileges, capabilities, mounts or
            // devices: a spec that carries anything more than its known
            // fields (as a newer or forged client might) is refused whole.
            let mut b = encode(&s).unwrap();
            b.extend_from_slice(&extra);
            let r = decode::<Spec>(&b, "spec");
            prop_assert!(matches!(r, Err(ProtocolError::Decode { ref reason, .. }) if reason.contains("trailing")), "{r:?}");
        }
    }

    /// Length prefixes far beyond the input (up to 2^64-1) are errors, not
    /// allocations, for every variable-length field of every record.
    #[test]
    fn huge_length_prefixes_do_not_allocate() {
        let huge: [&[u8]; 3] = [
            &[0xff, 0xff, 0xff, 0xff, 0x0f],                                     // 2^32-1
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],             // 2^63-1
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],       // 2^64-1
        ];
        let valid = encode(&Spec {
            job_id: JobId::new(),
            uid: 1,
            gid: 1,
            created_ms: 1,
            image: "i".into(),
            task: Task::Command { argv: vec!["a".into()] },
            resources: Resources::default(),
            env: vec![("A".into(), "b".into())],
        })
        .unwrap();
        // The counter counts: decoding the valid spec allocates its strings.
        let (r, total, _) = measured::<Spec>(&valid);
        assert!(r.is_ok() && total > 0, "allocation counter is not counting");
        for prefix in huge {
            // The prefix at every offset of a valid spec: job id, image, argv
            // count, argv[0], env count, env name... whichever field it lands in.
            for at in HEADER_LEN..valid.len() {
                let mut b = valid[..at].to_vec();
                b.extend_from_slice(prefix);
                b.extend_from_slice(&valid[at..]);
                let (r, total, largest) = measured::<Spec>(&b);
                assert!(r.is_err() || r.is_ok(), "no panic");
                assert!(largest <= DECODE_ALLOC_BOUND, "offset {at}: one allocation of {largest} bytes");
                assert!(total <= DECODE_ALLOC_BOUND + 4 * b.len(), "offset {at}: {total} bytes");
                if let Err(e) = r {
                    assert!(typed_rejection(&e), "{e:?}");
                }
            }
            for kind in [b'S', b'T', b'O'] {
                let mut b = header(kind);
                b.extend_from_slice(prefix);
                b.extend_from_slice(b"short");
                let (r, _, largest) = measured::<Spec>(&b);
                assert!(r.is_err());
                assert!(largest <= DECODE_ALLOC_BOUND);
                let (r, _, largest) = measured::<Outcome>(&b);
                assert!(r.is_err() && largest <= DECODE_ALLOC_BOUND);
                let (r, _, largest) = measured::<Started>(&b);
                assert!(r.is_err() && largest <= DECODE_ALLOC_BOUND);
            }
        }
    }

    #[test]
    fn slurm_id_files() {
        for (sid, shared) in [("12", None), ("12_3", Some(7)), ("9", Some(1))] {
            assert_eq!(parse_slurm_id(&format_slurm_id(sid, shared)), Some((sid.to_owned(), shared)));
        }
        assert_eq!(parse_slurm_id("  42 \n"), Some(("42".into(), None)));
        for junk in ["", "\n", "abc", "_1", "1_", "1__2", "1_2_3", "12\nshared x", "12\nshared 0", "12\nshared 3\nmore", "12\nother 3"] {
            assert_eq!(parse_slurm_id(junk), None, "{junk:?}");
        }
    }
}

//! Who is calling: only from the kernel and from slurmctld, never from
//! anything the caller says (environment, arguments, messages).
//!
//! `SO_PEERCRED` gives the peer's pid and uid. The peer must be the task of
//! a Slurm batch step: its parent is a root-owned `slurmstepd` whose title
//! is `slurmstepd: [<job>.batch]` (a title only that root process sets;
//! delegate's batch scripts `exec` the runner, so the runner is that task).
//! slurmctld (squeue, fields the submitter cannot choose) must say the job is RUNNING, belongs to the peer's uid and has
//! its batch host on this node. A pidfd pins the peer: the agent watches it
//! and ends the sandbox when the batch task ends, and the peer's start time
//! is checked again after the slow checks (no pid reuse).

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ask::{AskError, BoundedRun};

/// At most this much of a Slurm command's answer about one job is read.
const MAX_SLURM_ANSWER: usize = 1 << 20;

/// Why a peer is not identified; each is the one sentence the runner is
/// told (and the agent logs).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentError {
    /// The peer process is not the step task it must be.
    #[error("the caller (pid {pid}) is not {what} on this node ({why})")]
    NotTask { pid: i32, what: &'static str, why: String },
    /// What slurmctld says of the job refuses it.
    #[error(transparent)]
    Job(#[from] JobRefusal),
    #[error("slurmctld did not answer about {what} in time")]
    SlurmTimeout { what: String },
    #[error("cannot ask slurmctld about {what}: {why}")]
    Slurm { what: String, why: String },
}

/// What slurmctld's answer about the caller's job refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JobRefusal {
    #[error("slurmctld does not know job {job}")]
    Unknown { job: String },
    #[error("Slurm job {job} is not running")]
    NotRunning { job: String },
    #[error("Slurm job {job} does not belong to uid {uid}")]
    OtherUser { job: String, uid: u32 },
    #[error("Slurm job {job} does not run its batch step on this node ({node})")]
    NotHere { job: String, node: String },
    #[error("Slurm job {job} has no usable node list")]
    NoNodeList { job: String },
    #[error("the job's node list is empty or too long")]
    BadNodeList,
    #[error("rank sandboxes are only for multi-node delegate jobs, and this Slurm job has one node")]
    OneNode,
    #[error("this node ({node}) is not one of the job's nodes")]
    NotOneOfNodes { node: String },
}

/// What the kernel cannot tell of a peer process.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("process {pid}: {source}")]
    Read { pid: i32, source: std::io::Error },
    #[error("process {pid}: unreadable {what}")]
    Unreadable { pid: i32, what: &'static str },
    #[error("process {pid}: pidfd_open: {source}")]
    Pidfd { pid: i32, source: std::io::Error },
}

/// The verified caller.
#[derive(Debug)]
pub struct Caller {
    pub pid: i32,
    pub uid: u32,
    /// Real gid and supplementary groups of the peer (from /proc).
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The Slurm job id slurmctld confirmed.
    pub job: String,
    pub pidfd: OwnedFd,
    /// The CPUs of the batch step (its slurmstepd's affinity, from the
    /// allocation); empty when it cannot be read (no placement then).
    pub cpus: Vec<usize>,
    starttime: u64,
}

/// `(ppid, starttime)` of `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Result<(i32, u64), ProcError> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|source| ProcError::Read { pid, source })?;
    let rest = s
        .rfind(')')
        .map(|i| &s[i + 1..])
        .ok_or(ProcError::Unreadable { pid, what: "stat" })?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): ppid is field 4, starttime field 22.
    let ppid = f.get(1).and_then(|v| v.parse().ok());
    let start = f.get(19).and_then(|v| v.parse().ok());
    match (ppid, start) {
        (Some(p), Some(s)) => Ok((p, s)),
        _ => Err(ProcError::Unreadable { pid, what: "stat" }),
    }
}

/// Real gid and groups from `/proc/<pid>/status`.
fn proc_groups(pid: i32) -> Result<(u32, u32, Vec<u32>), ProcError> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|source| ProcError::Read { pid, source })?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().filter_map(|x| x.parse::<u32>().ok()).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let uids = field("Uid:");
    let gids = field("Gid:");
    match (uids.first(), gids.first()) {
        (Some(&u), Some(&g)) => Ok((u, g, field("Groups:"))),
        _ => Err(ProcError::Unreadable { pid, what: "status" }),
    }
}

fn pidfd_open(pid: i32) -> Result<OwnedFd, ProcError> {
    // SAFETY: pidfd_open(2) with flags 0 returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(ProcError::Pidfd {
            pid,
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The real paths `slurmstepd` may have (Debian: an alternatives link to
/// `slurmstepd-wlm`); only root-owned files count.
pub fn slurmstepd_paths() -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut v = Vec::new();
    for p in [
        "/usr/sbin/slurmstepd",
        "/usr/local/sbin/slurmstepd",
        "/usr/bin/slurmstepd",
    ] {
        if let Ok(real) = std::fs::canonicalize(p) {
            if std::fs::metadata(&real).map(|m| m.uid() == 0).unwrap_or(false) && !v.contains(&real) {
                v.push(real);
            }
        }
    }
    v
}

/// The Slurm job of a batch step's `slurmstepd` title.
pub fn job_of_title(cmdline: &[u8]) -> Option<String> {
    let first = cmdline.split(|b| *b == 0).next()?;
    let t = std::str::from_utf8(first).ok()?;
    let job = t.strip_prefix("slurmstepd: [")?.strip_suffix(".batch]")?;
    (!job.is_empty() && job.len() <= 20 && job.bytes().all(|b| b.is_ascii_digit())).then(|| job.to_string())
}

/// The squeue format the agent asks for: job id, state, numeric owner uid
/// and batch host, `|`-separated. Only fields the submitter cannot choose
/// (never the job name, comment or work dir, which could carry forged
/// `Key=value` text in `scontrol show job`'s one-line output).
pub const SQUEUE_FORMAT: &str = "%A|%T|%U|%B";

/// Checks squeue's answer (`SQUEUE_FORMAT`) about `job`.
///
/// `squeue -j <id>` also lists the other elements of a job array whose
/// array id is `<id>` (a map's array: the first element's job id is the
/// array's id, its siblings run on other nodes or wait): the one line whose
/// job id (`%A`, unique per element) is `job` is the answer, and there must
/// be exactly one.
pub fn check_squeue(out: &str, job: &str, uid: u32, node: &str) -> Result<(), JobRefusal> {
    let mut rows = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.trim().split('|').collect();
        let [id, state, owner, host] = f.as_slice() else {
            return Err(JobRefusal::Unknown { job: job.into() });
        };
        if *id == job {
            rows.push((*state, *owner, *host));
        }
    }
    let [(state, owner, host)] = rows.as_slice() else {
        return Err(JobRefusal::Unknown { job: job.into() });
    };
    if *state != "RUNNING" {
        return Err(JobRefusal::NotRunning { job: job.into() });
    }
    if owner.parse::<u32>().ok() != Some(uid) {
        return Err(JobRefusal::OtherUser { job: job.into(), uid });
    }
    if *host != node {
        return Err(JobRefusal::NotHere { job: job.into(), node: node.into() });
    }
    Ok(())
}

/// This node's Slurm name: `$DELEGATE_NODE_NAME` of the agent (set by
/// whoever starts it, as root), else the short host name.
pub fn node_name() -> String {
    if let Ok(n) = std::env::var("DELEGATE_NODE_NAME") {
        if !n.is_empty() {
            return n;
        }
    }
    let h = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    h.split('.').next().unwrap_or_default().to_string()
}

/// Which step's task the peer must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// The batch step (`[<job>.batch]`), its batch host this node.
    Batch,
    /// A numbered step (`[<job>.<n>]`) of a multi-node rank job: the task
    /// `sandbox-runner rank` (the SPANK plugin admits no other program in
    /// such a step), on one of the job's nodes.
    Rank,
}

/// Where the rank of a caller comes from: this node's index in the job's
/// node list as slurmctld expands it, and the list's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankPlace {
    pub rank: u32,
    pub world: u32,
}

/// The Slurm job of a numbered step's `slurmstepd` title (`[<job>.<n>]`),
/// never the batch or extern step.
pub fn job_of_step_title(cmdline: &[u8]) -> Option<String> {
    let first = cmdline.split(|b| *b == 0).next()?;
    let t = std::str::from_utf8(first).ok()?;
    let inner = t.strip_prefix("slurmstepd: [")?.strip_suffix(']')?;
    let (job, step) = inner.split_once('.')?;
    let digits = |s: &str, max: usize| !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit());
    (digits(job, 20) && digits(step, 10)).then(|| job.to_string())
}

/// The squeue format of a rank caller's check: job id, state, owner uid
/// and the job's node list (fields the submitter cannot choose).
pub const SQUEUE_RANK_FORMAT: &str = "%A|%T|%U|%N";

/// Checks squeue's answer (`SQUEUE_RANK_FORMAT`) about `job`; the node
/// list (compressed, e.g. `worker[1-2]`) on success.
pub fn check_squeue_rank(out: &str, job: &str, uid: u32) -> Result<String, JobRefusal> {
    let mut rows = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.trim().split('|').collect();
        let [id, state, owner, nodes] = f.as_slice() else {
            return Err(JobRefusal::Unknown { job: job.into() });
        };
        if *id == job {
            rows.push((*state, *owner, *nodes));
        }
    }
    let [(state, owner, nodes)] = rows.as_slice() else {
        return Err(JobRefusal::Unknown { job: job.into() });
    };
    if *state != "RUNNING" {
        return Err(JobRefusal::NotRunning { job: job.into() });
    }
    if owner.parse::<u32>().ok() != Some(uid) {
        return Err(JobRefusal::OtherUser { job: job.into(), uid });
    }
    if nodes.is_empty() || nodes.len() > 4096 {
        return Err(JobRefusal::NoNodeList { job: job.into() });
    }
    Ok(nodes.to_string())
}

/// This node's place in the expanded node list (`scontrol show hostnames`
/// output, one name per line, in slurmctld's order).
pub fn place_in(hostnames: &str, node: &str) -> Result<RankPlace, JobRefusal> {
    let names: Vec<&str> = hostnames.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if names.is_empty() || names.len() > delegate_protocol::MAX_RANKS as usize {
        return Err(JobRefusal::BadNodeList);
    }
    if names.len() < 2 {
        return Err(JobRefusal::OneNode);
    }
    let rank = names
        .iter()
        .position(|n| *n == node)
        .ok_or_else(|| JobRefusal::NotOneOfNodes { node: node.into() })?;
    Ok(RankPlace {
        rank: rank as u32,
        world: names.len() as u32,
    })
}

async fn slurm_command(args: &[&str], what: &str) -> Result<String, IdentError> {
    let question = BoundedRun {
        argv: args,
        deadline: Duration::from_secs(15),
        max_answer: MAX_SLURM_ANSWER,
        env: &[],
        clear_env: false,
    };
    question.ask().await.map_err(|e| match e {
        AskError::Timeout { .. } => IdentError::SlurmTimeout { what: what.into() },
        e => IdentError::Slurm { what: what.into(), why: e.to_string() },
    })
}

/// Identifies the peer `pid` (uid from `SO_PEERCRED`) as a batch task.
pub async fn identify(pid: i32, uid: u32, stepds: &[PathBuf], node: &str) -> Result<Caller, IdentError> {
    identify_as(pid, uid, stepds, node, StepKind::Batch).await.map(|(c, _)| c)
}

/// Identifies the peer `pid` as the task of a step of the given kind; for
/// a rank, also its place from slurmctld's node list.
pub async fn identify_as(
    pid: i32,
    uid: u32,
    stepds: &[PathBuf],
    node: &str,
    kind: StepKind,
) -> Result<(Caller, Option<RankPlace>), IdentError> {
    use std::os::unix::fs::MetadataExt;
    let what = match kind {
        StepKind::Batch => "a Slurm batch task",
        StepKind::Rank => "a Slurm rank task",
    };
    let not_task = |why: String| IdentError::NotTask { pid, what, why };
    if pid <= 0 {
        return Err(not_task("no peer process".into()));
    }
    let pidfd = pidfd_open(pid).map_err(|e| not_task(e.to_string()))?;
    let (ppid, starttime) = proc_stat(pid).map_err(|e| not_task(e.to_string()))?;
    let (puid, gid, groups) = proc_groups(pid).map_err(|e| not_task(e.to_string()))?;
    if puid != uid {
        return Err(not_task("its uid changed".into()));
    }
    let parent = Path::new("/proc").join(ppid.to_string());
    let owner = std::fs::metadata(&parent)
        .map(|m| m.uid())
        .map_err(|e| not_task(format!("parent {ppid}: {e}")))?;
    let exe = std::fs::read_link(parent.join("exe")).ok();
    if owner != 0 || exe.as_ref().is_none_or(|e| !stepds.contains(e)) {
        return Err(not_task(format!("its parent {ppid} is not slurmstepd")));
    }
    let cmdline = std::fs::read(parent.join("cmdline")).map_err(|e| not_task(format!("parent {ppid}: {e}")))?;
    let (job, place) = match kind {
        StepKind::Batch => {
            let job =
                job_of_title(&cmdline).ok_or_else(|| not_task(format!("its parent {ppid} is not a batch step")))?;
            let out = slurm_command(
                &["squeue", "-h", "-t", "all", "-j", &job, "-o", SQUEUE_FORMAT],
                &format!("job {job}"),
            )
            .await?;
            check_squeue(&out, &job, uid, node)?;
            (job, None)
        }
        StepKind::Rank => {
            let job = job_of_step_title(&cmdline)
                .ok_or_else(|| not_task(format!("its parent {ppid} is not a numbered job step")))?;
            let out = slurm_command(
                &["squeue", "-h", "-t", "all", "-j", &job, "-o", SQUEUE_RANK_FORMAT],
                &format!("job {job}"),
            )
            .await?;
            let nodes = check_squeue_rank(&out, &job, uid)?;
            let names = slurm_command(&["scontrol", "show", "hostnames", &nodes], &format!("job {job}")).await?;
            (job, Some(place_in(&names, node)?))
        }
    };
    // Still the same process, still the child of that slurmstepd.
    match proc_stat(pid) {
        Ok((p, s)) if p == ppid && s == starttime => {}
        _ => return Err(not_task("it changed during the checks".into())),
    }
    // The batch step's CPUs: its slurmstepd's affinity (root's, which the
    // task cannot change; the runner moves itself off the sandbox's cores).
    let cpus = crate::measure::pin::allowed(ppid).unwrap_or_else(|e| {
        tracing::warn!("{e}; the sandbox gets a CPU quota, not cores of its own");
        Vec::new()
    });
    Ok((
        Caller {
            pid,
            uid,
            gid,
            groups,
            job,
            pidfd,
            cpus,
            starttime,
        },
        place,
    ))
}

impl Caller {
    /// True while the verified peer process still runs.
    pub fn alive(&self) -> bool {
        matches!(proc_stat(self.pid), Ok((_, s)) if s == self.starttime)
    }

    /// How long the batch task has run: its allocation's age (delegate's
    /// batch scripts exec the runner at once); None when unknown.
    pub fn age(&self) -> Option<Duration> {
        let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
        let up: f64 = uptime.split_whitespace().next()?.parse().ok()?;
        let started = self.starttime as f64 / crate::measure::fingerprint::clock_ticks() as f64;
        Some(Duration::from_secs_f64((up - started).max(0.0)))
    }
}

#[cfg(test)]
impl Caller {
    /// A caller for unit tests: this process (its pidfd never becomes
    /// readable while the test runs), as root.
    pub fn this_process() -> Caller {
        let pid = std::process::id() as i32;
        Caller {
            pid,
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            job: "1".into(),
            pidfd: pidfd_open(pid).expect("pidfd_open of this process"),
            cpus: Vec::new(),
            starttime: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles() {
        assert_eq!(job_of_title(b"slurmstepd: [42.batch]\0"), Some("42".into()));
        assert_eq!(job_of_title(b"slurmstepd: [42.batch]"), Some("42".into()));
        assert_eq!(job_of_title(b"slurmstepd: [42.0]\0"), None);
        assert_eq!(job_of_title(b"slurmstepd: [42.extern]\0"), None);
        assert_eq!(job_of_title(b"slurmstepd: [4 2.batch]\0"), None);
        assert_eq!(job_of_title(b"python3\0slurmstepd: [42.batch]\0"), None);
    }

    #[test]
    fn step_titles() {
        assert_eq!(job_of_step_title(b"slurmstepd: [42.0]\0"), Some("42".into()));
        assert_eq!(job_of_step_title(b"slurmstepd: [42.17]"), Some("42".into()));
        assert_eq!(job_of_step_title(b"slurmstepd: [42.batch]\0"), None);
        assert_eq!(job_of_step_title(b"slurmstepd: [42.extern]\0"), None);
        assert_eq!(job_of_step_title(b"slurmstepd: [42.0.1]\0"), None);
        assert_eq!(job_of_step_title(b"slurmstepd: [42.]\0"), None);
        assert_eq!(job_of_step_title(b"python3\0slurmstepd: [42.0]\0"), None);
    }

    #[test]
    fn rank_squeue_and_place() {
        let line = "42|RUNNING|2001|w[1-2]\n";
        let job = || "42".to_string();
        assert_eq!(check_squeue_rank(line, "42", 2001), Ok("w[1-2]".into()));
        let other = check_squeue_rank(line, "42", 2002);
        assert_eq!(other, Err(JobRefusal::OtherUser { job: job(), uid: 2002 }));
        assert_eq!(other.unwrap_err().to_string(), "Slurm job 42 does not belong to uid 2002");
        assert_eq!(
            check_squeue_rank(&line.replace("RUNNING", "PENDING"), "42", 2001),
            Err(JobRefusal::NotRunning { job: job() })
        );
        let no_list = check_squeue_rank("42|RUNNING|2001|\n", "42", 2001);
        assert_eq!(no_list, Err(JobRefusal::NoNodeList { job: job() }));
        assert_eq!(no_list.unwrap_err().to_string(), "Slurm job 42 has no usable node list");
        assert_eq!(
            check_squeue_rank("42|RUNNING|2001|a|b\n", "42", 2001),
            Err(JobRefusal::Unknown { job: job() })
        );
        assert_eq!(place_in("w1\nw2\n", "w2"), Ok(RankPlace { rank: 1, world: 2 }));
        assert_eq!(place_in("w1\nw2\n", "w1"), Ok(RankPlace { rank: 0, world: 2 }));
        assert_eq!(place_in("w1\n", "w1"), Err(JobRefusal::OneNode));
        assert!(JobRefusal::OneNode.to_string().contains("only for multi-node"));
        let elsewhere = place_in("w1\nw2\n", "w3");
        assert_eq!(elsewhere, Err(JobRefusal::NotOneOfNodes { node: "w3".into() }));
        assert_eq!(
            elsewhere.unwrap_err().to_string(),
            "this node (w3) is not one of the job's nodes"
        );
        assert_eq!(place_in("", "w1"), Err(JobRefusal::BadNodeList));
        assert_eq!(JobRefusal::BadNodeList.to_string(), "the job's node list is empty or too long");
    }

    #[test]
    fn squeue_fields() {
        let line = "42|RUNNING|2001|n1\n";
        let here = |job: &str, node: &str| Err(JobRefusal::NotHere { job: job.into(), node: node.into() });
        assert_eq!(check_squeue(line, "42", 2001, "n1"), Ok(()));
        assert_eq!(
            check_squeue(line, "42", 2002, "n1"),
            Err(JobRefusal::OtherUser { job: "42".into(), uid: 2002 })
        );
        let not_here = check_squeue(line, "42", 2001, "n2");
        assert_eq!(not_here, here("42", "n2"));
        assert!(not_here.unwrap_err().to_string().contains("batch step"));
        let unknown = |job: &str| Err(JobRefusal::Unknown { job: job.into() });
        assert_eq!(
            check_squeue(&line.replace("RUNNING", "COMPLETING"), "42", 2001, "n1"),
            Err(JobRefusal::NotRunning { job: "42".into() })
        );
        assert_eq!(check_squeue("", "42", 2001, "n1"), unknown("42"));
        assert_eq!(check_squeue(line, "43", 2001, "n1"), unknown("43"));
        // More than one line for the job, or extra fields: never a guess.
        assert_eq!(
            check_squeue("42|RUNNING|2001|n1\n42|RUNNING|2001|n1\n", "42", 2001, "n1"),
            unknown("42")
        );
        // An array's other elements (listed by `squeue -j <array id>`) are
        // skipped: the line of the caller's own job id decides.
        let array = "43|RUNNING|2001|n2\n42|RUNNING|2001|n1\n44|PENDING|2001|\n";
        assert_eq!(check_squeue(array, "42", 2001, "n1"), Ok(()));
        assert_eq!(check_squeue(array, "43", 2001, "n1"), here("43", "n1"));
        assert_eq!(check_squeue("43|RUNNING|2001|n1\n", "42", 2001, "n1"), unknown("42"));
        assert_eq!(check_squeue("42|RUNNING|2001|n1|x\n", "42", 2001, "n1"), unknown("42"));
    }

    #[test]
    fn not_a_batch_task() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let me = std::process::id() as i32;
        let uid = nix::unistd::getuid().as_raw();
        let e = rt.block_on(identify(me, uid, &slurmstepd_paths(), "n1")).unwrap_err();
        assert!(
            matches!(&e, IdentError::NotTask { pid, what: "a Slurm batch task", .. } if *pid == me),
            "{e:?}"
        );
        assert!(e.to_string().contains("is not a Slurm batch task"), "{e}");
    }
}

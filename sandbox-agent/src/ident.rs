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
fn proc_stat(pid: i32) -> Result<(i32, u64), String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| format!("process {pid}: {e}"))?;
    let rest = s
        .rfind(')')
        .map(|i| &s[i + 1..])
        .ok_or_else(|| format!("process {pid}: unreadable stat"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): ppid is field 4, starttime field 22.
    let ppid = f.get(1).and_then(|v| v.parse().ok());
    let start = f.get(19).and_then(|v| v.parse().ok());
    match (ppid, start) {
        (Some(p), Some(s)) => Ok((p, s)),
        _ => Err(format!("process {pid}: unreadable stat")),
    }
}

/// Real gid and groups from `/proc/<pid>/status`.
fn proc_groups(pid: i32) -> Result<(u32, u32, Vec<u32>), String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| format!("process {pid}: {e}"))?;
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
        _ => Err(format!("process {pid}: unreadable status")),
    }
}

fn pidfd_open(pid: i32) -> Result<OwnedFd, String> {
    // SAFETY: pidfd_open(2) with flags 0 returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(format!("process {pid}: pidfd_open: {}", std::io::Error::last_os_error()));
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
pub fn check_squeue(out: &str, job: &str, uid: u32, node: &str) -> Result<(), String> {
    let mut rows = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.trim().split('|').collect();
        let [id, state, owner, host] = f.as_slice() else {
            return Err(format!("slurmctld does not know job {job}"));
        };
        if *id == job {
            rows.push((*state, *owner, *host));
        }
    }
    let [(state, owner, host)] = rows.as_slice() else {
        return Err(format!("slurmctld does not know job {job}"));
    };
    if *state != "RUNNING" {
        return Err(format!("Slurm job {job} is not running"));
    }
    if owner.parse::<u32>().ok() != Some(uid) {
        return Err(format!("Slurm job {job} does not belong to uid {uid}"));
    }
    if *host != node {
        return Err(format!("Slurm job {job} does not run its batch step on this node ({node})"));
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

/// Identifies the peer `pid` (uid from `SO_PEERCRED`).
pub async fn identify(pid: i32, uid: u32, stepds: &[PathBuf], node: &str) -> Result<Caller, String> {
    use std::os::unix::fs::MetadataExt;
    let not_task = |why: String| format!("the caller (pid {pid}) is not a Slurm batch task on this node ({why})");
    if pid <= 0 {
        return Err(not_task("no peer process".into()));
    }
    let pidfd = pidfd_open(pid).map_err(not_task)?;
    let (ppid, starttime) = proc_stat(pid).map_err(not_task)?;
    let (puid, gid, groups) = proc_groups(pid).map_err(not_task)?;
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
    let job = job_of_title(&cmdline).ok_or_else(|| not_task(format!("its parent {ppid} is not a batch step")))?;
    let out = tokio::time::timeout(
        Duration::from_secs(15),
        tokio::process::Command::new("squeue")
            .args(["-h", "-t", "all", "-j", &job, "-o", SQUEUE_FORMAT])
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("slurmctld did not answer about job {job} in time"))?
    .map_err(|e| format!("cannot run squeue: {e}"))?;
    check_squeue(&String::from_utf8_lossy(&out.stdout), &job, uid, node)?;
    // Still the same process, still the child of that slurmstepd.
    match proc_stat(pid) {
        Ok((p, s)) if p == ppid && s == starttime => {}
        _ => return Err(not_task("it changed during the checks".into())),
    }
    // The batch step's CPUs: its slurmstepd's affinity (root's, which the
    // task cannot change; the runner moves itself off the sandbox's cores).
    let cpus = crate::pin::allowed(ppid).unwrap_or_else(|e| {
        tracing::warn!("{e}; the sandbox gets a CPU quota, not cores of its own");
        Vec::new()
    });
    Ok(Caller {
        pid,
        uid,
        gid,
        groups,
        job,
        pidfd,
        cpus,
        starttime,
    })
}

impl Caller {
    /// True while the verified peer process still runs.
    pub fn alive(&self) -> bool {
        matches!(proc_stat(self.pid), Ok((_, s)) if s == self.starttime)
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
    fn squeue_fields() {
        let line = "42|RUNNING|2001|n1\n";
        assert_eq!(check_squeue(line, "42", 2001, "n1"), Ok(()));
        assert!(check_squeue(line, "42", 2002, "n1").unwrap_err().contains("does not belong"));
        assert!(check_squeue(line, "42", 2001, "n2").unwrap_err().contains("batch step"));
        assert!(check_squeue(&line.replace("RUNNING", "COMPLETING"), "42", 2001, "n1").is_err());
        assert!(check_squeue("", "42", 2001, "n1").is_err());
        assert!(check_squeue(line, "43", 2001, "n1").is_err());
        // More than one line for the job, or extra fields: never a guess.
        assert!(check_squeue("42|RUNNING|2001|n1\n42|RUNNING|2001|n1\n", "42", 2001, "n1").is_err());
        // An array's other elements (listed by `squeue -j <array id>`) are
        // skipped: the line of the caller's own job id decides.
        let array = "43|RUNNING|2001|n2\n42|RUNNING|2001|n1\n44|PENDING|2001|\n";
        assert_eq!(check_squeue(array, "42", 2001, "n1"), Ok(()));
        assert!(check_squeue(array, "43", 2001, "n1").unwrap_err().contains("batch step"));
        assert!(check_squeue("43|RUNNING|2001|n1\n", "42", 2001, "n1").is_err());
        assert!(check_squeue("42|RUNNING|2001|n1|x\n", "42", 2001, "n1").is_err());
    }

    #[test]
    fn not_a_batch_task() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let me = std::process::id() as i32;
        let uid = nix::unistd::getuid().as_raw();
        let e = rt.block_on(identify(me, uid, &slurmstepd_paths(), "n1")).unwrap_err();
        assert!(e.contains("is not a Slurm batch task"), "{e}");
    }
}

//! Checks of the (untrusted) job directory before anything runs.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use delegate_protocol::policy::Policy;
use delegate_protocol::shipped::{parse_shipped_manifest, MAX_SHIPPED, SHIPPED};
use delegate_protocol::{
    check_clean_absolute, check_owner, list_entries, open_dir_nofollow, read_bounded_at, read_record_at, JobId,
    ProtocolError, Spec, BEFORE_START, CANCEL, CLIENT_FILES, MAX_PAYLOAD_BYTES, OUTCOME, PAYLOAD, STARTED,
};
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, SFlag};

/// At most this many entries are listed: the client's five files and the
/// shipped entries.
const MAX_ENTRIES: usize = 64 + MAX_SHIPPED;

/// Why a job directory was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The directory itself failed the checks: nothing may be written into it.
    Dir(String),
    /// The directory is the caller's, but the job is refused. `write_outcome`
    /// is false when an outcome already exists (it is never overwritten).
    Job { reason: String, write_outcome: bool },
}

impl Refusal {
    pub fn reason(&self) -> &str {
        match self {
            Refusal::Dir(r) => r,
            Refusal::Job { reason, .. } => reason,
        }
    }
    fn job(reason: impl Into<String>) -> Self {
        Refusal::Job {
            reason: reason.into(),
            write_outcome: true,
        }
    }
}

/// A job directory that passed the directory-level checks.
#[derive(Debug)]
pub struct JobDir {
    pub fd: OwnedFd,
    pub path: PathBuf,
    /// The directory's name (not yet checked to be a job id).
    pub name: String,
}

/// A job that passed every check and may run.
#[derive(Debug)]
pub struct Checked {
    pub spec: Spec,
    pub job_id: JobId,
    /// The user asked to cancel before it started.
    pub cancel_requested: bool,
}

/// Directory-level checks: clean absolute path, no symlink anywhere, a
/// directory owned by `uid` and not writable by group or others.
pub fn open_job_dir(path: &Path, uid: u32) -> Result<JobDir, Refusal> {
    let dir_err = |e: ProtocolError| Refusal::Dir(e.to_string());
    check_clean_absolute(path).map_err(dir_err)?;
    let fd = open_dir_nofollow(path).map_err(dir_err)?;
    let shown = path.display().to_string();
    check_owner(&fd, &shown, uid, true).map_err(dir_err)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Refusal::Dir(format!("{shown} has no final component")))?;
    Ok(JobDir { fd, path: path.to_path_buf(), name })
}

/// Shown names of unexpected files are bounded and escaped.
fn shown_name(name: &str) -> String {
    let short: String = name.chars().take(64).collect();
    format!("{short:?}")
}

/// Job-level checks: the entries, the spec, and the site policy.
pub fn check_job(dir: &JobDir, uid: u32, policy: &Policy) -> Result<Checked, Refusal> {
    check_job_as(dir, uid, policy, false)
}

/// [`check_job`]; for a rank of a multi-node job (`rank`), the entries are
/// not checked beyond the outcome: the ranks start together on one
/// directory, each creating its own files (`sandbox-runner ranks` checked
/// the entries before it started them), and the spec and policy checks
/// are the same.
pub fn check_job_as(dir: &JobDir, uid: u32, policy: &Policy, rank: bool) -> Result<Checked, Refusal> {
    let job_id = JobId::parse(&dir.name).map_err(|e| Refusal::job(e.to_string()))?;
    let mut entries = list_entries(&dir.fd, &dir.path, MAX_ENTRIES).map_err(|e| Refusal::job(e.to_string()))?;
    if entries.iter().any(|n| n == OUTCOME) {
        return Err(Refusal::Job {
            reason: "the job already ran (an outcome exists)".into(),
            write_outcome: false,
        });
    }
    if rank {
        entries.retain(|n| CLIENT_FILES.contains(&n.as_str()));
    }
    if entries.iter().any(|n| n == STARTED) {
        return Err(Refusal::job("the job already ran (it was started before)"));
    }
    let shipped = shipped_entries(dir, uid, &entries)?;
    // A cancelled job is never started: an entry the client is writing at
    // this moment (its outcome's temporary file) does not make it refused.
    let cancelled = entries.iter().any(|n| n == CANCEL);
    if let Some(bad) = entries
        .iter()
        .find(|n| !cancelled && !BEFORE_START.contains(&n.as_str()) && !shipped.contains(n))
    {
        return Err(Refusal::job(format!(
            "unexpected file {} in the job directory (only {} may exist before the job starts)",
            shown_name(bad),
            BEFORE_START.join(", ")
        )));
    }
    // Every client file present must be a regular file of the caller.
    for name in entries
        .iter()
        .filter(|n| !shipped.contains(n) && BEFORE_START.contains(&n.as_str()))
    {
        let shown = dir.path.join(name).display().to_string();
        let st = fstatat(dir.fd.as_fd(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| Refusal::job(format!("{shown}: {e}")))?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind != SFlag::S_IFREG {
            return Err(Refusal::job(format!("{shown} is not a regular file")));
        }
        if st.st_uid != uid {
            return Err(Refusal::job(format!(
                "{shown} is owned by uid {}, expected uid {uid}",
                st.st_uid
            )));
        }
        if name == PAYLOAD && st.st_size as u64 > MAX_PAYLOAD_BYTES {
            return Err(Refusal::job(format!(
                "{shown} is {} bytes, more than the limit of {MAX_PAYLOAD_BYTES}",
                st.st_size
            )));
        }
    }
    let spec: Spec = read_record_at(&dir.fd, &dir.path, Some(uid)).map_err(|e| Refusal::job(e.to_string()))?;
    spec.validate().map_err(|e| Refusal::job(e.to_string()))?;
    if spec.job_id != job_id {
        return Err(Refusal::job(format!(
            "the spec is for job {}, but the directory is {}",
            spec.job_id, job_id
        )));
    }
    policy.check(&spec, uid, &dir.path).map_err(|e| Refusal::job(e.to_string()))?;
    Ok(Checked {
        spec,
        job_id,
        cancel_requested: entries.iter().any(|n| n == CANCEL),
    })
}

/// The entries the client shipped with the job (its `shipped` manifest,
/// none without one): each listed name must exist as a regular file or a
/// directory of the caller (not a symlink: the agent mounts the directory
/// itself, and nothing in it may point the sandbox elsewhere by name).
fn shipped_entries(dir: &JobDir, uid: u32, entries: &[String]) -> Result<Vec<String>, Refusal> {
    if !entries.iter().any(|n| n == SHIPPED) {
        return Ok(Vec::new());
    }
    let raw =
        read_bounded_at(&dir.fd, &dir.path, SHIPPED, 64 * 1024, Some(uid)).map_err(|e| Refusal::job(e.to_string()))?;
    let text = std::str::from_utf8(&raw).map_err(|_| Refusal::job("the shipped manifest is not text"))?;
    let names = parse_shipped_manifest(text).map_err(|e| Refusal::job(format!("the shipped manifest: {e}")))?;
    for name in &names {
        let shown = dir.path.join(name).display().to_string();
        let st = fstatat(dir.fd.as_fd(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| Refusal::job(format!("{shown} (a shipped file): {e}")))?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind != SFlag::S_IFREG && kind != SFlag::S_IFDIR {
            return Err(Refusal::job(format!(
                "{shown} (a shipped file) is neither a file nor a directory"
            )));
        }
        if st.st_uid != uid {
            return Err(Refusal::job(format!(
                "{shown} is owned by uid {}, expected uid {uid}",
                st.st_uid
            )));
        }
    }
    Ok(names)
}

/// The gid the sandbox runs as: the spec's when it is one of the caller's
/// groups (real gid or supplementary), else the real gid. Never the
/// effective gid (docker) unless the caller really is in that group.
pub fn sandbox_gid(spec_gid: u32, real_gid: u32, groups: &[u32]) -> u32 {
    if spec_gid == real_gid || groups.contains(&spec_gid) {
        spec_gid
    } else {
        real_gid
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delegate_protocol::{now_ms, write_record_at, Resources, Task};
    use std::os::unix::fs::PermissionsExt;

    fn policy(root: &Path) -> Policy {
        Policy::parse(
            &format!(
                "job_roots = [{:?}]\nmax_cpus = 2\nmax_mem = \"2G\"\nallow_root = true\n",
                root.display().to_string()
            ),
            "test",
        )
        .unwrap()
    }

    fn setup() -> (tempfile::TempDir, PathBuf, Spec, u32) {
        let root = tempfile::tempdir().unwrap();
        let uid = nix::unistd::getuid().as_raw();
        let id = JobId::new();
        let dir = root.path().join(id.as_str());
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let spec = Spec {
            job_id: id,
            uid,
            gid: nix::unistd::getgid().as_raw(),
            created_ms: now_ms(),
            image: "delegate-sandbox:latest".into(),
            task: Task::Command { argv: vec!["true".into()] },
            resources: Resources::default(),
            env: vec![],
        };
        let fd = open_dir_nofollow(&dir).unwrap();
        write_record_at(&fd, &dir, &spec).unwrap();
        (root, dir, spec, uid)
    }

    #[test]
    fn good_job_passes() {
        let (root, dir, spec, uid) = setup();
        let p = policy(root.path());
        let jd = open_job_dir(&dir, uid).unwrap();
        let c = check_job(&jd, uid, &p).unwrap();
        assert_eq!(c.spec, spec);
        assert!(!c.cancel_requested);
        std::fs::write(dir.join("cancel"), b"").unwrap();
        assert!(check_job(&jd, uid, &p).unwrap().cancel_requested);
    }

    #[test]
    fn shipped_entries_are_accepted_exactly() {
        let (root, dir, _spec, uid) = setup();
        let p = policy(root.path());
        let jd = open_job_dir(&dir, uid).unwrap();
        std::fs::write(dir.join("train.py"), b"print(1)").unwrap();
        std::fs::create_dir(dir.join("data")).unwrap();
        std::fs::write(dir.join("shipped"), b"train.py\ndata\n").unwrap();
        check_job(&jd, uid, &p).unwrap();
        // Not listed: refused.
        std::fs::write(dir.join("extra.py"), b"").unwrap();
        assert!(check_job(&jd, uid, &p)
            .unwrap_err()
            .reason()
            .contains("unexpected file \"extra.py\""));
        std::fs::remove_file(dir.join("extra.py")).unwrap();
        // Listed but missing, or a symlink: refused.
        std::fs::write(dir.join("shipped"), b"train.py\ndata\nmissing\n").unwrap();
        assert!(check_job(&jd, uid, &p).unwrap_err().reason().contains("missing"));
        std::os::unix::fs::symlink("/etc", dir.join("missing")).unwrap();
        assert!(check_job(&jd, uid, &p)
            .unwrap_err()
            .reason()
            .contains("neither a file nor a directory"));
        // A manifest naming delegate's own files is refused.
        std::fs::write(dir.join("shipped"), b"outcome\n").unwrap();
        assert!(check_job(&jd, uid, &p).unwrap_err().reason().contains("delegate's own files"));
    }

    #[test]
    fn a_cancelled_job_with_a_client_write_in_flight_is_cancelled_not_refused() {
        let (root, dir, _spec, uid) = setup();
        let p = policy(root.path());
        let jd = open_job_dir(&dir, uid).unwrap();
        std::fs::write(dir.join("..outcome.client-1-2.tmp-1-3"), b"").unwrap();
        assert!(check_job(&jd, uid, &p).unwrap_err().reason().contains("unexpected file"));
        std::fs::write(dir.join("cancel"), b"").unwrap();
        assert!(check_job(&jd, uid, &p).unwrap().cancel_requested);
    }

    #[test]
    fn dir_level_refusals() {
        let (_root, dir, _spec, uid) = setup();
        assert!(matches!(open_job_dir(Path::new("relative/x"), uid), Err(Refusal::Dir(_))));
        assert!(matches!(open_job_dir(&dir.join(".."), uid), Err(Refusal::Dir(_))));
        assert!(matches!(open_job_dir(&dir, uid + 1), Err(Refusal::Dir(_))));
        let link = dir.with_file_name("20990101T000000-00000000");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = open_job_dir(&link, uid).unwrap_err();
        assert!(e.reason().contains("symbolic link"), "{e:?}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(open_job_dir(&dir, uid), Err(Refusal::Dir(_))));
    }

    #[test]
    fn job_level_refusals() {
        let (root, dir, _spec, uid) = setup();
        let p = policy(root.path());
        let jd = open_job_dir(&dir, uid).unwrap();
        std::fs::write(dir.join("evil"), b"").unwrap();
        let e = check_job(&jd, uid, &p).unwrap_err();
        assert!(e.reason().contains("unexpected file \"evil\""), "{e:?}");
        std::fs::remove_file(dir.join("evil")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("payload")).unwrap();
        assert!(check_job(&jd, uid, &p).unwrap_err().reason().contains("not a regular file"));
        std::fs::remove_file(dir.join("payload")).unwrap();
        std::fs::write(dir.join("started"), b"").unwrap();
        assert!(matches!(check_job(&jd, uid, &p), Err(Refusal::Job { write_outcome: true, .. })));
        std::fs::write(dir.join("outcome"), b"").unwrap();
        assert!(matches!(
            check_job(&jd, uid, &p),
            Err(Refusal::Job { write_outcome: false, .. })
        ));
    }

    #[test]
    fn spec_and_policy_refusals() {
        let (root, dir, mut spec, uid) = setup();
        let jd = open_job_dir(&dir, uid).unwrap();
        // Outside the job roots.
        let p = policy(Path::new("/nonexistent"));
        assert!(check_job(&jd, uid, &p)
            .unwrap_err()
            .reason()
            .contains("not below an allowed job root"));
        let p = policy(root.path());
        spec.image = "evil:latest".into();
        write_record_at(&jd.fd, &dir, &spec).unwrap();
        assert!(check_job(&jd, uid, &p).unwrap_err().reason().contains("not allowed"));
        spec.image = "delegate-sandbox:latest".into();
        spec.job_id = JobId::parse("20000101T000000-00000000").unwrap();
        write_record_at(&jd.fd, &dir, &spec).unwrap();
        assert!(check_job(&jd, uid, &p).unwrap_err().reason().contains("the spec is for job"));
        std::fs::write(dir.join("spec"), b"garbage").unwrap();
        assert!(check_job(&jd, uid, &p).unwrap_err().reason().contains("not a delegate file"));
    }

    #[test]
    fn gid_choice() {
        assert_eq!(sandbox_gid(5, 5, &[]), 5);
        assert_eq!(sandbox_gid(7, 5, &[7, 9]), 7);
        assert_eq!(sandbox_gid(106, 5, &[7]), 5);
    }
}

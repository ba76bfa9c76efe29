//! A new attempt of a call whose earlier attempt ended without an outcome
//! because of its node ([`delegate_protocol::attempt`]): Slurm queued the
//! call's job again (its node failed or was set down), or a map's
//! allocation starts again and finds a call it had claimed before it was
//! lost. The new attempt starts from a fresh directory; once the call's
//! retries are spent it ends `lost`, naming every attempt.

use std::path::Path;

use delegate_protocol::attempt::{read_attempts, start_afresh, Attempt, MAX_RETRIES};
use delegate_protocol::claim::{Claim, MAX_CLAIM_BYTES};
use delegate_protocol::{
    check_owner, exists_at, now_ms, open_dir_nofollow, read_bounded_at, read_record_at, Spec, Started, CLAIM, OUTCOME,
    STARTED, STDERR, STDOUT,
};

/// How a run begins.
#[derive(Debug, PartialEq, Eq)]
pub enum Begin {
    /// No earlier attempt was lost: the directory is checked as it is.
    AsItIs,
    /// A new attempt was started from a fresh directory (its number).
    Again(u32),
    /// The call's retries are spent: it ends lost, for this reason.
    Spent(String),
}

/// Why a lost attempt ended, as recorded.
pub const LOST_WHY: &str = "its node was lost before the attempt ended (Slurm queued the call again)";

/// Begins a run of the job directory `path` (the caller's, `uid`):
/// when Slurm started the job again (`requeued`: its restart count is
/// above 0) and an earlier attempt left traces of a run and no outcome,
/// or (`reclaim`) a map's allocation starting again finds a call it had
/// claimed before, a new attempt starts afresh, its claim `reclaim`.
/// Anything else leaves the directory as it is for the checks (a first
/// run that finds a start record or output refuses them, as ever).
pub fn begin(path: &Path, uid: u32, requeued: bool, reclaim: Option<&Claim>) -> Begin {
    let Ok(dir) = open_dir_nofollow(path) else {
        return Begin::AsItIs;
    };
    let shown = path.display().to_string();
    if check_owner(&dir, &shown, uid, true).is_err() || exists_at(&dir, OUTCOME) {
        return Begin::AsItIs;
    }
    let ran = [STARTED, STDOUT, STDERR].iter().any(|n| exists_at(&dir, n));
    if reclaim.is_none() && !(ran && requeued) {
        return Begin::AsItIs;
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Begin::AsItIs;
    };
    let Ok(parent_fd) = open_dir_nofollow(parent) else {
        return Begin::AsItIs;
    };
    let started: Option<Started> = read_record_at(&dir, path, Some(uid)).ok();
    let old_claim = read_bounded_at(&dir, path, CLAIM, MAX_CLAIM_BYTES, Some(uid))
        .ok()
        .and_then(|b| Claim::parse(&String::from_utf8_lossy(&b)));
    let mut all = read_attempts(&dir, path, Some(uid));
    let lost = Attempt {
        n: all.last().map_or(1, |a| a.n.saturating_add(1)),
        node: started
            .as_ref()
            .map(|s| s.host.clone())
            .or(old_claim.map(|c| c.node))
            .unwrap_or_else(|| "-".into()),
        started_ms: started.as_ref().map_or(0, |s| s.started_ms),
        ended_ms: now_ms(),
        why: LOST_WHY.into(),
    };
    all.push(lost);
    let retries = read_record_at::<Spec>(&dir, path, Some(uid)).map_or(0, |s| s.resources.retries.min(MAX_RETRIES));
    let claim_text = reclaim.map(Claim::to_text);
    let extra: Vec<(&str, &[u8])> = claim_text.iter().map(|t| (CLAIM, t.as_bytes())).collect();
    if let Err(e) = start_afresh(&parent_fd, parent, name, &dir, &all, &extra) {
        tracing::error!("cannot start a new attempt of {shown}: {e}");
        return Begin::AsItIs;
    }
    let n = all.len() as u32;
    tracing::warn!(
        "{shown}: attempt {} was lost on {}; attempt {} begins",
        n,
        all[all.len() - 1].node,
        n + 1
    );
    if n > retries {
        return Begin::Spent(spent_reason(&all, retries));
    }
    Begin::Again(n + 1)
}

/// The reason of a call whose retries are spent.
pub fn spent_reason(all: &[Attempt], retries: u32) -> String {
    let each: Vec<String> = all
        .iter()
        .map(|a| match a.node.as_str() {
            "-" => format!("attempt {} before it started", a.n),
            node => format!("attempt {} on {node}", a.n),
        })
        .collect();
    let times = if retries == 1 { "time" } else { "times" };
    format!(
        "its node was lost on every attempt ({}); it ran again {retries} {times}, its retries",
        each.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use delegate_protocol::{encode, Outcome, Resources, State, Task, Writer};
    use std::fs;

    fn job(retries: u32) -> (tempfile::TempDir, std::path::PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("20261128T180000-abcdef01");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let spec = Spec {
            job_id: delegate_protocol::JobId::new(),
            uid: me(),
            gid: me(),
            created_ms: 1,
            image: "delegate-sandbox:latest".into(),
            resources: Resources { retries, ..Resources::default() },
            task: Task::Command { argv: vec!["true".into()] },
            env: Vec::new(),
        };
        fs::write(dir.join("spec"), encode(&spec).unwrap()).unwrap();
        (root, dir)
    }

    fn ran_on(dir: &Path, host: &str) {
        let s = Started {
            host: host.into(),
            started_ms: 5,
            container_id: "c".into(),
            perf_mode: "off".into(),
        };
        fs::write(dir.join("started"), encode(&s).unwrap()).unwrap();
        fs::write(dir.join("stdout"), "half of it").unwrap();
    }

    fn me() -> u32 {
        nix::unistd::getuid().as_raw()
    }

    #[test]
    fn a_fresh_call_is_left_as_it_is() {
        let (_r, dir) = job(2);
        assert_eq!(begin(&dir, me(), true, None), Begin::AsItIs);
        assert!(dir.join("spec").exists());
    }

    /// A first run (Slurm never queued the job again) that finds a start
    /// record or output of nobody's attempt leaves them to the checks,
    /// which refuse the directory: a forged record never passes for a
    /// lost attempt.
    #[test]
    fn a_first_run_never_takes_forged_records_for_a_lost_attempt() {
        let (root, dir) = job(2);
        ran_on(&dir, "worker2");
        assert_eq!(begin(&dir, me(), false, None), Begin::AsItIs);
        assert!(dir.join("started").exists() && !root.path().join("20261128T180000-abcdef01.attempt-1").exists());
    }

    #[test]
    fn a_call_lost_mid_run_starts_again_then_its_retries_are_spent() {
        let (root, dir) = job(1);
        ran_on(&dir, "worker2");
        assert_eq!(begin(&dir, me(), true, None), Begin::Again(2));
        assert!(!dir.join("stdout").exists() && !dir.join("started").exists());
        assert!(root.path().join("20261128T180000-abcdef01.attempt-1/stdout").exists());
        ran_on(&dir, "worker1");
        match begin(&dir, me(), true, None) {
            Begin::Spent(why) => assert_eq!(
                why,
                "its node was lost on every attempt (attempt 1 on worker2, attempt 2 on worker1); \
                 it ran again 1 time, its retries"
            ),
            other => panic!("{other:?}"),
        }
        assert!(dir.join("spec").exists() && root.path().join("20261128T180000-abcdef01.attempt-2").exists());
    }

    /// A call that ended (raised, failed, was cancelled...) is never run
    /// again, whatever happened to its node afterwards.
    #[test]
    fn a_call_with_an_outcome_never_runs_again() {
        let (_r, dir) = job(2);
        ran_on(&dir, "worker2");
        let o = Outcome::ended(State::Failed, "it raised", String::from("worker2"), Writer::Runner);
        fs::write(dir.join("outcome"), encode(&o).unwrap()).unwrap();
        assert_eq!(begin(&dir, me(), true, None), Begin::AsItIs);
        assert!(dir.join("stdout").exists());
    }

    #[test]
    fn a_maps_reclaimed_call_gets_the_new_claim() {
        let (_r, dir) = job(2);
        fs::write(dir.join("claim"), "7_0 worker2 0\n").unwrap();
        let me_now = Claim {
            allocation: "7_0".into(),
            node: "worker1".into(),
            restart: 1,
        };
        assert_eq!(begin(&dir, me(), true, Some(&me_now)), Begin::Again(2));
        assert_eq!(fs::read_to_string(dir.join("claim")).unwrap(), "7_0 worker1 1\n");
        let rec = fs::read_to_string(dir.join("attempts")).unwrap();
        assert!(rec.starts_with("1 worker2 0 "), "{rec}");
    }
}

//! A batch launch that cannot succeed on this node, undone.
//!
//! slurmstepd writes a job's batch script into slurmd's spool
//! (`SlurmdSpoolDir/job<ID>/slurm_script`, the ID of five digits at least)
//! and removes it when the job ends. A node that dies under a job (a
//! machine killed, a reboot) keeps that directory: when Slurm later
//! launches the same job on this node again (a call run again within its
//! retries), slurmstepd will not write over it (`slurm_script: File
//! exists`), and slurmctld holds a job whose launch failed
//! (`launch failed requeued held`) until someone releases it. A call with
//! retries left waited for ever.
//!
//! The agent undoes both halves:
//! - [`sweep`] removes every job directory of the spool that no
//!   slurmstepd on this node serves, as soon as the agent starts (on the
//!   stack a worker's slurmd starts after its agent) and every [`EVERY`];
//! - [`keep_released`] releases, every [`EVERY`], the jobs Slurm holds for
//!   a failed launch (any node's: a job may fail elsewhere, where no agent
//!   runs yet), as long as Slurm restarted the job at most
//!   [`MAX_RESTARTS`] times; beyond, a node that fails every launch would be
//!   given the job again and again, and the job stays held with an error
//!   in the agent's log for an administrator.
//!
//! A job's outcome is not touched: a launch that failed never ran the
//! call, so the runner's count of attempts (the call's retries) is the
//! same when it runs.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::ask::{slurm, SlurmError};

/// Between two sweeps and two looks for held jobs.
pub const EVERY: Duration = Duration::from_secs(30);
/// A job directory younger than this is left alone: a launch may be
/// setting it up (its slurmstepd is also there then; this is a margin).
const SETTLE: Duration = Duration::from_secs(20);
/// A held job restarted more often than this stays held.
const MAX_RESTARTS: u32 = 10;
/// At most this much of squeue's list of pending jobs is read.
const MAX_PENDING_ANSWER: usize = 4 << 20;
/// Slurm's reason of a job held after its launch failed, as squeue says
/// it (`scontrol show job` writes it with underscores).
const LAUNCH_FAILED: &str = "launch failed requeued held";

/// The spool directory of this node's slurmd, from Slurm's configuration
/// (`%n` and `%h` expanded to the node's name).
pub async fn spool_dir(node: &str) -> Result<PathBuf, SpoolError> {
    let config = slurm(&["scontrol", "show", "config"], 1 << 20).await?;
    spool_of(&config, node).ok_or(SpoolError::NotNamed)
}

/// Why slurmd's spool directory is not known.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error(transparent)]
    Slurm(#[from] SlurmError),
    #[error("Slurm's configuration names no SlurmdSpoolDir")]
    NotNamed,
}

fn spool_of(config: &str, node: &str) -> Option<PathBuf> {
    let line = config.lines().find(|l| l.split_whitespace().next() == Some("SlurmdSpoolDir"))?;
    let dir = line.split_once('=')?.1.trim().replace("%n", node).replace("%h", node);
    Path::new(&dir).is_absolute().then(|| PathBuf::from(dir))
}

/// Removes the job directories of `spool` that no slurmstepd (a root
/// process running one of `stepds`) serves and that are older than
/// [`SETTLE`]; the jobs whose directory went, for the log.
pub fn sweep(spool: &Path, stepds: &[PathBuf]) -> Vec<String> {
    if stepds.is_empty() {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(spool) else {
        return Vec::new();
    };
    // (the directories first, then the processes: a directory older than
    // SETTLE whose job runs has its slurmstepd when the processes are read)
    let old: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| Some((job_of_dir(e.file_name().to_str()?)?, e.path())))
        .filter(|(_, p)| settled(p))
        .collect();
    let served = served_jobs(stepds);
    let mut gone = Vec::new();
    for (job, path) in old {
        if served.contains(&job) {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => gone.push(job),
            Err(e) => tracing::warn!("cannot remove {}, left by Slurm job {job}: {e}", path.display()),
        }
    }
    gone
}

/// The job of a spool entry named `job<digits>` (slurmd's own name).
fn job_of_dir(name: &str) -> Option<String> {
    let digits = name.strip_prefix("job")?;
    let ok = !digits.is_empty() && digits.len() <= 20 && digits.bytes().all(|b| b.is_ascii_digit());
    let job = digits.trim_start_matches('0');
    (ok && !job.is_empty()).then(|| job.to_owned())
}

/// A real directory (not a link), root's, older than [`SETTLE`].
fn settled(path: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    let age = meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok());
    meta.is_dir() && meta.uid() == 0 && age.is_some_and(|a| a >= SETTLE)
}

/// The jobs some slurmstepd of this node serves: root processes whose
/// program is one of `stepds`, titled `slurmstepd: [<job>.<step>]`.
pub fn served_jobs(stepds: &[PathBuf]) -> HashSet<String> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return HashSet::new();
    };
    procs
        .filter_map(Result::ok)
        .filter(|p| p.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter(|p| p.metadata().is_ok_and(|m| m.uid() == 0))
        .filter(|p| std::fs::read_link(p.path().join("exe")).is_ok_and(|exe| stepds.contains(&exe)))
        .filter_map(|p| job_of_any_title(&std::fs::read(p.path().join("cmdline")).ok()?))
        .collect()
}

/// The job of a `slurmstepd: [<job>.<step>]` title, any step.
fn job_of_any_title(cmdline: &[u8]) -> Option<String> {
    let first = cmdline.split(|b| *b == 0).next()?;
    let inner = std::str::from_utf8(first).ok()?.strip_prefix("slurmstepd: [")?;
    let job = inner.split(['.', ']']).next()?;
    (!job.is_empty() && job.len() <= 20 && job.bytes().all(|b| b.is_ascii_digit())).then(|| job.to_owned())
}

/// The spool swept at once, then every [`EVERY`] the spool swept again and
/// the jobs Slurm holds for a failed launch released.
pub async fn keep_released(node: String, stepds: Vec<PathBuf>) {
    let mut spool = None;
    loop {
        if spool.is_none() {
            spool = spool_dir(&node)
                .await
                .inspect_err(|e| tracing::debug!("no spool to sweep yet: {e}"))
                .ok();
        }
        if let Some(spool) = &spool {
            for job in sweep(spool, &stepds) {
                tracing::warn!("removed the spool of Slurm job {job}, which no slurmstepd here serves (its node died under it, or its launch failed): launched here again, it would fail");
            }
        }
        if let Err(e) = release_held().await {
            tracing::debug!("cannot look for jobs held after a failed launch: {e}");
        }
        tokio::time::sleep(EVERY).await;
    }
}

async fn release_held() -> Result<(), SlurmError> {
    let argv = ["squeue", "-h", "-t", "PD", "-O", "JobID:|,Reason:|,RestartCnt:|"];
    let pending = slurm(&argv, MAX_PENDING_ANSWER).await?;
    for (job, restarts) in held_after_a_failed_launch(&pending) {
        if restarts > MAX_RESTARTS {
            tracing::error!("Slurm job {job} is held after a failed launch and was restarted {restarts} times: left held (a node fails every launch? `scontrol release {job}` once it is fixed)");
            continue;
        }
        match slurm(&["scontrol", "release", &job], 4096).await {
            Ok(_) => tracing::warn!(
                "Slurm job {job} was held after a failed launch (restarted {restarts} times): released, it runs again"
            ),
            Err(e) => tracing::debug!("Slurm job {job}: {e}"),
        }
    }
    Ok(())
}

/// squeue's `job|reason|restarts|` lines: the jobs held after a failed
/// launch, with their restart counts.
fn held_after_a_failed_launch(squeue: &str) -> Vec<(String, u32)> {
    squeue
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split('|').map(str::trim).collect();
            let [job, reason, restarts, ..] = f[..] else {
                return None;
            };
            let digits = !job.is_empty() && job.len() <= 20 && job.bytes().all(|b| b.is_ascii_digit());
            if !digits || reason != LAUNCH_FAILED {
                return None;
            }
            Some((job.to_owned(), restarts.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spool_from_slurms_configuration() {
        let config =
            "SlurmctldPort           = 6817\nSlurmdSpoolDir          = /var/spool/slurmd/%n\nSlurmdTimeout = 60 sec\n";
        assert_eq!(spool_of(config, "worker1"), Some(PathBuf::from("/var/spool/slurmd/worker1")));
        assert_eq!(spool_of("SlurmdSpoolDir = relative\n", "n"), None);
        assert_eq!(spool_of("SlurmdSpoolDirX = /x\n", "n"), None);
        assert_eq!(spool_of("", "n"), None);
    }

    #[test]
    fn only_slurmds_job_directories_are_jobs() {
        assert_eq!(job_of_dir("job01097").as_deref(), Some("1097"));
        assert_eq!(job_of_dir("job123456").as_deref(), Some("123456"));
        for other in [
            "cred_state",
            "job",
            "job00000",
            "jobx1",
            "job1.old",
            "hwloc_topo_whole.xml",
            "vm_1097.0",
        ] {
            assert_eq!(job_of_dir(other), None, "{other}");
        }
    }

    #[test]
    fn every_step_of_a_slurmstepd_serves_its_job() {
        for (title, job) in [
            (&b"slurmstepd: [1097.batch]\0\0"[..], "1097"),
            (b"slurmstepd: [1097.extern]", "1097"),
            (b"slurmstepd: [88.0]", "88"),
        ] {
            assert_eq!(job_of_any_title(title).as_deref(), Some(job));
        }
        for other in [
            &b"slurmstepd"[..],
            b"slurmstepd: []",
            b"slurmstepd: [x.batch]",
            b"sleep 10",
        ] {
            assert_eq!(job_of_any_title(other), None);
        }
    }

    #[test]
    fn the_held_jobs_of_squeues_list() {
        let out = "1097|launch failed requeued held|1|\n1098|BeginTime|0|\n12|launch failed requeued held|11|\nx|launch failed requeued held|1|\n13|launch failed requeued held|many|\n14|launch_failed_requeued_held_x|1|\n";
        assert_eq!(
            held_after_a_failed_launch(out),
            vec![("1097".to_owned(), 1), ("12".to_owned(), 11)]
        );
    }

    #[test]
    fn a_sweep_removes_only_old_directories_no_slurmstepd_serves() {
        let spool = tempfile::tempdir().expect("a temporary spool");
        let stale = spool.path().join("job01097");
        let fresh = spool.path().join("job01098");
        for d in [&stale, &fresh] {
            std::fs::create_dir(d).expect("a job directory");
            std::fs::write(d.join("slurm_script"), "#!/bin/sh\n").expect("a script");
        }
        let served = spool.path().join("job01099");
        std::fs::create_dir(&served).expect("a served job's directory");
        std::fs::write(spool.path().join("cred_state"), "x").expect("slurmd's own file");
        let old = SystemTime::now() - 2 * SETTLE;
        for d in [&stale, &served] {
            std::fs::File::open(d)
                .and_then(|f| f.set_modified(old))
                .expect("an old directory");
        }
        // A root process titled as job 1099's slurmstepd (`sleep` stands in
        // for the slurmstepd program).
        let sleep = std::fs::canonicalize("/bin/sleep").expect("sleep");
        let mut stepd = std::process::Command::new(&sleep);
        std::os::unix::process::CommandExt::arg0(&mut stepd, "slurmstepd: [1099.batch]");
        let mut stepd = stepd.arg("30").spawn().expect("a stand-in slurmstepd");
        let titled =
            || std::fs::read(format!("/proc/{}/cmdline", stepd.id())).is_ok_and(|c| c.starts_with(b"slurmstepd: ["));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !titled() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let gone = sweep(spool.path(), &[sleep]);
        let _ = stepd.kill();
        let _ = stepd.wait();
        assert_eq!(gone, vec!["1097".to_owned()]);
        assert!(!stale.exists() && fresh.exists() && served.exists() && spool.path().join("cred_state").exists());
        assert!(sweep(spool.path(), &[]).is_empty(), "no slurmstepd known: nothing is removed");
    }
}

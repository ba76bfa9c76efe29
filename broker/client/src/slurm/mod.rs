//! The user side's adapter around Slurm's command-line tools: one `sbatch`
//! per job, one `squeue` per interval for all of a user's jobs, one
//! `scancel` for many jobs.
//!
//! The parsers are pure functions so they can be tested without a cluster;
//! they never panic on odd output (junk lines are skipped with a warning).

pub mod nodes;
mod parse;
mod refusal;
pub mod rush;
mod script;
pub mod usage;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use parse::{
    array_spec_contains, lookup, parse_sbatch_parsable, parse_sinfo, parse_slurm_time, parse_squeue, BadSlurmTime,
    PartitionInfo, SlurmJob, SlurmPhase, SlurmState,
};
pub use refusal::{classify_sbatch_error, Refusal};
pub use script::{
    array_script, batch_script, pull_script, ranks_script, sbatch_args, shell_quote, time_limit_minutes, with_gpus,
    BatchRequest,
};

use crate::subprocess::{self, SubprocessError};

/// Environment variable naming the Slurm partition to submit to (default:
/// Slurm's default partition).
pub const PARTITION_ENV: &str = "DELEGATE_PARTITION";
/// How long one call of a Slurm tool may take before it is given up on (and
/// killed): a controller that does not answer must not block a client.
pub const SLURM_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("could not run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed: {message}")]
    Failed { program: String, message: String },
    #[error("{program} did not answer within {} s", .timeout.as_secs())]
    TimedOut { program: String, timeout: Duration },
    #[error("sbatch printed no job id (its output was {0:?})")]
    NoJobId(String),
    /// Slurm refused the submission by the course's accounting policy (a
    /// per-student limit, no association): the sentence for the student.
    #[error("{0}")]
    Refused(Refusal),
}

impl From<SubprocessError> for SlurmError {
    fn from(e: SubprocessError) -> SlurmError {
        match e {
            SubprocessError::Spawn { program, source } | SubprocessError::Wait { program, source } => {
                SlurmError::Spawn { program, source }
            }
            SubprocessError::TimedOut { program, timeout } => SlurmError::TimedOut { program, timeout },
        }
    }
}

static SBATCH_CALLS: AtomicU64 = AtomicU64::new(0);
static SQUEUE_CALLS: AtomicU64 = AtomicU64::new(0);

/// How many `sbatch` processes this process has started (tests and
/// benchmarks check that a `map` is one submission).
pub fn sbatch_calls() -> u64 {
    SBATCH_CALLS.load(Ordering::SeqCst)
}

/// How many `squeue` processes this process has started.
pub fn squeue_calls() -> u64 {
    SQUEUE_CALLS.load(Ordering::SeqCst)
}

/// The error of a tool that exited non-zero: its first line of output.
fn failed(program: &std::path::Path, out: &subprocess::Output) -> SlurmError {
    SlurmError::Failed {
        program: program.display().to_string(),
        message: out
            .first_line()
            .unwrap_or_else(|| format!("it exited with {} and printed nothing", out.status)),
    }
}

/// Slurm's command-line tools.
#[derive(Clone, Debug)]
pub struct Slurm {
    pub partition: Option<String>,
    pub sbatch: PathBuf,
    pub squeue: PathBuf,
    pub scancel: PathBuf,
    pub sinfo: PathBuf,
    pub sacct: PathBuf,
    /// `scontrol`, for `delegate doctor`'s ping of the controller.
    pub scontrol: PathBuf,
    /// How long one call may take ([`SLURM_TIMEOUT`]).
    pub timeout: Duration,
}

impl Default for Slurm {
    fn default() -> Self {
        Slurm {
            partition: None,
            sbatch: "sbatch".into(),
            squeue: "squeue".into(),
            scancel: "scancel".into(),
            sinfo: "sinfo".into(),
            sacct: "sacct".into(),
            scontrol: "scontrol".into(),
            timeout: SLURM_TIMEOUT,
        }
    }
}

impl Slurm {
    /// The tools from `$PATH`, the partition from `$DELEGATE_PARTITION`.
    pub fn from_env() -> Slurm {
        Slurm {
            partition: std::env::var(PARTITION_ENV).ok().filter(|p| !p.trim().is_empty()),
            ..Slurm::default()
        }
    }

    /// Runs one tool through [`subprocess::run`]; its stdout when it
    /// succeeded, else the first line it printed.
    fn run(&self, program: &std::path::Path, args: &[String], stdin: Option<&str>) -> Result<String, SlurmError> {
        self.run_env(program, args, &[], stdin)
    }

    /// [`Slurm::run`] with `env` added to the tool's environment.
    fn run_env(
        &self,
        program: &std::path::Path,
        args: &[String],
        env: &[(&str, &str)],
        stdin: Option<&str>,
    ) -> Result<String, SlurmError> {
        let out = subprocess::run_env(program, args, env, stdin.map(str::as_bytes), self.timeout)?;
        if !out.success() {
            return Err(failed(program, &out));
        }
        Ok(out.stdout_text())
    }

    /// Submits one batch job; returns its Slurm id. A refusal by the
    /// accounting policy is [`SlurmError::Refused`] (Slurm created no job).
    pub fn submit(&self, req: &BatchRequest) -> Result<String, SlurmError> {
        let args = sbatch_args(req, self.partition.as_deref());
        SBATCH_CALLS.fetch_add(1, Ordering::SeqCst);
        let out = subprocess::run(&self.sbatch, &args, Some(req.script.as_bytes()), self.timeout)?;
        if !out.success() {
            if let Some(r) = classify_sbatch_error(&String::from_utf8_lossy(&out.stderr)) {
                return Err(SlurmError::Refused(r));
            }
            return Err(failed(&self.sbatch, &out));
        }
        parse_sbatch_parsable(&out.stdout_text())
    }

    /// All jobs of `uid` that Slurm still knows, in one query.
    pub fn query_user(&self, uid: u32) -> Result<HashMap<String, SlurmJob>, SlurmError> {
        let args = vec![
            // --local: no REQUEST_FED_INFO round trip (delegate's clusters
            // are not federated); squeue still asks for the partitions.
            "--local".to_owned(),
            "--noheader".to_owned(),
            "--states=all".to_owned(),
            // One line per job-array element (`123_4`), also while pending
            // (otherwise pending elements collapse into `123_[4-49]` and a
            // job directory naming `123_4` would look gone).
            "--array".to_owned(),
            format!("--user={uid}"),
            // (%S: a pending job's expected start, from the backfill
            // scheduler; %V: when it was submitted or last requeued; in
            // seconds since the epoch with SLURM_TIME_FORMAT)
            "--format=%i|%T|%N|%r|%S|%V".to_owned(),
        ];
        SQUEUE_CALLS.fetch_add(1, Ordering::SeqCst);
        Ok(parse_squeue(&self.run_env(
            &self.squeue,
            &args,
            &[("SLURM_TIME_FORMAT", "%s")],
            None,
        )?))
    }

    /// The partition jobs go to: its usable nodes and time limit, in one
    /// `sinfo`.
    pub fn partition_info(&self) -> Result<PartitionInfo, SlurmError> {
        let mut args = vec!["--noheader".to_owned(), "--format=%P|%D|%l|%t".to_owned()];
        if let Some(p) = self.partition.as_deref().filter(|p| !p.is_empty()) {
            args.push(format!("--partition={p}"));
        }
        let out = self.run(&self.sinfo, &args, None)?;
        parse_sinfo(&out, self.partition.as_deref().filter(|p| !p.is_empty())).ok_or_else(|| SlurmError::Failed {
            program: self.sinfo.display().to_string(),
            message: match &self.partition {
                Some(p) => format!("no partition {p:?} in its output"),
                None => "no default partition in its output".into(),
            },
        })
    }

    /// The nodes of the partition jobs go to, with their hardware class and
    /// their agent's report, in one `sinfo`.
    pub fn nodes(&self) -> Result<Vec<nodes::NodeRow>, SlurmError> {
        let partition = self.partition.as_deref().filter(|p| !p.is_empty());
        Ok(nodes::in_partition(self.all_nodes()?, partition))
    }

    /// Every node this user may see, once per partition, in one `sinfo`.
    pub fn all_nodes(&self) -> Result<Vec<nodes::NodeRow>, SlurmError> {
        let args = vec![
            "--Node".to_owned(),
            "--noheader".to_owned(),
            format!("--Format={}", nodes::SINFO_NODES_FORMAT),
        ];
        let out = self.run(&self.sinfo, &args, None)?;
        Ok(nodes::parse_nodes(&out))
    }

    /// Every user's allocations that ran, ended or were recorded since
    /// `since` (sacct's `--starttime`: `2026-11-23`, `2026-11-23T08:00`,
    /// `now-7days`; default: Slurm's, midnight today), in one `sacct`.
    /// Every user's records only for root, SlurmUser and accounting
    /// operators/coordinators (PrivateData); others get their own.
    pub fn accounting(&self, since: Option<&str>) -> Result<Vec<usage::AcctJob>, SlurmError> {
        let mut args = vec![
            "--allusers".to_owned(),
            "--allocations".to_owned(),
            // Every run of a job Slurm queued again (a lost node, a call's
            // new attempt, a map's allocation stepping aside): its own line.
            "--duplicates".to_owned(),
            "--noheader".to_owned(),
            "--parsable2".to_owned(),
            format!("--format={}", usage::SACCT_FORMAT),
        ];
        if let Some(s) = since.filter(|s| !s.trim().is_empty()) {
            args.push(format!("--starttime={}", s.trim()));
            args.push("--endtime=now".to_owned());
        }
        Ok(usage::parse_sacct(&self.run(&self.sacct, &args, None)?))
    }

    /// Every user's jobs waiting or running now (one line per array
    /// element), running first, then in the order Slurm will start them.
    pub fn queue_all(&self) -> Result<Vec<usage::QueuedJob>, SlurmError> {
        Ok(usage::parse_queue(&self.every_users_jobs(usage::SQUEUE_FORMAT, &[])?))
    }

    /// One `squeue` of every user's jobs waiting or running now (one line
    /// per array element) in `format`, `env` added to its environment.
    fn every_users_jobs(&self, format: &str, env: &[(&str, &str)]) -> Result<String, SlurmError> {
        let args = vec![
            "--local".to_owned(),
            "--all".to_owned(),
            "--array".to_owned(),
            "--noheader".to_owned(),
            "--states=PENDING,RUNNING,CONFIGURING,COMPLETING".to_owned(),
            format!("--format={format}"),
        ];
        SQUEUE_CALLS.fetch_add(1, Ordering::SeqCst);
        self.run_env(&self.squeue, &args, env, None)
    }

    /// Every user's jobs waiting or running now, for the rush's snapshot
    /// (submit times in seconds since the epoch).
    pub fn rush_queue(&self) -> Result<Vec<rush::QueueLine>, SlurmError> {
        let out = self.every_users_jobs(rush::SQUEUE_FORMAT, &[("SLURM_TIME_FORMAT", "%s")])?;
        Ok(rush::parse_queue(&out))
    }

    /// Cancels all `ids` in one call.
    pub fn cancel(&self, ids: &[String]) -> Result<(), SlurmError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.run(&self.scancel, ids, None).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_is_a_clear_error() {
        let s = Slurm {
            squeue: "/nonexistent/squeue".into(),
            ..Slurm::default()
        };
        let e = s.query_user(1).unwrap_err();
        assert!(e.to_string().starts_with("could not run /nonexistent/squeue: "), "{e}");
    }

    #[test]
    fn failing_tool_reports_first_stderr_line() {
        let s = Slurm {
            scancel: "/bin/sh".into(),
            ..Slurm::default()
        };
        let e = s
            .cancel(&[
                "-c".into(),
                "echo '' >&2; echo 'first line' >&2; echo second >&2; exit 3".into(),
            ])
            .unwrap_err();
        assert_eq!(e.to_string(), "/bin/sh failed: first line");
    }

    #[test]
    fn an_accounting_refusal_is_typed() {
        // A stand-in for sbatch that refuses as Slurm does.
        let fake = std::env::temp_dir().join(format!("delegate-fake-sbatch-{}", std::process::id()));
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2\n\
             echo 'sbatch: error: Batch job submission failed: Job violates accounting/QOS policy' >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let s = Slurm { sbatch: fake.clone(), ..Slurm::default() };
        let req = BatchRequest {
            job_name: "x".into(),
            chdir: "/".into(),
            output: "/dev/null".into(),
            cpus: 1,
            time_limit_secs: 60,
            script: "#!/bin/sh\n".into(),
            hold: false,
            calls: 1,
            constraint: None,
            map: false,
            requeue: false,
        };
        let e = s.submit(&req).unwrap_err();
        let _ = std::fs::remove_file(&fake);
        assert!(matches!(e, SlurmError::Refused(Refusal::SubmitLimit)), "{e}");
    }

    #[test]
    fn a_hung_tool_is_given_up_on() {
        let s = Slurm {
            scancel: "/bin/sh".into(),
            timeout: Duration::from_millis(200),
            ..Slurm::default()
        };
        let e = s.cancel(&["-c".into(), "sleep 30".into()]).unwrap_err();
        assert!(matches!(e, SlurmError::TimedOut { .. }), "{e}");
        assert_eq!(e.to_string(), "/bin/sh did not answer within 0 s");
    }
}

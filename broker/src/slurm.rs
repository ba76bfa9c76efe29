//! The user side's adapter around Slurm's command-line tools: one `sbatch`
//! per job, one `squeue` per interval for all of a user's jobs, one
//! `scancel` for many jobs.
//!
//! The parsers are pure functions so they can be tested without a cluster;
//! they never panic on odd output (junk lines are skipped with a warning).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Environment variable naming the Slurm partition to submit to (default:
/// Slurm's default partition).
pub const PARTITION_ENV: &str = "DELEGATE_PARTITION";

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
    #[error("sbatch printed no job id (its output was {0:?})")]
    NoJobId(String),
}

/// What `squeue` says about one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmJob {
    /// Slurm's long state name, e.g. `PENDING`, `RUNNING`, `COMPLETED`.
    pub state: String,
    /// Slurm's reason, e.g. `Priority`, `Resources`, `None`.
    pub reason: String,
}

/// Where a Slurm state is in a job's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlurmPhase {
    /// Waiting for an allocation.
    Queued,
    /// Allocated; the batch script (the runner) is running or ending.
    Active,
    /// Slurm considers the job over.
    Ended,
}

/// Classifies a Slurm state name. Unknown names are treated as active: a job
/// is only declared lost on a state Slurm documents as final.
pub fn phase(state: &str) -> SlurmPhase {
    match state {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" => {
            SlurmPhase::Queued
        }
        "COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT" | "NODE_FAIL" | "PREEMPTED"
        | "OUT_OF_MEMORY" | "BOOT_FAIL" | "DEADLINE" | "REVOKED" | "SPECIAL_EXIT" => SlurmPhase::Ended,
        _ => SlurmPhase::Active,
    }
}

/// Slurm's time limit in minutes for a job whose runner enforces
/// `time_limit_secs` itself: one extra minute of slack, rounded up. Slurm's
/// limit is only a backstop.
pub fn time_limit_minutes(time_limit_secs: u64) -> u64 {
    time_limit_secs.saturating_add(60).div_ceil(60)
}

/// Quotes `s` for a POSIX shell (single quotes; embedded quotes escaped).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The batch script: exec the runner on the job directory.
pub fn batch_script(runner: &Path, job_dir: &Path) -> String {
    format!(
        "#!/bin/sh\nexec {} {}\n",
        shell_quote(&runner.display().to_string()),
        shell_quote(&job_dir.display().to_string())
    )
}

/// The batch script of a job array: element `i` sends its output to
/// `logs[i]` (the per-job Slurm log the client reads for a refusal or a lost
/// job's reason) and execs the runner on `job_dirs[i]`.
pub fn array_script(runner: &Path, job_dirs: &[PathBuf], logs: &[PathBuf]) -> String {
    let mut s = format!("#!/bin/sh\n#SBATCH --array=0-{}\n", job_dirs.len().saturating_sub(1));
    s.push_str("case \"$SLURM_ARRAY_TASK_ID\" in\n");
    for (i, (dir, log)) in job_dirs.iter().zip(logs).enumerate() {
        s.push_str(&format!(
            "{i}) exec >>{} 2>&1; exec {} {} ;;\n",
            shell_quote(&log.display().to_string()),
            shell_quote(&runner.display().to_string()),
            shell_quote(&dir.display().to_string())
        ));
    }
    s.push_str("esac\necho \"delegate: no job directory for array task $SLURM_ARRAY_TASK_ID\" >&2\nexit 1\n");
    s
}

/// The batch script of calls that share allocations: allocation `k` (array
/// element `k` when there are several, the whole job when there is one)
/// execs `sandbox-runner batch` on `groups[k]`, which runs those job
/// directories one after another, each in its own fresh container, and
/// writes each call's log to `<root>/<job-id>.log` itself.
pub fn shared_script(runner: &Path, groups: &[Vec<PathBuf>]) -> String {
    let line = |dirs: &[PathBuf]| {
        let mut l = format!("exec {} batch", shell_quote(&runner.display().to_string()));
        for d in dirs {
            l.push(' ');
            l.push_str(&shell_quote(&d.display().to_string()));
        }
        l
    };
    if let [only] = groups {
        return format!("#!/bin/sh\n{}\n", line(only));
    }
    let mut s = format!("#!/bin/sh\n#SBATCH --array=0-{}\n", groups.len().saturating_sub(1));
    s.push_str("case \"$SLURM_ARRAY_TASK_ID\" in\n");
    for (i, dirs) in groups.iter().enumerate() {
        s.push_str(&format!("{i}) {} ;;\n", line(dirs)));
    }
    s.push_str("esac\necho \"delegate: no job directories for array task $SLURM_ARRAY_TASK_ID\" >&2\nexit 1\n");
    s
}

/// What `sinfo` says about the partition jobs go to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    pub name: String,
    /// Nodes that can run jobs (not down, drained or failed).
    pub nodes: u32,
    /// The partition's MaxTime; `None` when unlimited.
    pub max_time_secs: Option<u64>,
}

/// Parses a Slurm time limit as sinfo prints it: `infinite`, `UNLIMITED`,
/// `minutes`, `minutes:seconds`, `hours:minutes:seconds`,
/// `days-hours[:minutes[:seconds]]`. `Ok(None)` means unlimited.
pub fn parse_slurm_time(s: &str) -> Result<Option<u64>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("infinite") || s.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    let bad = || format!("{s:?} is not a Slurm time limit");
    let num = |t: &str| t.parse::<u64>().map_err(|_| bad());
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (num(d)?, r),
        None => (0, s),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Result<_, _>>()?;
    let secs = match (s.contains('-'), parts.as_slice()) {
        (false, [m]) => m * 60,
        (false, [m, sec]) => m * 60 + sec,
        (_, [h, m, sec]) => h * 3600 + m * 60 + sec,
        (true, [h]) => h * 3600,
        (true, [h, m]) => h * 3600 + m * 60,
        _ => return Err(bad()),
    };
    Ok(Some(days * 86400 + secs))
}

/// Parses `sinfo --noheader --format=%P|%D|%l|%t` output for `partition`
/// (`None`: Slurm's default partition, the one sinfo marks with `*`).
pub fn parse_sinfo(out: &str, partition: Option<&str>) -> Option<PartitionInfo> {
    let mut info: Option<PartitionInfo> = None;
    for line in out.lines() {
        let f: Vec<&str> = line.trim().split('|').map(str::trim).collect();
        let [name, nodes, limit, state] = f.as_slice() else {
            continue;
        };
        let (name, default) = match name.strip_suffix('*') {
            Some(n) => (n, true),
            None => (*name, false),
        };
        let wanted = match partition {
            Some(p) => name == p,
            None => default,
        };
        let (Ok(n), Ok(max)) = (nodes.parse::<u32>(), parse_slurm_time(limit)) else {
            continue;
        };
        if !wanted {
            continue;
        }
        let usable = !["down", "drain", "fail", "maint", "unk", "boot", "futr", "inval", "npc", "plnd", "pow"]
            .iter()
            .any(|bad| state.trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-']).starts_with(bad));
        let e = info.get_or_insert(PartitionInfo {
            name: name.to_owned(),
            nodes: 0,
            max_time_secs: max,
        });
        if usable {
            e.nodes = e.nodes.saturating_add(n);
        }
    }
    info
}

static SBATCH_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static SQUEUE_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many `sbatch` processes this process has started (tests and
/// benchmarks check that a `map` is one submission).
pub fn sbatch_calls() -> u64 {
    SBATCH_CALLS.load(std::sync::atomic::Ordering::SeqCst)
}

/// How many `squeue` processes this process has started.
pub fn squeue_calls() -> u64 {
    SQUEUE_CALLS.load(std::sync::atomic::Ordering::SeqCst)
}

/// One batch submission.
#[derive(Clone, Debug)]
pub struct BatchRequest {
    pub job_name: String,
    /// The delegate root (working directory of the batch script).
    pub chdir: PathBuf,
    /// Slurm's log of the batch script.
    pub output: PathBuf,
    pub cpus: u32,
    pub time_limit_secs: u64,
    pub script: String,
    /// Submit held (`--hold`): the job waits for `scontrol release`.
    pub hold: bool,
}

/// The arguments of `sbatch` for `req`.
pub fn sbatch_args(req: &BatchRequest, partition: Option<&str>) -> Vec<String> {
    let mut args = vec![
        "--parsable".to_owned(),
        "--exclusive".to_owned(),
        // A job directory is single-use: a job whose node failed must end
        // (lost, with Slurm's reason), not silently run again on the same dir.
        "--no-requeue".to_owned(),
        format!("--job-name={}", req.job_name),
        format!("--chdir={}", req.chdir.display()),
        format!("--output={}", req.output.display()),
        format!("--cpus-per-task={}", req.cpus),
        format!("--time={}", time_limit_minutes(req.time_limit_secs)),
    ];
    if let Some(p) = partition.filter(|p| !p.is_empty()) {
        args.push(format!("--partition={p}"));
    }
    if req.hold {
        args.push("--hold".to_owned());
    }
    args
}

/// The job id from `sbatch --parsable` output: `123` or `123;cluster`.
/// Warnings sbatch prints before the id are skipped: the id is the last
/// non-empty line.
pub fn parse_sbatch_parsable(out: &str) -> Result<String, SlurmError> {
    let line = out.lines().map(str::trim).rev().find(|l| !l.is_empty()).unwrap_or("");
    let id = line.split(';').next().unwrap_or("").trim();
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
        Ok(id.to_owned())
    } else {
        Err(SlurmError::NoJobId(out.chars().take(200).collect()))
    }
}

/// Parses `squeue --noheader --format='%i|%T|%r'` output into a map from
/// Slurm job id (`123`, or `123_4` for an array element) to state and
/// reason. Blank lines are ignored; junk lines are skipped with a warning.
pub fn parse_squeue(out: &str) -> HashMap<String, SlurmJob> {
    let mut jobs = HashMap::new();
    for line in out.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, '|');
        let (id, state, reason) = match (parts.next(), parts.next(), parts.next()) {
            (Some(i), Some(s), r) => (i.trim(), s.trim(), r.unwrap_or("").trim()),
            _ => {
                tracing::warn!(line, "skipping an squeue line that is not id|state|reason");
                continue;
            }
        };
        let id_ok = !id.is_empty()
            && id.bytes().next().is_some_and(|b| b.is_ascii_digit())
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'_' | b'[' | b']' | b'-' | b',' | b'%' | b'+' | b':'));
        let state_ok = !state.is_empty() && state.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
        if !id_ok || !state_ok {
            tracing::warn!(line, "skipping an squeue line with an unexpected id or state");
            continue;
        }
        jobs.insert(
            id.to_owned(),
            SlurmJob {
                state: state.to_owned(),
                reason: reason.to_owned(),
            },
        );
    }
    jobs
}

/// True when the task list of a pending array record (`1-49`, `1,3,5-9`,
/// `0-99%4`; without the brackets) includes `task`.
pub fn array_spec_contains(spec: &str, task: u64) -> bool {
    let spec = spec.split('%').next().unwrap_or("");
    spec.split(',').any(|part| {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => match (a.parse::<u64>(), b.split(':').next().unwrap_or("").parse::<u64>()) {
                // `a-b:step`
                (Ok(a), Ok(b)) => {
                    let step = b_step(part).max(1);
                    (a..=b).contains(&task) && (task - a) % step == 0
                }
                _ => false,
            },
            None => part.parse::<u64>() == Ok(task),
        }
    })
}

fn b_step(part: &str) -> u64 {
    part.split_once(':').and_then(|(_, s)| s.parse().ok()).unwrap_or(1)
}

/// Looks up a Slurm job id in parsed squeue output. An array element
/// `123_4` also matches a pending array record such as `123_[0-9]`, which
/// is how squeue shows elements that have not started yet.
pub fn lookup<'a>(queue: &'a HashMap<String, SlurmJob>, id: &str) -> Option<&'a SlurmJob> {
    if let Some(j) = queue.get(id) {
        return Some(j);
    }
    let (base, task) = id.split_once('_')?;
    let task: u64 = task.parse().ok()?;
    let prefix = format!("{base}_[");
    queue.iter().find_map(|(k, j)| {
        let inner = k.strip_prefix(&prefix)?.strip_suffix(']')?;
        array_spec_contains(inner, task).then_some(j)
    })
}

/// The first non-empty line of a command's stderr (or stdout), for messages.
fn first_line(stderr: &[u8], stdout: &[u8], status: std::process::ExitStatus) -> String {
    let pick = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(|l| l.chars().take(300).collect::<String>())
    };
    pick(stderr)
        .or_else(|| pick(stdout))
        .unwrap_or_else(|| format!("it exited with {status} and printed nothing"))
}

/// Slurm's command-line tools.
#[derive(Clone, Debug)]
pub struct Slurm {
    pub partition: Option<String>,
    pub sbatch: PathBuf,
    pub squeue: PathBuf,
    pub scancel: PathBuf,
    pub sinfo: PathBuf,
}

impl Default for Slurm {
    fn default() -> Self {
        Slurm {
            partition: None,
            sbatch: "sbatch".into(),
            squeue: "squeue".into(),
            scancel: "scancel".into(),
            sinfo: "sinfo".into(),
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

    fn run(&self, program: &Path, args: &[String], stdin: Option<&str>) -> Result<String, SlurmError> {
        let name = program.display().to_string();
        tracing::debug!(program = %name, ?args, "running");
        let spawn = || {
            Command::new(program)
                .args(args)
                .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        };
        // ETXTBSY: the program was just written and another thread's fork
        // still holds it open for writing; it clears within moments.
        let mut attempt = 0;
        let mut child = loop {
            match spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 20 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(25));
                }
                other => {
                    break other.map_err(|source| SlurmError::Spawn {
                        program: name.clone(),
                        source,
                    })?
                }
            }
        };
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A write error (the tool exited early) shows up in its status.
            let _ = pipe.write_all(input.as_bytes());
        }
        let out = child.wait_with_output().map_err(|source| SlurmError::Spawn {
            program: name.clone(),
            source,
        })?;
        if !out.status.success() {
            return Err(SlurmError::Failed {
                program: name,
                message: first_line(&out.stderr, &out.stdout, out.status),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Submits one batch job; returns its Slurm id.
    pub fn submit(&self, req: &BatchRequest) -> Result<String, SlurmError> {
        let args = sbatch_args(req, self.partition.as_deref());
        SBATCH_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let out = self.run(&self.sbatch, &args, Some(&req.script))?;
        parse_sbatch_parsable(&out)
    }

    /// All jobs of `uid` that Slurm still knows, in one query.
    pub fn query_user(&self, uid: u32) -> Result<HashMap<String, SlurmJob>, SlurmError> {
        let args = vec![
            "--noheader".to_owned(),
            "--states=all".to_owned(),
            // One line per job-array element (`123_4`), also while pending
            // (otherwise pending elements collapse into `123_[4-49]` and a
            // job directory naming `123_4` would look gone).
            "--array".to_owned(),
            format!("--user={uid}"),
            "--format=%i|%T|%r".to_owned(),
        ];
        SQUEUE_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(parse_squeue(&self.run(&self.squeue, &args, None)?))
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
    fn sbatch_parsable() {
        assert_eq!(parse_sbatch_parsable("123\n").unwrap(), "123");
        assert_eq!(parse_sbatch_parsable("123;cluster\n").unwrap(), "123");
        assert_eq!(
            parse_sbatch_parsable("sbatch: warning: something odd\n77\n").unwrap(),
            "77"
        );
        assert!(parse_sbatch_parsable("").is_err());
        assert!(parse_sbatch_parsable("\n\n").is_err());
        assert!(parse_sbatch_parsable("Submitted batch job 12").is_err());
        assert!(parse_sbatch_parsable(";cluster").is_err());
        assert!(parse_sbatch_parsable("12a").is_err());
    }

    #[test]
    fn squeue_lines() {
        let out = "\n12|PENDING|Priority\n13|RUNNING|None\n\n14_2|COMPLETED|None\n15_[3-9]|PENDING|Resources\n\
                   garbage\n|RUNNING|x\n16|running|x\n17|NODE_FAIL|NodeDown\n18|TIMEOUT\n  19 | CANCELLED | None  \n";
        let m = parse_squeue(out);
        assert_eq!(m.len(), 7);
        assert_eq!(m["12"], SlurmJob { state: "PENDING".into(), reason: "Priority".into() });
        assert_eq!(m["13"].state, "RUNNING");
        assert_eq!(m["14_2"].state, "COMPLETED");
        assert_eq!(m["15_[3-9]"].reason, "Resources");
        assert_eq!(m["17"].reason, "NodeDown");
        assert_eq!(m["18"], SlurmJob { state: "TIMEOUT".into(), reason: "".into() });
        assert_eq!(m["19"].state, "CANCELLED");
        assert!(!m.contains_key("16"));
        assert!(parse_squeue("").is_empty());
        // Reasons may contain the separator.
        assert_eq!(parse_squeue("5|PENDING|a|b")["5"].reason, "a|b");
    }

    #[test]
    fn array_records() {
        let q = parse_squeue("26_[1-49%4]|PENDING|JobArrayTaskLimit\n26_0|RUNNING|None\n30_[1,3,5-9]|PENDING|Priority\n31_[0-10:2]|PENDING|None\n");
        assert_eq!(lookup(&q, "26_0").unwrap().state, "RUNNING");
        assert_eq!(lookup(&q, "26_1").unwrap().state, "PENDING");
        assert_eq!(lookup(&q, "26_49").unwrap().reason, "JobArrayTaskLimit");
        assert!(lookup(&q, "26_50").is_none());
        assert!(lookup(&q, "30_3").is_some());
        assert!(lookup(&q, "30_4").is_none());
        assert!(lookup(&q, "30_7").is_some());
        assert!(lookup(&q, "31_4").is_some());
        assert!(lookup(&q, "31_5").is_none());
        assert!(lookup(&q, "27").is_none());
        assert!(lookup(&q, "26_x").is_none());
        assert!(!array_spec_contains("garbage", 1));
        assert!(!array_spec_contains("", 0));
    }

    #[test]
    fn phases() {
        assert_eq!(phase("PENDING"), SlurmPhase::Queued);
        assert_eq!(phase("CONFIGURING"), SlurmPhase::Queued);
        assert_eq!(phase("RUNNING"), SlurmPhase::Active);
        assert_eq!(phase("COMPLETING"), SlurmPhase::Active);
        assert_eq!(phase("SUSPENDED"), SlurmPhase::Active);
        for s in [
            "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE",
        ] {
            assert_eq!(phase(s), SlurmPhase::Ended, "{s}");
        }
        assert_eq!(phase("SOMETHING_NEW"), SlurmPhase::Active);
    }

    #[test]
    fn args_and_script() {
        assert_eq!(time_limit_minutes(600), 11);
        assert_eq!(time_limit_minutes(5), 2);
        assert_eq!(time_limit_minutes(60), 2);
        assert_eq!(time_limit_minutes(61), 3);
        let req = BatchRequest {
            job_name: "20261123T103000-abcdef01".into(),
            chdir: "/home/a/.delegate/jobs".into(),
            output: "/home/a/.delegate/jobs/20261123T103000-abcdef01.log".into(),
            cpus: 2,
            time_limit_secs: 300,
            script: String::new(),
            hold: false,
        };
        let a = sbatch_args(&req, None);
        assert_eq!(
            a,
            [
                "--parsable",
                "--exclusive",
                "--no-requeue",
                "--job-name=20261123T103000-abcdef01",
                "--chdir=/home/a/.delegate/jobs",
                "--output=/home/a/.delegate/jobs/20261123T103000-abcdef01.log",
                "--cpus-per-task=2",
                "--time=6"
            ]
        );
        assert_eq!(sbatch_args(&req, Some("debug")).last().unwrap(), "--partition=debug");
        assert_eq!(
            batch_script(Path::new("/usr/local/bin/sandbox-runner"), Path::new("/home/o'k/j")),
            "#!/bin/sh\nexec '/usr/local/bin/sandbox-runner' '/home/o'\\''k/j'\n"
        );
    }

    #[test]
    fn shared_scripts() {
        let r = Path::new("/r");
        let one = shared_script(r, &[vec!["/h/a".into(), "/h/b".into()]]);
        assert_eq!(one, "#!/bin/sh\nexec '/r' batch '/h/a' '/h/b'\n");
        let two = shared_script(r, &[vec!["/h/a".into(), "/h/c".into()], vec!["/h/b".into()]]);
        assert!(two.starts_with("#!/bin/sh\n#SBATCH --array=0-1\n"), "{two}");
        assert!(two.contains("0) exec '/r' batch '/h/a' '/h/c' ;;\n1) exec '/r' batch '/h/b' ;;\n"), "{two}");
    }

    #[test]
    fn slurm_times() {
        assert_eq!(parse_slurm_time("infinite"), Ok(None));
        assert_eq!(parse_slurm_time("UNLIMITED"), Ok(None));
        assert_eq!(parse_slurm_time("5"), Ok(Some(300)));
        assert_eq!(parse_slurm_time("30:00"), Ok(Some(1800)));
        assert_eq!(parse_slurm_time("2:00:00"), Ok(Some(7200)));
        assert_eq!(parse_slurm_time("1-00:00:00"), Ok(Some(86400)));
        assert_eq!(parse_slurm_time("1-2"), Ok(Some(93600)));
        assert_eq!(parse_slurm_time("1-2:30"), Ok(Some(95400)));
        assert!(parse_slurm_time("").is_err());
        assert!(parse_slurm_time("a:b").is_err());
        assert!(parse_slurm_time("1:2:3:4").is_err());
    }

    #[test]
    fn sinfo_lines() {
        let out = "delegate*|1|2:00:00|idle\nother|3|infinite|alloc\nother|2|infinite|down*\nother|1|infinite|drain\njunk\n";
        assert_eq!(
            parse_sinfo(out, None),
            Some(PartitionInfo { name: "delegate".into(), nodes: 1, max_time_secs: Some(7200) })
        );
        assert_eq!(
            parse_sinfo(out, Some("other")),
            Some(PartitionInfo { name: "other".into(), nodes: 3, max_time_secs: None })
        );
        assert_eq!(parse_sinfo(out, Some("nope")), None);
        assert_eq!(parse_sinfo("", None), None);
    }

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
            .cancel(&["-c".into(), "echo '' >&2; echo 'first line' >&2; echo second >&2; exit 3".into()])
            .unwrap_err();
        assert_eq!(e.to_string(), "/bin/sh failed: first line");
    }
}

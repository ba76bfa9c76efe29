//! Parsers of what Slurm's tools print: pure functions, tested without a
//! cluster, that never panic on odd output (junk lines are skipped with a
//! warning). Slurm's state names are parsed here, once, into [`SlurmState`].

use std::collections::HashMap;

use super::SlurmError;

/// A Slurm job state, as `squeue --format=%T` names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SlurmState {
    Pending,
    Configuring,
    Requeued,
    RequeueHold,
    RequeueFed,
    ResvDelHold,
    Running,
    Completing,
    Suspended,
    Stopped,
    Signaling,
    StageOut,
    Resizing,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    Preempted,
    OutOfMemory,
    BootFail,
    Deadline,
    Revoked,
    SpecialExit,
    /// A state this program does not know (a newer Slurm's): active.
    Other(String),
}

impl SlurmState {
    /// The state of a Slurm state name; unknown names are kept as `Other`.
    pub fn parse(name: &str) -> SlurmState {
        use SlurmState::*;
        match name {
            "PENDING" => Pending,
            "CONFIGURING" => Configuring,
            "REQUEUED" => Requeued,
            "REQUEUE_HOLD" => RequeueHold,
            "REQUEUE_FED" => RequeueFed,
            "RESV_DEL_HOLD" => ResvDelHold,
            "RUNNING" => Running,
            "COMPLETING" => Completing,
            "SUSPENDED" => Suspended,
            "STOPPED" => Stopped,
            "SIGNALING" => Signaling,
            "STAGE_OUT" => StageOut,
            "RESIZING" => Resizing,
            "COMPLETED" => Completed,
            "FAILED" => Failed,
            "CANCELLED" => Cancelled,
            "TIMEOUT" => Timeout,
            "NODE_FAIL" => NodeFail,
            "PREEMPTED" => Preempted,
            "OUT_OF_MEMORY" => OutOfMemory,
            "BOOT_FAIL" => BootFail,
            "DEADLINE" => Deadline,
            "REVOKED" => Revoked,
            "SPECIAL_EXIT" => SpecialExit,
            other => Other(other.to_owned()),
        }
    }

    /// Slurm's name of the state.
    pub fn as_str(&self) -> &str {
        use SlurmState::*;
        match self {
            Pending => "PENDING",
            Configuring => "CONFIGURING",
            Requeued => "REQUEUED",
            RequeueHold => "REQUEUE_HOLD",
            RequeueFed => "REQUEUE_FED",
            ResvDelHold => "RESV_DEL_HOLD",
            Running => "RUNNING",
            Completing => "COMPLETING",
            Suspended => "SUSPENDED",
            Stopped => "STOPPED",
            Signaling => "SIGNALING",
            StageOut => "STAGE_OUT",
            Resizing => "RESIZING",
            Completed => "COMPLETED",
            Failed => "FAILED",
            Cancelled => "CANCELLED",
            Timeout => "TIMEOUT",
            NodeFail => "NODE_FAIL",
            Preempted => "PREEMPTED",
            OutOfMemory => "OUT_OF_MEMORY",
            BootFail => "BOOT_FAIL",
            Deadline => "DEADLINE",
            Revoked => "REVOKED",
            SpecialExit => "SPECIAL_EXIT",
            Other(name) => name,
        }
    }

    /// Where the state is in a job's life. Unknown states are active: a job
    /// is only declared lost on a state Slurm documents as final.
    pub fn phase(&self) -> SlurmPhase {
        use SlurmState::*;
        match self {
            Pending | Configuring | Requeued | RequeueHold | RequeueFed | ResvDelHold => SlurmPhase::Queued,
            Completed | Failed | Cancelled | Timeout | NodeFail | Preempted | OutOfMemory | BootFail | Deadline
            | Revoked | SpecialExit => SlurmPhase::Ended,
            Running | Completing | Suspended | Stopped | Signaling | StageOut | Resizing | Other(_) => {
                SlurmPhase::Active
            }
        }
    }
}

impl std::fmt::Display for SlurmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `squeue` says about one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmJob {
    pub state: SlurmState,
    /// Slurm's reason, e.g. `Priority`, `Resources`, `None`.
    pub reason: String,
    /// The nodes Slurm gave it (`worker1`, `worker[1-2]`), empty while it
    /// waits.
    pub nodes: String,
    /// While it waits: when Slurm's backfill scheduler expects it to start
    /// (seconds since the epoch; from the time limits of the jobs ahead, so
    /// a latest start unless others arrive first), when it has one.
    pub expected_start: Option<u64>,
    /// When it was submitted, or last requeued (seconds since the epoch),
    /// when squeue said.
    pub submitted: Option<u64>,
    /// While it waits: how many waiting jobs Slurm will start before it,
    /// when the place helper told (`crate::place`; students cannot see
    /// other users' jobs).
    pub ahead: Option<u32>,
    /// While it waits: when it will likely start (seconds since the epoch),
    /// the place helper's estimate from the running jobs and how long jobs
    /// lasted lately, when it could make one.
    pub likely_start: Option<u64>,
    /// While it waits: the place helper answered from a read of the queue
    /// begun before this job was submitted; its place comes with the next
    /// read.
    pub place_coming: bool,
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

/// A time limit that is none of Slurm's formats.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a Slurm time limit")]
pub struct BadSlurmTime(pub String);

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
pub fn parse_slurm_time(s: &str) -> Result<Option<u64>, BadSlurmTime> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("infinite") || s.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    let bad = || BadSlurmTime(s.to_owned());
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
        let usable = ![
            "down", "drain", "fail", "maint", "unk", "boot", "futr", "inval", "npc", "plnd", "pow",
        ]
        .iter()
        .any(|bad| {
            state
                .trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-'])
                .starts_with(bad)
        });
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

/// Parses `squeue --noheader --format='%i|%T|%N|%r|%S|%V'` output (the last two
/// optional) into a map from
/// Slurm job id (`123`, or `123_4` for an array element) to state, nodes
/// and reason (the rest of the line). Blank lines are ignored; junk lines
/// are skipped with a warning.
pub fn parse_squeue(out: &str) -> HashMap<String, SlurmJob> {
    let mut jobs = HashMap::new();
    for line in out.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.splitn(4, '|');
        let (id, state, nodes, rest) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(i), Some(s), n, r) => (i.trim(), s.trim(), n.unwrap_or("").trim(), r.unwrap_or("").trim()),
            _ => {
                tracing::warn!(line, "skipping an squeue line that is not id|state|nodes|reason|start");
                continue;
            }
        };
        let (reason, expected_start, submitted) = reason_and_times(rest);
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
                state: SlurmState::parse(state),
                reason: reason.to_owned(),
                nodes: nodes.to_owned(),
                expected_start,
                submitted,
                ahead: None,
                likely_start: None,
                place_coming: false,
            },
        );
    }
    jobs
}

/// The reason and, after it, the times squeue printed (`%r|%S|%V`, or
/// `%r|%S`): the reason, the expected start and the submit time. The times
/// are the last fields when they are times (a reason may hold the
/// separator).
fn reason_and_times(rest: &str) -> (&str, Option<u64>, Option<u64>) {
    let Some((before, last)) = rest.rsplit_once('|').filter(|(_, t)| is_start_field(t)) else {
        return (rest, None, None);
    };
    match before.rsplit_once('|') {
        Some((r, st)) if is_start_field(st) => (r.trim(), expected_start(st), expected_start(last)),
        _ => (before.trim(), expected_start(last), None),
    }
}

/// Whether `f` is what squeue prints for `%S` (seconds, `N/A`, `Unknown`).
fn is_start_field(f: &str) -> bool {
    let f = f.trim();
    f.is_empty() || f == "N/A" || f == "Unknown" || (f.len() <= 12 && f.bytes().all(|b| b.is_ascii_digit()))
}

/// squeue's `%S` under `SLURM_TIME_FORMAT=%s`: seconds since the epoch, or
/// `N/A`/`Unknown`/0 when Slurm has no start time for the job.
/// (`field` passed [`is_start_field`]: bounded.)
fn expected_start(field: &str) -> Option<u64> {
    field.trim().parse().ok().filter(|&t| t > 0)
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
/// is how squeue shows elements that have not started yet. A whole array
/// `123` (a map's allocations) is its liveliest element: a running one,
/// else a queued one, else one that ended (a cancelled one first).
pub fn lookup<'a>(queue: &'a HashMap<String, SlurmJob>, id: &str) -> Option<&'a SlurmJob> {
    if let Some(j) = queue.get(id) {
        return Some(j);
    }
    let Some((base, task)) = id.split_once('_') else {
        let prefix = format!("{id}_");
        return queue
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .min_by_key(|(k, j)| (liveliness(j), k.as_str()))
            .map(|(_, j)| j);
    };
    let task: u64 = task.parse().ok()?;
    let prefix = format!("{base}_[");
    queue.iter().find_map(|(k, j)| {
        let inner = k.strip_prefix(&prefix)?.strip_suffix(']')?;
        array_spec_contains(inner, task).then_some(j)
    })
}

/// The order in which the elements of an array speak for it (lowest first).
fn liveliness(j: &SlurmJob) -> u8 {
    match (j.state.phase(), &j.state) {
        (SlurmPhase::Active, _) => 0,
        (SlurmPhase::Queued, _) => 1,
        (SlurmPhase::Ended, SlurmState::Cancelled) => 2,
        (SlurmPhase::Ended, _) => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_array_is_its_liveliest_element() {
        let q = parse_squeue("7_0|COMPLETED|w1|None\n7_1|RUNNING|w2|None\n7_[2-3]|PENDING||Resources\n8_0|COMPLETED|w1|None\n8_[1]|PENDING||Priority\n9_0|COMPLETED|w1|None\n9_1|CANCELLED|w2|None\n");
        assert_eq!(lookup(&q, "7").map(|j| &j.state), Some(&SlurmState::Running));
        assert_eq!(lookup(&q, "8").map(|j| &j.state), Some(&SlurmState::Pending));
        assert_eq!(lookup(&q, "9").map(|j| &j.state), Some(&SlurmState::Cancelled));
        assert_eq!(lookup(&q, "70"), None, "not another job's elements");
        assert_eq!(lookup(&q, "7_3").map(|j| &j.state), Some(&SlurmState::Pending));
    }

    #[test]
    fn sbatch_parsable() {
        assert_eq!(parse_sbatch_parsable("123\n").unwrap(), "123");
        assert_eq!(parse_sbatch_parsable("123;cluster\n").unwrap(), "123");
        assert_eq!(parse_sbatch_parsable("sbatch: warning: something odd\n77\n").unwrap(), "77");
        for bad in ["", "\n\n", "Submitted batch job 12", ";cluster", "12a"] {
            let r = parse_sbatch_parsable(bad);
            assert!(matches!(&r, Err(SlurmError::NoJobId(out)) if out == bad), "{bad:?}: {r:?}");
        }
    }

    #[test]
    fn squeue_lines() {
        let out = "\n12|PENDING||Priority\n13|RUNNING|worker1|None\n\n14_2|COMPLETED|worker2|None\n15_[3-9]|PENDING||Resources\n\
                   garbage\n|RUNNING||x\n16|running||x\n17|NODE_FAIL|worker1|NodeDown\n18|TIMEOUT\n  19 | CANCELLED | worker1 | None  \n";
        let m = parse_squeue(out);
        assert_eq!(m.len(), 7);
        assert_eq!(
            m["12"],
            SlurmJob {
                state: SlurmState::Pending,
                reason: "Priority".into(),
                nodes: String::new(),
                expected_start: None,
                ahead: None,
                likely_start: None,
                place_coming: false,
                submitted: None,
            }
        );
        assert_eq!(m["13"].state, SlurmState::Running);
        assert_eq!(m["13"].nodes, "worker1");
        assert_eq!(m["14_2"].state, SlurmState::Completed);
        assert_eq!(m["15_[3-9]"].reason, "Resources");
        assert_eq!(m["17"].reason, "NodeDown");
        assert_eq!(
            m["18"],
            SlurmJob {
                state: SlurmState::Timeout,
                reason: "".into(),
                nodes: String::new(),
                expected_start: None,
                ahead: None,
                likely_start: None,
                place_coming: false,
                submitted: None,
            }
        );
        assert_eq!(m["19"].state, SlurmState::Cancelled);
        assert!(!m.contains_key("16"));
        // %S under SLURM_TIME_FORMAT=%s: a pending job's expected start.
        let m = parse_squeue(
            "20|PENDING||Resources|1795929371
21|PENDING||Priority|N/A
22|RUNNING|w1|None|0
",
        );
        assert_eq!(m["20"].expected_start, Some(1_795_929_371));
        assert_eq!(m["20"].reason, "Resources");
        assert_eq!(m["21"].expected_start, None);
        assert_eq!(m["22"].expected_start, None);
        assert!(parse_squeue("").is_empty());
        // Reasons may contain the separator.
        assert_eq!(parse_squeue("5|PENDING||a|b")["5"].reason, "a|b");
        assert_eq!(parse_squeue("5|PENDING||a|b|N/A")["5"].reason, "a|b");
        // ... and %V after %S: when it was submitted.
        let j = &parse_squeue("6|PENDING||Priority|N/A|1795929300")["6"];
        assert_eq!(
            (j.reason.as_str(), j.expected_start, j.submitted),
            ("Priority", None, Some(1_795_929_300))
        );
        let j = &parse_squeue("7|PENDING||a|b|1795929371|1795929300")["7"];
        assert_eq!(
            (j.reason.as_str(), j.expected_start, j.submitted),
            ("a|b", Some(1_795_929_371), Some(1_795_929_300))
        );
    }

    #[test]
    fn array_records() {
        let q = parse_squeue("26_[1-49%4]|PENDING||JobArrayTaskLimit\n26_0|RUNNING|worker1|None\n30_[1,3,5-9]|PENDING||Priority\n31_[0-10:2]|PENDING||None\n");
        assert_eq!(lookup(&q, "26_0").unwrap().state, SlurmState::Running);
        assert_eq!(lookup(&q, "26_1").unwrap().state, SlurmState::Pending);
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

    fn phase(name: &str) -> SlurmPhase {
        SlurmState::parse(name).phase()
    }

    #[test]
    fn phases() {
        assert_eq!(phase("PENDING"), SlurmPhase::Queued);
        assert_eq!(phase("CONFIGURING"), SlurmPhase::Queued);
        assert_eq!(phase("RUNNING"), SlurmPhase::Active);
        assert_eq!(phase("COMPLETING"), SlurmPhase::Active);
        assert_eq!(phase("SUSPENDED"), SlurmPhase::Active);
        for s in [
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "PREEMPTED",
            "OUT_OF_MEMORY",
            "BOOT_FAIL",
            "DEADLINE",
        ] {
            assert_eq!(phase(s), SlurmPhase::Ended, "{s}");
        }
        assert_eq!(phase("SOMETHING_NEW"), SlurmPhase::Active);
        // Every name parses to the state that prints it.
        for s in [
            "PENDING",
            "REQUEUE_HOLD",
            "RUNNING",
            "STAGE_OUT",
            "NODE_FAIL",
            "SPECIAL_EXIT",
            "SOMETHING_NEW",
        ] {
            assert_eq!(SlurmState::parse(s).as_str(), s);
        }
        assert_eq!(SlurmState::parse("SOMETHING_NEW"), SlurmState::Other("SOMETHING_NEW".into()));
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
        for bad in ["", "a:b", "1:2:3:4"] {
            assert_eq!(parse_slurm_time(bad), Err(BadSlurmTime(bad.to_owned())));
        }
    }

    #[test]
    fn sinfo_lines() {
        let out =
            "delegate*|1|2:00:00|idle\nother|3|infinite|alloc\nother|2|infinite|down*\nother|1|infinite|drain\njunk\n";
        assert_eq!(
            parse_sinfo(out, None),
            Some(PartitionInfo {
                name: "delegate".into(),
                nodes: 1,
                max_time_secs: Some(7200)
            })
        );
        assert_eq!(
            parse_sinfo(out, Some("other")),
            Some(PartitionInfo {
                name: "other".into(),
                nodes: 3,
                max_time_secs: None
            })
        );
        assert_eq!(parse_sinfo(out, Some("nope")), None);
        assert_eq!(parse_sinfo("", None), None);
    }
}

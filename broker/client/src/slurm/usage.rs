//! The instructor's view of the cluster, from Slurm's accounting: per
//! student, how many calls they made, how much node-time their allocations
//! held and how many ended badly, by reason (`sacct`), and who waits for what
//! right now (`squeue`). Both read every user's jobs, which Slurm shows only
//! to root, SlurmUser and accounting operators/coordinators (PrivateData).
//!
//! The parsers are pure functions over the tools' parsable output, tested
//! without a cluster.

use std::collections::BTreeMap;

/// The `sacct` fields [`parse_sacct`] reads, in order (`--parsable2`:
/// `|`-separated, no trailing `|`). None of them is text a student chooses:
/// not JobName (`sbatch -J 'x|COMPLETED|...'`, or `scontrol update
/// JobName=` later, would forge fields and whole lines of other students);
/// Comment, last, is set by the site's gate (job_submit.lua) and no user
/// may change it.
pub const SACCT_FORMAT: &str = "JobID,User,State,ElapsedRaw,NNodes,NodeList,Comment";

/// Fields of [`SACCT_FORMAT`].
const SACCT_FIELDS: usize = 7;

/// The `squeue` format [`parse_queue`] reads: job id, user, state, reason,
/// priority, time waited or run, time limit, submit time.
pub const SQUEUE_FORMAT: &str = "%i|%u|%T|%r|%Q|%M|%l|%V";

/// The comment delegate's client gives each submission (`sbatch
/// --comment`), so that the accounting can count calls, not allocations: a
/// map's calls share a few allocations. Followed by the number of calls.
pub const CALLS_COMMENT: &str = "delegate:calls=";

/// One allocation (job or array element) as `sacct -X` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcctJob {
    /// `123`, or `123_4` for an array element.
    pub job_id: String,
    pub user: String,
    /// First word of Slurm's state (`CANCELLED by 0` -> `CANCELLED`).
    pub state: String,
    pub elapsed_secs: u64,
    pub nodes: u64,
    /// False for a job that never got a node (refused at submission,
    /// cancelled while pending): sacct's NodeList is "None assigned".
    pub started: bool,
    /// Calls of the whole submission, from delegate's comment.
    pub calls: Option<u64>,
}

impl AcctJob {
    /// The submission's id: the job id without the array element.
    pub fn base_id(&self) -> &str {
        self.job_id.split('_').next().unwrap_or(&self.job_id)
    }
}

/// Parses `sacct --allusers --allocations --noheader --parsable2
/// --format=SACCT_FORMAT` output. Lines with too few fields or a bad number
/// are skipped with a warning; never panics.
pub fn parse_sacct(out: &str) -> Vec<AcctJob> {
    let mut jobs = Vec::new();
    for line in out.lines() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_sacct_line(line) {
            Some(j) => jobs.push(j),
            None => tracing::warn!(line, "sacct: skipping a line it cannot read"),
        }
    }
    jobs
}

/// One `sacct` line, or `None` when a field is not what Slurm writes there
/// (a job id of digits and `_`, a user name without spaces, numbers).
fn parse_sacct_line(line: &str) -> Option<AcctJob> {
    let f: Vec<&str> = line.splitn(SACCT_FIELDS, '|').collect();
    if f.len() < SACCT_FIELDS {
        return None;
    }
    let job_id = f[0].trim();
    let user = f[1].trim();
    let id_ok = !job_id.is_empty() && job_id.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    if !id_ok || user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return None;
    }
    let elapsed_secs = f[3].trim().parse::<u64>().ok()?;
    let nodes = f[4].trim().parse::<u64>().ok()?;
    let nodes_list = f[5].trim();
    Some(AcctJob {
        job_id: job_id.to_owned(),
        user: user.to_owned(),
        state: f[2].split_whitespace().next().unwrap_or("UNKNOWN").to_owned(),
        elapsed_secs,
        nodes,
        started: !matches!(nodes_list, "" | "None assigned"),
        calls: f[6]
            .trim()
            .strip_prefix(CALLS_COMMENT)
            .map(|n| n.split(|c: char| !c.is_ascii_digit()).next().unwrap_or(""))
            .and_then(|n| n.parse().ok()),
    })
}

/// One student's use of the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UserUsage {
    pub user: String,
    /// Submissions (sbatch calls) that Slurm accepted or recorded.
    pub submissions: u64,
    /// Calls: from delegate's comment per submission, else one per
    /// allocation.
    pub calls: u64,
    /// Allocations (jobs and array elements).
    pub allocations: u64,
    /// Node-seconds the allocations held (elapsed x nodes).
    pub node_secs: u64,
    /// Allocations that ended badly, by Slurm state (FAILED, TIMEOUT,
    /// CANCELLED, NODE_FAIL, OUT_OF_MEMORY, ...; REFUSED: never started and
    /// not cancelled). Running and pending ones are not counted.
    pub failures: BTreeMap<String, u64>,
    /// Allocations still pending or running.
    pub active: u64,
    /// Runs of an allocation after its first (sacct `--duplicates`):
    /// Slurm queued it again, for a call's new attempt after its node was
    /// lost (that earlier run is a NODE_FAIL failure), a requeue, or a
    /// map's allocation stepping aside (REQUEUED).
    pub runs_again: u64,
}

/// Per-user usage from `sacct` records, sorted by user.
pub fn summarize(jobs: &[AcctJob]) -> Vec<UserUsage> {
    let mut by_user: BTreeMap<&str, UserUsage> = BTreeMap::new();
    let mut seen: std::collections::HashSet<(&str, &str)> = std::collections::HashSet::new();
    let mut runs: std::collections::HashSet<(&str, &str)> = std::collections::HashSet::new();
    for j in jobs {
        let u = by_user.entry(&j.user).or_insert_with(|| UserUsage {
            user: j.user.clone(),
            ..UserUsage::default()
        });
        u.allocations += 1;
        u.node_secs = u.node_secs.saturating_add(j.elapsed_secs.saturating_mul(j.nodes.max(1)));
        if !runs.insert((&j.user, &j.job_id)) {
            u.runs_again += 1;
        }
        let first_of_submission = seen.insert((&j.user, j.base_id()));
        if first_of_submission {
            u.submissions += 1;
        }
        match j.calls {
            Some(n) if first_of_submission => u.calls += n,
            Some(_) => {}
            None => u.calls += 1,
        }
        match j.state.as_str() {
            // (a run Slurm took back: its job runs again, counted there)
            "COMPLETED" | "REQUEUED" => {}
            "PENDING" | "RUNNING" | "RESIZING" | "SUSPENDED" | "COMPLETING" => u.active += 1,
            "FAILED" if !j.started => *u.failures.entry("REFUSED".into()).or_default() += 1,
            other => *u.failures.entry(other.to_owned()).or_default() += 1,
        }
    }
    by_user.into_values().collect()
}

/// One line of `squeue` as the admin's queue view reads it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QueuedJob {
    pub job_id: String,
    pub user: String,
    pub state: String,
    pub reason: String,
    pub priority: u64,
    /// Time running (running jobs) as squeue prints it.
    pub time: String,
    pub time_limit: String,
    /// Submit time (ISO 8601, local).
    pub submitted: String,
}

impl QueuedJob {
    /// How long it has run, in seconds (None: not a time squeue prints).
    pub fn elapsed_secs(&self) -> Option<u64> {
        super::parse_slurm_time(&self.time).ok().flatten()
    }

    /// Its time limit, in seconds (None: UNLIMITED, or not a time).
    pub fn limit_secs(&self) -> Option<u64> {
        super::parse_slurm_time(&self.time_limit).ok().flatten()
    }
}

/// Parses `squeue --all --array --noheader --format=SQUEUE_FORMAT`; bad
/// lines are skipped with a warning. Sorted: running first, then pending by
/// priority (highest first, as Slurm will start them).
pub fn parse_queue(out: &str) -> Vec<QueuedJob> {
    let mut jobs: Vec<QueuedJob> = out
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|line| {
            let f: Vec<&str> = line.split('|').map(str::trim).collect();
            let parsed = (f.len() == 8)
                .then(|| f[4].parse::<u64>().ok())
                .flatten()
                .map(|priority| QueuedJob {
                    job_id: f[0].to_owned(),
                    user: f[1].to_owned(),
                    state: f[2].to_owned(),
                    reason: f[3].to_owned(),
                    priority,
                    time: f[5].to_owned(),
                    time_limit: f[6].to_owned(),
                    submitted: f[7].to_owned(),
                });
            if parsed.is_none() {
                tracing::warn!(line, "squeue: skipping a line it cannot read");
            }
            parsed
        })
        .collect();
    jobs.sort_by(|a, b| {
        (a.state != "RUNNING", std::cmp::Reverse(a.priority), &a.submitted, &a.job_id).cmp(&(
            b.state != "RUNNING",
            std::cmp::Reverse(b.priority),
            &b.submitted,
            &b.job_id,
        ))
    });
    jobs
}

/// The group whose members are the course's administrators beside root
/// (build_cluster.sh's DELEGATE_ADMIN_GROUP, made by the lockdown).
pub const ADMIN_GROUP: &str = "delegate-admin";

/// Whether this process may use the instructor's view: root, or a member of
/// `group`. This is the command's courtesy check only: what the tools show
/// is decided by Slurm (PrivateData shows others' records only to root,
/// SlurmUser and accounting operators/coordinators).
pub fn caller_is_admin(group: &str) -> bool {
    use nix::unistd::{getegid, geteuid, getgroups, Group};
    if geteuid().is_root() {
        return true;
    }
    let Ok(Some(g)) = Group::from_name(group) else {
        return false;
    };
    getegid() == g.gid || getgroups().is_ok_and(|gs| gs.contains(&g.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeues_clocks_are_read_and_its_words_are_not() {
        let at = |time: &str, limit: &str| QueuedJob {
            job_id: "1".into(),
            user: "ann".into(),
            state: "RUNNING".into(),
            reason: "None".into(),
            priority: 1,
            time: time.into(),
            time_limit: limit.into(),
            submitted: String::new(),
        };
        assert_eq!(at("0:07", "10:00").elapsed_secs(), Some(7));
        assert_eq!(at("12:34", "10:00").elapsed_secs(), Some(754));
        assert_eq!(at("1:00:00", "1:00:00").limit_secs(), Some(3_600));
        assert_eq!(at("2-03:04:05", "").elapsed_secs(), Some(2 * 86_400 + 3 * 3_600 + 4 * 60 + 5));
        for bad in ["UNLIMITED", "INVALID", "N/A", "", "1:2:3:4"] {
            assert_eq!(at(bad, bad).elapsed_secs(), None, "{bad}");
            assert_eq!(at(bad, bad).limit_secs(), None, "{bad}");
        }
    }

    // Real `sacct --allusers -X --noheader --parsable2 --format=...` output
    // of the development cluster, plus odd lines.
    const SACCT: &str = "\
50000000|root|COMPLETED|1|1|acctnode|
50000001|delegate-alice|FAILED|0|1|None assigned|
50000007|delegate-alice|CANCELLED by 0|12|1|acctnode|
50000010_0|acct-stud1|COMPLETED|30|1|acctnode|delegate:calls=3
50000010_1|acct-stud1|TIMEOUT|60|1|acctnode|delegate:calls=3
50000011|acct-stud1|NODE_FAIL|5|2|worker[1-2]|delegate:calls=1
50000012|acct-stud1|PENDING|0|1|None assigned|delegate:calls=1|with|bars
garbage
50000013|acct-stud1|RUNNING|notanumber|1|acctnode|
x y|acct-stud1|RUNNING|1|1|acctnode|
50000014|acct stud1|RUNNING|1|1|acctnode|
";

    #[test]
    fn sacct_lines_are_read() {
        let jobs = parse_sacct(SACCT);
        assert_eq!(jobs.len(), 7);
        assert_eq!(jobs[1].state, "FAILED");
        assert!(!jobs[1].started);
        assert_eq!(jobs[2].state, "CANCELLED");
        assert_eq!(jobs[3].base_id(), "50000010");
        assert_eq!(jobs[3].calls, Some(3));
        assert_eq!(jobs[6].calls, Some(1));
        assert_eq!(jobs[0].calls, None);
    }

    #[test]
    fn usage_per_student() {
        let u = summarize(&parse_sacct(SACCT));
        let names: Vec<&str> = u.iter().map(|x| x.user.as_str()).collect();
        assert_eq!(names, ["acct-stud1", "delegate-alice", "root"]);
        let s = &u[0];
        // One shared submission of 3 calls in 2 allocations, one single call,
        // one pending call.
        assert_eq!((s.submissions, s.calls, s.allocations), (3, 5, 4));
        assert_eq!(s.node_secs, 30 + 60 + 5 * 2);
        assert_eq!(s.failures.get("TIMEOUT"), Some(&1));
        assert_eq!(s.failures.get("NODE_FAIL"), Some(&1));
        assert_eq!(s.active, 1);
        assert_eq!(s.runs_again, 0);
        let a = &u[1];
        assert_eq!(a.failures.get("REFUSED"), Some(&1));
        assert_eq!(a.failures.get("CANCELLED"), Some(&1));
        assert_eq!(a.calls, 2);
    }

    /// Issue 52: a call run again after its node was lost is one call,
    /// two runs of its allocation (the lost one a NODE_FAIL), node time
    /// for both; a map's allocation that stepped aside is one allocation
    /// run twice, neither active nor failed.
    #[test]
    fn runs_again_are_counted_once_per_run() {
        let out = "\
70|bea|NODE_FAIL|30|1|worker2|delegate:calls=1
70|bea|COMPLETED|20|1|worker1|delegate:calls=1
71_0|bea|REQUEUED|12|1|worker1|delegate:calls=4
71_0|bea|COMPLETED|40|1|worker1|delegate:calls=4
";
        let u = summarize(&parse_sacct(out));
        let b = &u[0];
        assert_eq!((b.calls, b.submissions, b.allocations, b.runs_again), (5, 2, 4, 2));
        assert_eq!(b.node_secs, 30 + 20 + 12 + 40);
        assert_eq!(b.failures.get("NODE_FAIL"), Some(&1));
        assert_eq!((b.failures.len(), b.active), (1, 0));
    }

    #[test]
    fn queue_order_is_running_then_priority() {
        let out = "\
7|bob|PENDING|Priority|5000|0:00|10:00|2026-11-23T19:00:00
8|alice|PENDING|Resources|9000|0:00|10:00|2026-11-23T19:01:00
6|carol|RUNNING|None|100|1:02|10:00|2026-11-23T18:59:00
bad|line
9|dave|PENDING|Priority|nope|0:00|10:00|2026-11-23T19:02:00
";
        let q = parse_queue(out);
        let ids: Vec<&str> = q.iter().map(|j| j.job_id.as_str()).collect();
        assert_eq!(ids, ["6", "8", "7"]);
        assert_eq!(q[1].reason, "Resources");
    }
}

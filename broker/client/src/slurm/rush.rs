//! The rush as the instructor's page and `delegate admin rush` show it: one
//! snapshot of the course's cluster from Slurm's own data on the manager:
//! the queue (every user's jobs, `squeue`), the nodes (`sinfo`), and, when
//! asked, node time per user since a moment (`sacct`). Every user's jobs
//! only for root, SlurmUser and accounting operators (PrivateData): the
//! command is the instructor's.
//!
//! The parser and the summary are pure functions over the tools' output,
//! tested without a cluster.

use serde::Serialize;

use super::nodes::NodeRow;
use super::usage::UserUsage;

/// The `squeue` format [`parse_queue`] reads, with `SLURM_TIME_FORMAT=%s`:
/// job id, user, state, submit time (seconds since the epoch).
pub const SQUEUE_FORMAT: &str = "%i|%u|%T|%V";

/// At most this many queue lines are read.
const MAX_JOBS: usize = 200_000;

/// How many students the page lists by longest wait and by node time.
pub const TOP: usize = 10;

/// One job (or array element) of the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueLine {
    pub user: String,
    pub running: bool,
    /// Submit time, seconds since the epoch.
    pub submitted: u64,
}

/// Parses `squeue --all --array --noheader --format=SQUEUE_FORMAT` (with
/// `SLURM_TIME_FORMAT=%s`): pending and running lines; others (completing,
/// configuring) count as running, bad lines are skipped.
pub fn parse_queue(out: &str) -> Vec<QueueLine> {
    out.lines()
        .take(MAX_JOBS)
        .filter_map(|line| {
            let f: Vec<&str> = line.split('|').map(str::trim).collect();
            let [id, user, state, submitted] = f.as_slice() else {
                return None;
            };
            let id_ok = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || b == b'_');
            let user_ok = !user.is_empty() && !user.chars().any(|c| c.is_whitespace() || c.is_control());
            if !(id_ok && user_ok) {
                return None;
            }
            Some(QueueLine {
                user: (*user).to_owned(),
                running: *state != "PENDING",
                submitted: submitted.parse().ok()?,
            })
        })
        .collect()
}

/// A node that is out, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeOut {
    pub node: String,
    pub state: String,
    pub reason: String,
}

/// One student's longest wait now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Waiting {
    pub user: String,
    /// Their jobs (or array elements) waiting now.
    pub pending: u64,
    /// Seconds their oldest waiting job has waited.
    pub longest_secs: u64,
}

/// Node time a student's allocations held since the window's start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Heavy {
    pub user: String,
    pub node_secs: u64,
    pub allocations: u64,
}

/// The rush at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rush {
    /// Seconds since the epoch.
    pub at: u64,
    /// Jobs (array elements) running and waiting.
    pub running: u64,
    pub pending: u64,
    /// Students with a job waiting.
    pub students_waiting: u64,
    /// The partition's nodes: all, busy (allocated, mixed, completing),
    /// usable and free (idle, also powered down), out (down, drained, failing).
    pub nodes: u64,
    pub busy: u64,
    pub free: u64,
    pub out: Vec<NodeOut>,
    /// Waits of the jobs waiting now, seconds: median, 90th percentile,
    /// longest (0 when none waits).
    pub wait_p50_secs: u64,
    pub wait_p90_secs: u64,
    pub wait_max_secs: u64,
    /// The students waiting longest, longest first (at most [`TOP`]).
    pub longest_waits: Vec<Waiting>,
    /// The heaviest users by node time since `since` (at most [`TOP`]);
    /// None when the accounting was not asked.
    pub heaviest: Option<Vec<Heavy>>,
    pub since: Option<String>,
}

/// The `q`-quantile (0..=1) of sorted `v`, nearest rank; 0 when empty.
fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The snapshot from the queue, the partition's nodes and (optionally) the
/// usage since `since`, at `now`.
pub fn summarize(queue: &[QueueLine], nodes: &[NodeRow], usage: Option<(&[UserUsage], &str)>, now: u64) -> Rush {
    let mut waits: Vec<u64> = queue
        .iter()
        .filter(|j| !j.running)
        .map(|j| now.saturating_sub(j.submitted))
        .collect();
    waits.sort_unstable();
    let mut per: std::collections::BTreeMap<&str, Waiting> = Default::default();
    for j in queue.iter().filter(|j| !j.running) {
        let w = per.entry(j.user.as_str()).or_insert_with(|| Waiting {
            user: j.user.clone(),
            pending: 0,
            longest_secs: 0,
        });
        w.pending += 1;
        w.longest_secs = w.longest_secs.max(now.saturating_sub(j.submitted));
    }
    let students_waiting = per.len() as u64;
    let mut longest: Vec<Waiting> = per.into_values().collect();
    longest.sort_by(|a, b| b.longest_secs.cmp(&a.longest_secs).then_with(|| a.user.cmp(&b.user)));
    longest.truncate(TOP);
    let busy = nodes
        .iter()
        .filter(|n| matches!(n.base_state().as_str(), "allocated" | "mixed" | "completing"))
        .count() as u64;
    let free = nodes
        .iter()
        .filter(|n| matches!(n.base_state().as_str(), "idle" | "planned"))
        .count() as u64;
    let out = nodes
        .iter()
        .filter(|n| !n.usable())
        .map(|n| NodeOut {
            node: n.name.clone(),
            state: n.state.clone(),
            reason: n.reason.clone(),
        })
        .collect();
    let heaviest = usage.map(|(users, _)| {
        let mut h: Vec<Heavy> = users
            .iter()
            .filter(|u| u.node_secs > 0)
            .map(|u| Heavy {
                user: u.user.clone(),
                node_secs: u.node_secs,
                allocations: u.allocations,
            })
            .collect();
        h.sort_by(|a, b| b.node_secs.cmp(&a.node_secs).then_with(|| a.user.cmp(&b.user)));
        h.truncate(TOP);
        h
    });
    Rush {
        at: now,
        running: queue.iter().filter(|j| j.running).count() as u64,
        pending: waits.len() as u64,
        students_waiting,
        nodes: nodes.len() as u64,
        busy,
        free,
        out,
        wait_p50_secs: quantile(&waits, 0.5),
        wait_p90_secs: quantile(&waits, 0.9),
        wait_max_secs: waits.last().copied().unwrap_or(0),
        longest_waits: longest,
        heaviest,
        since: usage.map(|(_, s)| s.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::nodes::parse_nodes;

    const NODES: &str = "\
worker1|delegate*|allocated|dlgclass_a|none||
worker2|delegate*|mixed|dlgclass_a|none||
worker3|delegate*|idle~|dlgclass_a|none||
worker4|delegate*|down*|dlgclass_a|Not responding||
worker5|delegate*|drained|dlgclass_a|elastic: cannot start worker worker5||
";

    #[test]
    fn the_queue_is_read_bounded_and_forged_lines_are_skipped() {
        let q = parse_queue(
            "10|ann|RUNNING|1000\n11_2|ben|PENDING|1100\nx|eve|PENDING|1\n12|a b|PENDING|1\n13|eve|PENDING|soon\n14|eve|PENDING|1|extra\n15|cy|COMPLETING|900\n",
        );
        assert_eq!(
            q,
            vec![
                QueueLine {
                    user: "ann".into(),
                    running: true,
                    submitted: 1000
                },
                QueueLine {
                    user: "ben".into(),
                    running: false,
                    submitted: 1100
                },
                QueueLine {
                    user: "cy".into(),
                    running: true,
                    submitted: 900
                },
            ]
        );
    }

    #[test]
    fn the_snapshot_counts_waits_nodes_and_the_heaviest() {
        let line = |user: &str, running, submitted| QueueLine { user: user.into(), running, submitted };
        let q = vec![
            line("ann", true, 0),
            line("ann", false, 900),
            line("ann", false, 700),
            line("ben", false, 990),
            line("cy", false, 400),
        ];
        let nodes = parse_nodes(NODES);
        let use_of = |user: &str, node_secs| UserUsage {
            user: user.into(),
            node_secs,
            allocations: 2,
            ..Default::default()
        };
        let usage = vec![use_of("ann", 50), use_of("ben", 300), use_of("idle", 0)];
        let r = summarize(&q, &nodes, Some((&usage, "now-3hours")), 1000);
        assert_eq!((r.running, r.pending, r.students_waiting), (1, 4, 3));
        assert_eq!((r.nodes, r.busy, r.free), (5, 2, 1));
        let out: Vec<&str> = r.out.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(out, ["worker4", "worker5"]);
        assert_eq!(r.out[0].reason, "Not responding");
        // waits 10, 100, 300, 600: nearest-rank median 100, p90 600
        assert_eq!((r.wait_p50_secs, r.wait_p90_secs, r.wait_max_secs), (100, 600, 600));
        let longest: Vec<(&str, u64, u64)> = r
            .longest_waits
            .iter()
            .map(|w| (w.user.as_str(), w.pending, w.longest_secs))
            .collect();
        assert_eq!(longest, [("cy", 1, 600), ("ann", 2, 300), ("ben", 1, 10)]);
        let heavy: Vec<&str> = r.heaviest.as_ref().unwrap().iter().map(|h| h.user.as_str()).collect();
        assert_eq!(heavy, ["ben", "ann"]);
        assert_eq!(r.since.as_deref(), Some("now-3hours"));
        // Nothing waits, no accounting asked.
        let r = summarize(&q[..1], &nodes, None, 1000);
        assert_eq!((r.pending, r.wait_p50_secs, r.wait_max_secs), (0, 0, 0));
        assert!(r.heaviest.is_none() && r.longest_waits.is_empty());
    }
}

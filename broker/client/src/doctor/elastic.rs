//! `delegate doctor`'s view of elastic workers (docs/elastic.md): Slurm's
//! power saving keeps idle workers powered down and starts them when a job
//! needs them. A job that waits for that is not stuck; this module says so
//! in one sentence, and names a worker that failed to start.
//!
//! The nodes are sinfo's, read by the one parser of its node lines
//! ([`crate::slurm::nodes`]); the caller's waiting jobs are squeue's
//! (untrusted text: unknown lines are skipped, nothing panics on it).

use crate::slurm::nodes::{NodeRow as Node, Power};

/// One of the caller's waiting jobs: `squeue --me -h -t PD,CF -o '%i|%T|%r'`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub id: String,
    pub state: String,
    pub reason: String,
}

pub fn parse_waiting(out: &str) -> Vec<Waiting> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, '|');
            let id = f.next()?.trim();
            let state = f.next()?.trim();
            (!id.is_empty()).then(|| Waiting {
                id: id.chars().take(32).collect(),
                state: state.to_ascii_uppercase(),
                reason: f.next().unwrap_or("").trim().chars().take(80).collect(),
            })
        })
        .collect()
}

/// Names, comma separated (at most 8, then "and N more").
fn names<'a>(it: impl Iterator<Item = &'a str>) -> String {
    let all: Vec<&str> = it.collect();
    let mut s = all.iter().take(8).copied().collect::<Vec<_>>().join(", ");
    if all.len() > 8 {
        s.push_str(&format!(" and {} more", all.len() - 8));
    }
    s
}

/// The doctor's verdict: `None` when no node uses power saving and no job
/// waits for one; else `Ok(sentence)` (all is well, or a job waits for a
/// worker being started) or `Err((problem, fix))` (a worker failed to start).
pub fn explain(nodes: &[Node], waiting: &[Waiting]) -> Option<Result<String, (String, String)>> {
    let failed: Vec<&Node> = nodes
        .iter()
        // DOWN when the start failed; DRAINED once Slurm's power saving has
        // powered it down (power.sh keeps it out until an operator acts).
        .filter(|n| {
            let st = n.base_state();
            (st.starts_with("down") || st.starts_with("drain")) && n.reason.starts_with("elastic:")
        })
        .collect();
    if let Some(f) = failed.first() {
        return Some(Err((
            format!("{} could not be started: {}", f.name, f.reason),
            format!(
                "an operator fixes the cause (build_cluster.sh status) and runs `scontrol update nodename={} state=resume`; other workers still take jobs",
                f.name
            ),
        )));
    }
    let up: Vec<&str> = nodes
        .iter()
        .filter(|n| n.power() == Power::PoweringUp)
        .map(|n| n.name.as_str())
        .collect();
    let down = nodes.iter().filter(|n| n.power() == Power::Down).count();
    let stopping = nodes.iter().filter(|n| n.power() == Power::PoweringDown).count();
    let starting_jobs: Vec<&str> = waiting
        .iter()
        .filter(|w| w.state == "CONFIGURING" || (!up.is_empty() && w.state == "PENDING"))
        .map(|w| w.id.as_str())
        .collect();
    if !starting_jobs.is_empty() {
        let workers = match up.len() {
            0 => "its workers are".to_owned(),
            1 => format!("{} is", up[0]),
            _ => format!("{} are", names(up.iter().copied())),
        };
        return Some(Ok(format!(
            "job {} waits while {workers} being powered up: Slurm starts idle workers on demand, so the first job after a quiet spell waits a minute or two; nothing is wrong",
            names(starting_jobs.iter().copied()),
        )));
    }
    if up.is_empty() && down == 0 && stopping == 0 {
        return None;
    }
    Some(Ok(format!(
        "{} running, {} starting, {stopping} stopping, {down} powered down (started when a job needs them)",
        nodes.iter().filter(|n| n.power() == Power::Up).count(),
        up.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::nodes::{each_node_once, parse_nodes as sinfo_nodes};

    /// "NAME|STATE|REASON" lines as sinfo's node lines in the one format.
    fn parse_nodes(lines: &str) -> Vec<Node> {
        let full: String = lines
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, '|');
                Some(format!("{}|delegate*|{}||{}||\n", f.next()?, f.next()?, f.next().unwrap_or("")))
            })
            .collect();
        each_node_once(sinfo_nodes(&full))
    }

    #[test]
    fn powering_up_job_gets_one_sentence() {
        let nodes = parse_nodes("worker1|idle#|none\nworker2|idle~|none\nworker1|idle#|none\n");
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].power(), Power::PoweringUp);
        assert_eq!(nodes[0].base_state(), "idle");
        assert_eq!(nodes[1].power(), Power::Down);
        let w = parse_waiting("70000001|CONFIGURING|None\n");
        let s = explain(&nodes, &w).unwrap().unwrap();
        assert!(s.starts_with("job 70000001 waits while worker1 is being powered up"), "{s}");
        // Registered already, the job still configuring: the same sentence.
        let s = explain(&parse_nodes("worker1|allocated|none\n"), &w).unwrap().unwrap();
        assert!(
            s.starts_with("job 70000001 waits while its workers are being powered up"),
            "{s}"
        );
    }

    #[test]
    fn quiet_and_failed_clusters() {
        // No power saving at all: nothing to say.
        assert!(explain(&parse_nodes("worker1|idle|none\n"), &[]).is_none());
        let s = explain(&parse_nodes("worker1|idle~|none\nworker2|idle~|none"), &[])
            .unwrap()
            .unwrap();
        assert_eq!(
            s,
            "0 running, 0 starting, 0 stopping, 2 powered down (started when a job needs them)"
        );
        let e = explain(
            &parse_nodes("worker2|down~|elastic: cannot start worker worker2: No such image\n"),
            &[],
        )
        .unwrap()
        .unwrap_err();
        assert!(e.0.contains("worker2 could not be started: elastic: cannot start"), "{}", e.0);
        // Powered down since, kept out (drained) with the same reason.
        let e = explain(
            &parse_nodes(
                "worker1|idle~|none
worker2|drained~|elastic: cannot start worker worker2: No such image
",
            ),
            &[],
        )
        .unwrap()
        .unwrap_err();
        assert!(e.0.starts_with("worker2 could not be started"), "{}", e.0);
        assert!(e.1.contains("nodename=worker2 state=resume"), "{}", e.1);
        // A drain of the operator's own is not a failed start.
        let s = explain(
            &parse_nodes(
                "worker1|drained~|maintenance
",
            ),
            &[],
        )
        .unwrap()
        .expect("an operator's drain is not a failed start");
        assert_eq!(
            s,
            "0 running, 0 starting, 0 stopping, 1 powered down (started when a job needs them)"
        );
        // Garbage is skipped, never a panic.
        assert!(parse_nodes("|\n\u{0}|#\nx").iter().all(|n| !n.name.is_empty()));
        assert!(parse_waiting("\n|x").is_empty());
    }
}

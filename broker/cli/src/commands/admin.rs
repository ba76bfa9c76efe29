//! `delegate admin usage|queue|nodes`: the instructor's view of the course's
//! cluster, from Slurm's accounting (sacct), queue (squeue) and nodes
//! (sinfo: the classes and reports the nodes' agents publish). For root
//! and the admin group only; Slurm itself shows others' records only to
//! root, SlurmUser and accounting operators/coordinators.

use std::io::{self, Write};

use delegate_client::slurm::nodes::NodeRow;
use delegate_client::slurm::usage::{caller_is_admin, summarize, UserUsage, ADMIN_GROUP};
use delegate_client::slurm::Slurm;

use crate::cli::Cli;
use crate::fail::{CliResult, Fail};
use crate::output::print_json;

/// Environment variable naming the admin group (default `delegate-admin`).
pub const ADMIN_GROUP_ENV: &str = "DELEGATE_ADMIN_GROUP";

/// Refuses anyone but root and the admin group's members, in one sentence.
pub(crate) fn require_admin() -> Result<(), Fail> {
    let group = std::env::var(ADMIN_GROUP_ENV)
        .ok()
        .filter(|g| !g.trim().is_empty())
        .unwrap_or_else(|| ADMIN_GROUP.to_owned());
    if caller_is_admin(&group) {
        Ok(())
    } else {
        Err(Fail::new(
            format!(
                "`delegate admin` is for the course's instructors only (root or members of the group {group}); \
                 your own jobs are in `delegate list`"
            ),
            1,
        ))
    }
}

/// A duration in seconds as hours:minutes:seconds.
pub(crate) fn hms(secs: u64) -> String {
    format!("{}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// The failures of one student as `STATE=N STATE=N`, or `-`.
fn failures(u: &UserUsage) -> String {
    if u.failures.is_empty() {
        return "-".to_owned();
    }
    u.failures
        .iter()
        .map(|(k, v)| format!("{}={v}", k.to_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A CSV field, quoted when needed.
fn csv(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// `delegate admin usage [--since DATE] [--csv]`.
pub fn usage(cli: &Cli, since: Option<&str>, as_csv: bool) -> CliResult {
    require_admin()?;
    let slurm = Slurm::from_env();
    let jobs = slurm.accounting(Some(since.unwrap_or("now-7days")))?;
    let users = summarize(&jobs);
    if cli.json {
        print_json(&users)?;
        return Ok(0);
    }
    let mut out = io::stdout().lock();
    if as_csv {
        let _ = writeln!(
            out,
            "user,calls,submissions,allocations,node_seconds,active,failures,runs_again"
        );
        for u in &users {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{}",
                csv(&u.user),
                u.calls,
                u.submissions,
                u.allocations,
                u.node_secs,
                u.active,
                csv(&failures(u)),
                u.runs_again
            );
        }
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "{:<20} {:>7} {:>7} {:>7} {:>6} {:>11} {:>6}  FAILURES",
        "USER", "CALLS", "SUBMITS", "ALLOCS", "AGAIN", "NODE-TIME", "ACTIVE"
    );
    for u in &users {
        let _ = writeln!(
            out,
            "{:<20} {:>7} {:>7} {:>7} {:>6} {:>11} {:>6}  {}",
            u.user,
            u.calls,
            u.submissions,
            u.allocations,
            u.runs_again,
            hms(u.node_secs),
            u.active,
            failures(u)
        );
    }
    Ok(0)
}

/// `delegate admin queue`: who waits for what right now.
pub fn queue(cli: &Cli) -> CliResult {
    require_admin()?;
    let q = Slurm::from_env().queue_all()?;
    if cli.json {
        print_json(&q)?;
        return Ok(0);
    }
    let mut out = io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<14} {:<20} {:<9} {:>8} {:>10} {:>10}  {:<19}  REASON",
        "SLURM-ID", "USER", "STATE", "PRIORITY", "TIME", "LIMIT", "SUBMITTED"
    );
    for j in &q {
        let _ = writeln!(
            out,
            "{:<14} {:<20} {:<9} {:>8} {:>10} {:>10}  {:<19}  {}",
            j.job_id, j.user, j.state, j.priority, j.time, j.time_limit, j.submitted, j.reason
        );
    }
    let pending = q.iter().filter(|j| j.state == "PENDING").count();
    let users: std::collections::BTreeSet<&str> = q.iter().map(|j| j.user.as_str()).collect();
    let _ = writeln!(out, "{} running, {pending} pending, {} users", q.len() - pending, users.len());
    Ok(0)
}

/// One word for an optional report field.
fn known(v: Option<&str>) -> &str {
    v.unwrap_or("unknown")
}

/// The node table's lines (header first), then the summary lines.
pub fn node_lines(rows: &[NodeRow]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<12} {:<10} {:<10} {:<8} {:<12} {:<7} {:<9} {:<8} {:<24} CPU",
        "NODE", "STATE", "CLASS", "LABEL", "GOVERNOR", "BOOST", "COUNTERS", "PERF", "GPUS"
    )];
    let mut classes: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    let mut notes = Vec::new();
    for n in rows {
        let Some(r) = &n.report else {
            lines.push(format!(
                "{:<12} {:<10} (no report yet: its agent publishes one within a minute of starting)",
                n.name, n.state
            ));
            continue;
        };
        classes.entry(r.class.as_str()).or_default().push(n.name.as_str());
        let boost = r.boost.map_or("unknown", |b| if b { "on" } else { "off" });
        let counters = r
            .hardware_counters
            .map_or("unknown", |h| if h { "hardware" } else { "software" });
        lines.push(format!(
            "{:<12} {:<10} {:<10} {:<8} {:<12} {:<7} {:<9} {:<8} {:<24} {}",
            n.name,
            n.state,
            r.class,
            r.label.as_deref().unwrap_or("-"),
            known(r.governor.as_deref()),
            boost,
            counters,
            r.perf,
            r.gpus.as_deref().unwrap_or("-"),
            r.cpu
        ));
        if r.drifted() {
            notes.push(format!(
                "drift: {}'s class changed since the last deployment (was {}, now {}): the calls of one map keep to one class; deploy again to take it as the node's class",
                n.name,
                r.deployed.as_deref().unwrap_or("?"),
                r.class
            ));
        }
    }
    let summary: Vec<String> = classes.iter().map(|(c, nodes)| format!("{c} ({})", nodes.join(", "))).collect();
    lines.push(format!(
        "{} node(s), {} class(es){}{}",
        rows.len(),
        classes.len(),
        if summary.is_empty() { "" } else { ": " },
        summary.join("; ")
    ));
    if notes.is_empty() && !classes.is_empty() {
        notes.push("no drift: every reporting node has the class it had at the last deployment".into());
    }
    lines.extend(notes);
    lines
}

/// `delegate admin nodes`: the fleet's classes and state.
pub fn nodes(cli: &Cli) -> CliResult {
    require_admin()?;
    let rows = Slurm::from_env().nodes()?;
    if cli.json {
        print_json(&rows)?;
        return Ok(0);
    }
    let mut out = io::stdout().lock();
    for l in node_lines(&rows) {
        let _ = writeln!(out, "{l}");
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use delegate_client::slurm::nodes::parse_nodes;

    #[test]
    fn the_node_table_names_classes_and_drift() {
        let rows = parse_nodes(
            "worker1|delegate*|idle|dlgclass_aaaaaaaaaa|none|delegate class=aaaaaaaaaa deployed=aaaaaaaaaa label=none governor=performance boost=off perf=seccomp counters=software cpu=AMD EPYC 7B13|\n\
             worker2|delegate*|idle|dlgclass_bbbbbbbbbb|none|delegate class=bbbbbbbbbb deployed=aaaaaaaaaa label=slow governor=unknown boost=unknown perf=seccomp counters=software gpus=4xNVIDIA_H100_80GB_HBM3 cpu=AMD EPYC 7B13|\n\
             worker3|delegate*|idle~|(null)|none||\n",
        );
        let lines = node_lines(&rows);
        assert!(
            lines[1].starts_with(
                "worker1      idle       aaaaaaaaaa -        performance  off     software  seccomp  -                        AMD EPYC 7B13"
            ),
            "{}",
            lines[1]
        );
        assert!(lines[0].contains(" PERF     GPUS "), "{}", lines[0]);
        assert!(lines[2].contains("bbbbbbbbbb slow"), "{}", lines[2]);
        assert!(lines[2].contains(" seccomp  4xNVIDIA_H100_80GB_HBM3 "), "{}", lines[2]);
        assert!(lines[3].contains("no report yet"), "{}", lines[3]);
        assert_eq!(lines[4], "3 node(s), 2 class(es): aaaaaaaaaa (worker1); bbbbbbbbbb (worker2)");
        assert!(
            lines[5].starts_with(
                "drift: worker2's class changed since the last deployment (was aaaaaaaaaa, now bbbbbbbbbb)"
            ),
            "{}",
            lines[5]
        );
    }
}

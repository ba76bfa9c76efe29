//! `delegate admin usage|queue`: the instructor's view of the course's
//! cluster, from Slurm's accounting (sacct) and queue (squeue). For root
//! and the admin group only; Slurm itself shows others' records only to
//! root, SlurmUser and accounting operators/coordinators.

use std::io::{self, Write};

use delegate_client::slurm::usage::{caller_is_admin, summarize, UserUsage, ADMIN_GROUP};
use delegate_client::slurm::Slurm;

use crate::cli::Cli;
use crate::fail::{CliResult, Fail};
use crate::output::print_json;

/// Environment variable naming the admin group (default `delegate-admin`).
pub const ADMIN_GROUP_ENV: &str = "DELEGATE_ADMIN_GROUP";

/// Refuses anyone but root and the admin group's members, in one sentence.
fn require_admin() -> Result<(), Fail> {
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
fn hms(secs: u64) -> String {
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
        let _ = writeln!(out, "user,calls,submissions,allocations,node_seconds,active,failures");
        for u in &users {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{}",
                csv(&u.user),
                u.calls,
                u.submissions,
                u.allocations,
                u.node_secs,
                u.active,
                csv(&failures(u))
            );
        }
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "{:<20} {:>7} {:>7} {:>7} {:>11} {:>6}  FAILURES",
        "USER", "CALLS", "SUBMITS", "ALLOCS", "NODE-TIME", "ACTIVE"
    );
    for u in &users {
        let _ = writeln!(
            out,
            "{:<20} {:>7} {:>7} {:>7} {:>11} {:>6}  {}",
            u.user,
            u.calls,
            u.submissions,
            u.allocations,
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

//! `delegate admin rush`: the rush now, as text for a terminal or JSON for
//! the instructor's page (stack/rush_page.py), from one `squeue`, one
//! `sinfo` and, with `--since`, one `sacct`
//! ([`delegate_client::slurm::rush`]). Root and the admin group only.

use std::io::{self, Write};

use delegate_client::slurm::rush::{summarize, Rush};
use delegate_client::slurm::usage;
use delegate_client::slurm::Slurm;

use super::admin::{hms, require_admin};
use crate::cli::Cli;
use crate::fail::CliResult;
use crate::output::print_json;

/// `delegate admin rush [--since DATE]`.
pub fn rush(cli: &Cli, since: Option<&str>) -> CliResult {
    require_admin()?;
    let slurm = Slurm::from_env();
    let queue = slurm.rush_queue()?;
    let nodes = slurm.nodes()?;
    let users = match since {
        Some(s) => Some((usage::summarize(&slurm.accounting(Some(s))?), s)),
        None => None,
    };
    let now = delegate_protocol::now_ms() / 1000;
    let r = summarize(&queue, &nodes, users.as_ref().map(|(u, s)| (u.as_slice(), *s)), now);
    if cli.json {
        print_json(&r)?;
        return Ok(0);
    }
    let mut out = io::stdout().lock();
    for l in lines(&r) {
        let _ = writeln!(out, "{l}");
    }
    Ok(0)
}

/// The text form, one fact per line.
pub fn lines(r: &Rush) -> Vec<String> {
    let mut l = vec![
        format!(
            "calls: {} running, {} waiting ({} students waiting)",
            r.running, r.pending, r.students_waiting
        ),
        format!("nodes: {} busy, {} free, {} out, of {}", r.busy, r.free, r.out.len(), r.nodes),
        format!(
            "waits now: median {}, 90th percentile {}, longest {}",
            hms(r.wait_p50_secs),
            hms(r.wait_p90_secs),
            hms(r.wait_max_secs)
        ),
    ];
    for n in &r.out {
        l.push(format!("out: {} ({}): {}", n.node, n.state, n.reason));
    }
    for w in &r.longest_waits {
        l.push(format!(
            "waiting longest: {} ({} waiting, the oldest for {})",
            w.user,
            w.pending,
            hms(w.longest_secs)
        ));
    }
    if let (Some(h), Some(since)) = (&r.heaviest, &r.since) {
        for u in h {
            l.push(format!(
                "heaviest since {since}: {} (node time {}, {} allocations)",
                u.user,
                hms(u.node_secs),
                u.allocations
            ));
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use delegate_client::slurm::rush::{Heavy, NodeOut, Waiting};

    #[test]
    fn the_text_says_each_number_of_the_page() {
        let r = Rush {
            at: 0,
            running: 12,
            pending: 40,
            students_waiting: 9,
            nodes: 12,
            busy: 11,
            free: 0,
            out: vec![NodeOut {
                node: "worker4".into(),
                state: "down*".into(),
                reason: "Not responding".into(),
            }],
            wait_p50_secs: 95,
            wait_p90_secs: 400,
            wait_max_secs: 610,
            longest_waits: vec![Waiting {
                user: "ann".into(),
                pending: 3,
                longest_secs: 610,
            }],
            heaviest: Some(vec![Heavy {
                user: "ben".into(),
                node_secs: 3700,
                allocations: 20,
            }]),
            since: Some("now-3hours".into()),
        };
        assert_eq!(
            lines(&r),
            [
                "calls: 12 running, 40 waiting (9 students waiting)",
                "nodes: 11 busy, 0 free, 1 out, of 12",
                "waits now: median 0:01:35, 90th percentile 0:06:40, longest 0:10:10",
                "out: worker4 (down*): Not responding",
                "waiting longest: ann (3 waiting, the oldest for 0:10:10)",
                "heaviest since now-3hours: ben (node time 1:01:40, 20 allocations)",
            ]
        );
    }
}

//! Elastic workers whose start failed for want of a machine: swarm had no
//! node for the worker's task ("no suitable node": its machine was off or
//! cut off when Slurm asked for it). slurm-conf/power.sh set the node DOWN
//! and remembered the failure in the spool (`failed.workerN`). Such a
//! failure ends when a machine that can take the task is back: every
//! [`CHECK_INTERVAL`] this service reads the swarm, and for each such
//! worker that a Ready node can now take it writes `back.workerN` (naming
//! the node); the head's `power watch` (as SlurmUser) then resumes the
//! node in Slurm, which starts it again when a job needs it. Any other
//! failed start (a missing image, a slurmd that never registered) stays
//! out until an operator acts.

use std::path::Path;
use std::time::Duration;

use bollard::models::{NodeSpecAvailabilityEnum, NodeState};
use bollard::query_parameters::{InspectServiceOptions, ListNodesOptions};
use bollard::Docker;

use super::placement::{can_take, NodeFacts};
use super::{clean, read_bounded, write_spool, Settings};

/// How often the swarm is read while a worker waits for its machine.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Whether a failed start's reason says no machine could take the task.
pub fn wants_a_machine(reason: &str) -> bool {
    reason.to_ascii_lowercase().contains("no suitable node")
}

/// The worker a spool file name is the remembered failure of
/// (`failed.workerN`, N one of this stack's elastic workers).
pub fn failed_worker(file_name: &str, min: u32, max: u32) -> Option<u32> {
    let n = file_name.strip_prefix("failed.worker")?;
    if n.is_empty() || n.len() > 4 || n.starts_with('0') || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok().filter(|n| *n > min && *n <= max)
}

/// The workers whose remembered failed start wants a machine and that are
/// not announced back yet.
fn waiting(s: &Settings) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(&s.spool) else {
        return Vec::new();
    };
    let mut out: Vec<u32> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let n = failed_worker(&e.file_name().to_string_lossy(), s.min, s.max)?;
            let reason = read_bounded(&e.path(), 256);
            (wants_a_machine(&String::from_utf8_lossy(&reason)) && !back_file(&s.spool, n).exists()).then_some(n)
        })
        .collect();
    out.sort_unstable();
    out
}

fn back_file(spool: &Path, n: u32) -> std::path::PathBuf {
    spool.join(format!("back.worker{n}"))
}

/// The swarm's nodes, as the constraints read them.
async fn swarm_nodes(docker: &Docker) -> Result<Vec<NodeFacts>, String> {
    let nodes = docker
        .list_nodes(None::<ListNodesOptions>)
        .await
        .map_err(|e| format!("cannot list the swarm's nodes: {}", crate::short_reason(&e)))?;
    Ok(nodes
        .into_iter()
        .map(|n| {
            let spec = n.spec.unwrap_or_default();
            let ready = n.status.and_then(|s| s.state) == Some(NodeState::READY);
            let active = spec.availability == Some(NodeSpecAvailabilityEnum::ACTIVE);
            NodeFacts {
                id: n.id.unwrap_or_default(),
                hostname: n.description.and_then(|d| d.hostname).unwrap_or_default(),
                role: spec.role.map(|r| r.to_string()).unwrap_or_default(),
                labels: spec.labels.unwrap_or_default(),
                usable: ready && active,
            }
        })
        .collect())
}

/// The placement constraints of a worker's service.
async fn constraints(docker: &Docker, service: &str) -> Result<Vec<String>, String> {
    let svc = docker
        .inspect_service(service, None::<InspectServiceOptions>)
        .await
        .map_err(|e| format!("cannot inspect {service}: {}", crate::short_reason(&e)))?;
    Ok(svc
        .spec
        .and_then(|s| s.task_template)
        .and_then(|t| t.placement)
        .and_then(|p| p.constraints)
        .unwrap_or_default())
}

/// One pass: each waiting worker that a usable node can now take is
/// announced back (`back.workerN`, atomically).
pub async fn announce(docker: &Docker, s: &Settings) {
    let workers = waiting(s);
    if workers.is_empty() {
        return;
    }
    let nodes = match swarm_nodes(docker).await {
        Ok(n) => n,
        Err(e) => return tracing::warn!("{e}"),
    };
    for n in workers {
        let service = format!("{}_worker{n}", s.stack);
        let wanted = match constraints(docker, &service).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("{e}");
                continue;
            }
        };
        let Some(node) = nodes.iter().find(|node| can_take(node, &wanted)) else {
            continue;
        };
        let text = clean(&format!("machine {} ({}) is ready", node.hostname, node.id));
        match write_spool(&s.spool, &format!("back.worker{n}"), &text) {
            Ok(()) => tracing::info!("worker{n}: its start waited for a machine; {text}: announced back"),
            Err(e) => tracing::error!("worker{n}: cannot announce it back: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_remembered_failure_for_want_of_a_machine_waits() {
        assert_eq!(failed_worker("failed.worker2", 1, 3), Some(2));
        for bad in [
            "failed.worker1",
            "failed.worker4",
            "failed.worker02",
            "failed.worker",
            "failed.workerx",
            ".failed.worker2",
            "back.worker2",
        ] {
            assert_eq!(failed_worker(bad, 1, 3), None, "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        let s = Settings {
            stack: "t".into(),
            min: 0,
            max: 3,
            spool: dir.path().to_path_buf(),
            start_wait: Duration::ZERO,
        };
        let machine = "elastic: cannot start worker worker1: the task of t_worker1 failed: no suitable node (scheduling constraints not satisfied on 2 nodes)";
        std::fs::write(dir.path().join("failed.worker1"), machine).unwrap();
        std::fs::write(
            dir.path().join("failed.worker2"),
            "elastic: cannot start worker worker2: No such image: x",
        )
        .unwrap();
        std::fs::write(dir.path().join("failed.worker3"), machine).unwrap();
        std::fs::write(dir.path().join("back.worker3"), "machine m3 (x) is ready").unwrap();
        assert_eq!(waiting(&s), vec![1]);
        // A link in the spool is not read.
        std::fs::remove_file(dir.path().join("failed.worker1")).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, machine).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("failed.worker1")).unwrap();
        assert_eq!(waiting(&s), Vec::<u32>::new());
    }
}

//! This node's hardware class and report, kept in Slurm (see
//! [`delegate_protocol::node_class`]): the class as the node feature
//! `dlgclass_<id>` (so that one experiment's calls can ask Slurm for one
//! class), the report as the node's comment (what `delegate admin nodes`
//! shows). Published at start, after every call and every
//! [`PUBLISH_EVERY`] (a `scontrol reconfigure` resets features to
//! slurm.conf's; the next publication puts the class back). Root on a node
//! is a Slurm administrator: `scontrol update` of its own node only, with
//! values the agent made itself.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use delegate_protocol::node_class::{self, check_label, class_of_feature, NodeClass, NodeReport, Topology};
use delegate_protocol::policy::Policy;

use crate::ask::{AskError, BoundedRun};
use crate::measure::fingerprint;
use crate::sandbox::config;

/// How often the class and report are published at the latest.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(30);
/// How long one scontrol may take.
const SCONTROL_PATIENCE: Duration = Duration::from_secs(15);
/// At most this much of scontrol's answer about this node is read.
const MAX_SCONTROL_ANSWER: usize = 1 << 20;
/// At most this many bytes of the label file are read.
const MAX_LABEL_FILE: u64 = 256;

/// The operator's label of this node, if the label file holds a valid one.
fn label(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    if let Err(e) = file.take(MAX_LABEL_FILE).read_to_string(&mut text) {
        tracing::warn!("{}: {e}; the node has no label", path.display());
        return None;
    }
    match check_label(&text) {
        Ok(l) => Some(l),
        Err(why) => {
            tracing::warn!("{}: {why}; the node has no label", path.display());
            None
        }
    }
}

/// The node's online CPUs and the threads of core 0 (sysfs under `root`).
pub fn topology(root: &Path) -> Topology {
    let list = |p: &str| {
        std::fs::read_to_string(root.join(p))
            .ok()
            .and_then(|s| fingerprint::parse_cpu_list(s.trim()))
            .and_then(|l| u32::try_from(l.len()).ok())
            .filter(|n| *n > 0)
    };
    Topology {
        cpus_online: list("sys/devices/system/cpu/online"),
        threads_per_core: list("sys/devices/system/cpu/cpu0/topology/thread_siblings_list"),
    }
}

/// This node's GPUs (gres.conf's devices) as its driver describes them
/// now; none when gres.conf cannot be trusted (logged).
async fn node_gpus(policy: &Policy, node: &str) -> Vec<delegate_protocol::Gpu> {
    match crate::gpu::devices::node_devices(policy, node) {
        Ok(devices) => {
            let (devices, indexes) = crate::gpu::info::indexes(&devices);
            crate::gpu::info::now(&devices, &indexes).await
        }
        Err(e) => {
            tracing::warn!("{e}; the node's class counts no GPU");
            Vec::new()
        }
    }
}

/// This node's class and report now (without the deployed class), with
/// its `gpus`.
pub fn current(policy: &Policy, node: &str, gpus: Vec<delegate_protocol::Gpu>) -> (NodeClass, NodeReport) {
    let proc = match &policy.host_proc {
        p if p.as_os_str().is_empty() => std::path::PathBuf::from("/proc"),
        p => p.clone(),
    };
    let root = Path::new("/");
    // No caller: every user's task is "another user's process".
    let before = fingerprint::before(root, &proc, &[0], &Default::default(), 0);
    let (perf, _) = config::perf_for(policy.perf_mode, config::perf_paranoid());
    let mut f = fingerprint::after(root, &proc, before, &Default::default(), node, perf.as_str(), None, None);
    f.gpus = gpus;
    let label = label(Path::new(node_class::LABEL_FILE));
    let class = NodeClass::of(&f, topology(root), label.as_deref());
    let report = NodeReport {
        class: class.id.clone(),
        deployed: None,
        label,
        governor: f.governor.clone(),
        boost: f.boost,
        perf: perf.as_str().to_owned(),
        hardware_counters: fingerprint::hardware_counters(),
        gpus: node_class::gpus_in_short(&f.gpus),
        cpu: f.cpu_model.clone().unwrap_or_else(|| "unknown".into()),
    };
    (class, report)
}

/// What Slurm holds about a node: its state, features (available,
/// active) and comment.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SlurmNode {
    /// `IDLE+CLOUD+POWERING_UP`, ...
    pub state: String,
    pub available: Vec<String>,
    pub active: Vec<String>,
    pub comment: String,
}

impl SlurmNode {
    /// Whether slurmd has registered and the node is not being powered up
    /// or down (an elastic worker): only then is its record updated, so
    /// that nothing the agent does meets Slurm's power saving half-way.
    pub fn settled(&self) -> bool {
        const UNSETTLED: [&str; 5] = [
            "POWERING_UP",
            "POWERING_DOWN",
            "POWERED_DOWN",
            "NOT_RESPONDING",
            "UNKNOWN",
        ];
        !self.state.is_empty()
            && !self
                .state
                .split('+')
                .any(|s| UNSETTLED.contains(&s.trim_end_matches(['*', '~', '#', '%'])))
    }
}

/// `scontrol show node NAME` (one `Key=value` group per line; the
/// comment, which may hold spaces, on a line of its own).
pub fn parse_show_node(text: &str) -> SlurmNode {
    let list = |v: &str| -> Vec<String> {
        if v == "(null)" || v.is_empty() {
            Vec::new()
        } else {
            v.split(',').map(str::to_owned).collect()
        }
    };
    let mut n = SlurmNode::default();
    for line in text.lines().map(str::trim) {
        if let Some(c) = line.strip_prefix("Comment=") {
            n.comment = if c == "(null)" { String::new() } else { c.to_owned() };
            continue;
        }
        for kv in line.split_whitespace() {
            if let Some(v) = kv.strip_prefix("State=") {
                n.state = v.to_owned();
            } else if let Some(v) = kv.strip_prefix("AvailableFeatures=") {
                n.available = list(v);
            } else if let Some(v) = kv.strip_prefix("ActiveFeatures=") {
                n.active = list(v);
            }
        }
    }
    n
}

/// `features` with our class features replaced by `ours`.
pub fn with_class(features: &[String], ours: &str) -> Vec<String> {
    let mut out: Vec<String> = features.iter().filter(|f| class_of_feature(f).is_none()).cloned().collect();
    out.push(ours.to_owned());
    out
}

/// The report to publish: `now`, with the deployed class Slurm holds (or
/// `now`'s class when the deployment cleared it).
pub fn report_to_publish(now: &NodeReport, held: &str) -> NodeReport {
    let deployed = NodeReport::parse(held)
        .and_then(|r| r.deployed)
        .or_else(|| Some(now.class.clone()));
    NodeReport { deployed, ..now.clone() }
}

async fn scontrol(args: &[String]) -> Result<String, AskError> {
    let mut argv = vec!["scontrol"];
    argv.extend(args.iter().map(String::as_str));
    let question = BoundedRun {
        argv: &argv,
        deadline: SCONTROL_PATIENCE,
        max_answer: MAX_SCONTROL_ANSWER,
        env: &[],
        clear_env: false,
    };
    question.ask().await
}

/// Why this node's class was not published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("the fingerprint task failed: {0}")]
    Fingerprint(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Slurm(#[from] AskError),
    #[error("node {node} is {state} in Slurm: its class is published once it is up")]
    NotUp { node: String, state: String },
}

/// Publishes this node's class and report; Ok(true) when Slurm's record
/// changed.
pub async fn publish(policy: &Policy, node: &str) -> Result<bool, PublishError> {
    let gpus = node_gpus(policy, node).await;
    let (class, now) = {
        let (policy, node) = (policy.clone(), node.to_owned());
        tokio::task::spawn_blocking(move || current(&policy, &node, gpus)).await?
    };
    let held = parse_show_node(&scontrol(&["show".into(), "node".into(), node.into()]).await?);
    if !held.settled() {
        return Err(PublishError::NotUp {
            node: node.into(),
            state: held.state.clone(),
        });
    }
    let report = report_to_publish(&now, &held.comment);
    let comment = report.to_comment();
    let (available, active) = (
        with_class(&held.available, &class.feature()),
        with_class(&held.active, &class.feature()),
    );
    if available == held.available && active == held.active && comment == held.comment {
        return Ok(false);
    }
    scontrol(&[
        "update".into(),
        format!("NodeName={node}"),
        format!("AvailableFeatures={}", available.join(",")),
        format!("ActiveFeatures={}", active.join(",")),
        format!("Comment={comment}"),
    ])
    .await?;
    if report.drifted() {
        tracing::warn!(
            "node class changed since the last deployment: was {}, now {} ({})",
            report.deployed.as_deref().unwrap_or("?"),
            class.id,
            class.summary
        );
    } else {
        tracing::info!("node class {} ({})", class.id, class.summary);
    }
    Ok(true)
}

/// Publishes at start, whenever `again` is notified (a call ended) and
/// every [`PUBLISH_EVERY`]; errors are logged once until it works again.
pub async fn keep_published(policy: Policy, node: String, again: Arc<tokio::sync::Notify>) {
    let mut failing = false;
    loop {
        match publish(&policy, &node).await {
            Ok(_) => failing = false,
            Err(e) if !failing => {
                tracing::warn!("cannot publish this node's class to Slurm: {e} (retried every {PUBLISH_EVERY:?})");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = again.notified() => {}
            _ = tokio::time::sleep(PUBLISH_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOW: &str = "NodeName=vm Arch=x86_64 CoresPerSocket=1
   CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.05
   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   AvailableFeatures=avx2,dlgclass_0123456789
   ActiveFeatures=avx2,dlgclass_0123456789
   Gres=(null)
   NodeAddr=vm NodeHostName=vm Version=22.05.8
   Comment=delegate class=0123456789 deployed=0123456789 label=none governor=unknown boost=unknown perf=seccomp counters=software cpu=AMD EPYC 7B13
";

    #[test]
    fn slurms_view_of_a_node_is_read_with_its_spaced_comment() {
        let n = parse_show_node(SHOW);
        assert_eq!(n.available, ["avx2", "dlgclass_0123456789"]);
        assert_eq!(n.active, ["avx2", "dlgclass_0123456789"]);
        assert!(n.comment.ends_with("cpu=AMD EPYC 7B13"), "{}", n.comment);
        assert_eq!(n.state, "IDLE");
        assert!(n.settled());
        let empty =
            parse_show_node("NodeName=vm\n   AvailableFeatures=(null)\n   ActiveFeatures=(null)\n   Comment=(null)\n");
        assert_eq!(empty, SlurmNode::default());
        assert!(!empty.settled(), "no state read: not settled");
        let state = |s: &str| SlurmNode { state: s.into(), ..Default::default() };
        assert!(state("ALLOCATED+CLOUD").settled() && state("MIXED").settled());
        for s in [
            "IDLE+CLOUD+POWERING_UP",
            "IDLE+CLOUD+POWERED_DOWN",
            "DOWN*+NOT_RESPONDING",
            "IDLE+POWERING_DOWN",
        ] {
            assert!(!state(s).settled(), "{s}");
        }
    }

    #[test]
    fn the_class_feature_replaces_ours_and_keeps_the_sites() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            with_class(&f(&["avx2", "dlgclass_0123456789"]), "dlgclass_abcdefabcd"),
            f(&["avx2", "dlgclass_abcdefabcd"])
        );
        assert_eq!(with_class(&[], "dlgclass_abcdefabcd"), f(&["dlgclass_abcdefabcd"]));
    }

    #[test]
    fn the_deployed_class_is_kept_until_a_deployment_clears_it() {
        let now = NodeReport {
            class: "bbbbbbbbbb".into(),
            perf: "seccomp".into(),
            ..Default::default()
        };
        let held = NodeReport {
            class: "aaaaaaaaaa".into(),
            deployed: Some("aaaaaaaaaa".into()),
            perf: "seccomp".into(),
            ..Default::default()
        };
        let drifted = report_to_publish(&now, &held.to_comment());
        assert_eq!(drifted.deployed.as_deref(), Some("aaaaaaaaaa"));
        assert!(drifted.drifted());
        let after_deploy = report_to_publish(&now, "");
        assert_eq!(after_deploy.deployed.as_deref(), Some("bbbbbbbbbb"));
        assert!(!after_deploy.drifted());
        // An operator's own comment is replaced, the class recorded afresh.
        assert!(!report_to_publish(&now, "rack 4").drifted());
    }

    #[test]
    fn the_class_of_this_machine_is_read_from_its_proc_and_sys() {
        let policy = Policy::default();
        let (class, report) = current(&policy, "here", Vec::new());
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = info.lines().find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        });
        if let Some(m) = model {
            assert_eq!(report.cpu, m);
            assert!(class.summary.contains(&m), "{}", class.summary);
        }
        assert_eq!(report.class, class.id);
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
        if let Some(cpus) = fingerprint::parse_cpu_list(online.trim()) {
            assert_eq!(topology(Path::new("/")).cpus_online, Some(cpus.len() as u32));
            assert!(class.summary.contains(&format!("{} CPUs", cpus.len())), "{}", class.summary);
        }
    }
}

//! `delegate doctor`'s checks: what a healthy node of its role has (Slurm,
//! munge with the socket this user's Slurm configuration names; where
//! sandboxes run: Docker through the root agent, the sandbox image, perf
//! mode; the delegate root, the site policy), each with a fix when not.
//! The CLI prints them.

mod elastic;
mod role;

pub use role::NodeRole;

use std::path::{Path, PathBuf};
use std::time::Duration;

use delegate_protocol::policy::{PerfMode, Policy, DEFAULT_POLICY_PATH, POLICY_ENV};

use crate::slurm::nodes::{each_node_once, parse_nodes, NodeRow, SINFO_NODES_FORMAT};
use crate::slurm::Slurm;
use crate::{subprocess, Client, Config, DEFAULT_RUNNER};

/// One check: what was found, and how to fix it when it failed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    pub check: &'static str,
    pub ok: bool,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn check(check: &'static str, res: Result<String, (String, String)>) -> Check {
    match res {
        Ok(detail) => Check { check, ok: true, detail, fix: None },
        Err((detail, fix)) => Check { check, ok: false, detail, fix: Some(fix) },
    }
}

struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Output {
    fn first_line(&self) -> String {
        self.stderr
            .lines()
            .chain(self.stdout.lines())
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("no output")
            .chars()
            .take(300)
            .collect()
    }
}

/// Runs a program through the client's subprocess helper (killed when over
/// `limit`); the error is one sentence.
fn run_cmd(
    program: impl AsRef<Path>,
    args: &[&str],
    stdin: Option<Vec<u8>>,
    limit: Duration,
) -> Result<Output, String> {
    let o = subprocess::run(program.as_ref(), args, stdin.as_deref(), limit).map_err(|e| e.to_string())?;
    Ok(Output {
        ok: o.success(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    })
}

/// Every check of this node, in order; `client` is the caller's client
/// (or why it could not be made).
pub fn run(client: Result<&Client, String>) -> Vec<Check> {
    let role = NodeRole::of_this_node();
    let mut checks = vec![Check {
        check: "node role",
        ok: true,
        detail: role.describe().to_owned(),
        fix: None,
    }];
    // (the client's Slurm adapter: its tools' paths, as every other command)
    let slurm = client.as_ref().map_or_else(|_| Slurm::from_env(), |c| c.config().slurm.clone());
    let nodes = sinfo_nodes(&slurm);
    slurm_checks(&mut checks, &slurm, &nodes);
    checks.push(munge_check(role::munge_socket_in_use()));
    if role.runs_sandboxes() {
        sandbox_checks(&mut checks);
        checks.push(tuning_check(Path::new("/")));
    }
    checks.push(root_check(client.clone()));
    checks.push(home_uids_check(client));
    checks.push(policy_check());
    if let Some(c) = partitions_check(&nodes) {
        checks.push(c);
    }
    checks
}

/// Every node line of sinfo (the one parser), or sinfo's complaint.
fn sinfo_nodes(slurm: &Slurm) -> Result<Vec<NodeRow>, String> {
    let format = format!("--Format={SINFO_NODES_FORMAT}");
    match run_cmd(&slurm.sinfo, &["--noheader", "--Node", &format], None, T) {
        Ok(o) if o.ok => Ok(parse_nodes(&o.stdout)),
        Ok(o) => Err(format!("sinfo: {}", o.first_line())),
        Err(e) => Err(e),
    }
}

/// On a cluster shared with plain Slurm jobs (the policy's `partitions`):
/// delegate's partitions exist and none of their nodes is in another
/// partition. None on a cluster that is delegate's alone.
fn partitions_check(nodes: &Result<Vec<NodeRow>, String>) -> Option<Check> {
    let ours = Policy::load_for_client().ok()?.partitions;
    if ours.is_empty() {
        return None;
    }
    let fix = "give delegate's partitions nodes of their own (slurm.conf's PartitionName=... Nodes=)";
    Some(check(
        "partitions",
        match nodes {
            Ok(rows) => partition_overlap(rows, &ours).map_err(|why| (why, fix.into())),
            Err(e) => Err((e.clone(), fix.into())),
        },
    ))
}

/// The nodes' partitions against delegate's partitions `ours`: what is
/// delegate's, or the first problem.
fn partition_overlap(rows: &[NodeRow], ours: &[String]) -> Result<String, String> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut parts_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in rows.iter().filter(|r| !r.partition.is_empty()) {
        parts_of.entry(&r.name).or_default().insert(r.partition.trim_end_matches('*'));
    }
    let is_ours = |p: &str| ours.iter().any(|o| o == p);
    if let Some(missing) = ours.iter().find(|o| !parts_of.values().any(|ps| ps.contains(o.as_str()))) {
        return Err(format!("the site policy's partition {missing} has no node in Slurm"));
    }
    let mut nodes = Vec::new();
    for (node, parts) in &parts_of {
        if !parts.iter().any(|p| is_ours(p)) {
            continue;
        }
        if let Some(other) = parts.iter().find(|p| !is_ours(p)) {
            return Err(format!(
                "node {node} is in delegate's partition {} and in {other}: that partition's jobs share it, so a call's node is not exclusive (and the lockdown covers their steps there too)",
                parts.iter().find(|p| is_ours(p)).unwrap_or(&"?")
            ));
        }
        nodes.push(*node);
    }
    Ok(format!(
        "delegate's partitions {} have {} node(s) of their own: {}",
        ours.join(", "),
        nodes.len(),
        nodes.join(", ")
    ))
}

const T: Duration = Duration::from_secs(20);

/// The controller answers, a node is usable; elastic workers explained.
fn slurm_checks(checks: &mut Vec<Check>, slurm: &Slurm, nodes: &Result<Vec<NodeRow>, String>) {
    let slurm_fix = "start Slurm (build_cluster.sh --local on a single machine) and check that slurmctld is running and SLURM_CONF points at its configuration";

    checks.push(check(
        "slurm controller",
        match run_cmd(&slurm.scontrol, &["ping"], None, T) {
            Ok(o) if o.ok && o.stdout.contains("UP") => Ok(o.stdout.lines().next().unwrap_or("").trim().to_owned()),
            Ok(o) => Err((format!("scontrol ping: {}", o.first_line()), slurm_fix.into())),
            Err(e) => Err((e, slurm_fix.into())),
        },
    ));
    checks.push(check(
        "slurm nodes",
        match run_cmd(&slurm.sinfo, &["--noheader", "--format=%P %a %D %T"], None, T) {
            Ok(o) if o.ok => {
                let lines: Vec<&str> = o.stdout.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
                let usable = lines.iter().any(|l| {
                    let st = l.rsplit(' ').next().unwrap_or("");
                    ["idle", "mixed", "allocated", "completing"].iter().any(|u| st.starts_with(u))
                });
                if usable {
                    Ok(lines.join("; "))
                } else if lines.is_empty() {
                    Err((
                        "sinfo lists no partitions".into(),
                        "define a partition and nodes in slurm.conf".into(),
                    ))
                } else {
                    Err((
                        format!("no usable node: {}", lines.join("; ")),
                        "start slurmd on the workers and `scontrol update nodename=<node> state=resume`".into(),
                    ))
                }
            }
            Ok(o) => Err((format!("sinfo: {}", o.first_line()), slurm_fix.into())),
            Err(e) => Err((e, slurm_fix.into())),
        },
    ));
    // Elastic workers (docs/elastic.md): a job waiting for a worker Slurm
    // is powering up, or a worker that failed to start.
    let waiting = run_cmd(
        &slurm.squeue,
        &["--me", "--noheader", "--states=PD,CF", "--format=%i|%T|%r"],
        None,
        T,
    );
    if let (Ok(rows), Ok(q)) = (nodes, waiting) {
        let rows = each_node_once(rows.clone());
        if let Some(res) = elastic::explain(&rows, &elastic::parse_waiting(&q.stdout)) {
            checks.push(check("elastic workers", res));
        }
    }
}

/// A credential round-trips through the munged this user's Slurm commands
/// use (`socket`: the one their slurm.conf's AuthInfo names, else munged's
/// default).
fn munge_check(socket: Option<String>) -> Check {
    let (args, what) = match &socket {
        Some(s) => (vec!["-S", s.as_str()], format!("your munged ({s})")),
        None => (Vec::new(), "munged".to_owned()),
    };
    let munge_fix = match &socket {
        Some(s) => format!("your own munged at {s} does not answer: ask the instructor to restart the user node"),
        None => "start munged (same /etc/munge/munge.key on every node)".to_owned(),
    };
    let mut encode = args.clone();
    encode.push("-n");
    let res = match run_cmd("munge", &encode, None, T) {
        Ok(o) if o.ok => match run_cmd("unmunge", &args, Some(o.stdout.into_bytes()), T) {
            Ok(u) if u.ok => Ok(format!("a credential round-trips through {what}")),
            Ok(u) => Err((format!("unmunge: {}", u.first_line()), munge_fix)),
            Err(e) => Err((e, munge_fix)),
        },
        Ok(o) => Err((format!("munge -n: {}", o.first_line()), munge_fix)),
        Err(e) => Err((e, munge_fix)),
    };
    check("munge", res)
}

/// Docker, the image, perf mode and GPUs, as the runner's probe (through
/// the root agent) sees them.
fn sandbox_checks(checks: &mut Vec<Check>) {
    let cfg = Config::from_env();
    let runner = cfg
        .as_ref()
        .map(|c| c.runner.display().to_string())
        .unwrap_or_else(|_| DEFAULT_RUNNER.to_owned());
    let policy_off = matches!(Policy::load_for_client(), Ok(pol) if pol.perf_mode == PerfMode::Off);
    let runner_fix = format!(
        "install sandbox-runner at {runner} (root:root 0755; it hands jobs to the root agent sandbox-agent) or set DELEGATE_RUNNER"
    );
    let probe = run_cmd(&runner, &["probe", "--json"], None, Duration::from_secs(60)).and_then(|o| {
        serde_json::from_str::<serde_json::Value>(o.stdout.trim()).map_err(|e| {
            let why = if o.ok {
                format!("its output is not JSON ({e})")
            } else {
                o.first_line()
            };
            format!("{runner} probe --json: {why}")
        })
    });
    match probe {
        Ok(v) => {
            checks.push(docker_check(&v["docker"]));
            checks.push(image_check(&v["image"]));
            checks.push(perf_check(&v["perf_mode"], policy_off));
            checks.push(gpu_check(&v["gpu_mode"]));
        }
        Err(why) => {
            for name in ["docker", "sandbox image", "perf mode"] {
                checks.push(check(name, Err((why.clone(), runner_fix.clone()))));
            }
        }
    }
}

/// The engine answers the runner (through the root agent).
fn docker_check(d: &serde_json::Value) -> Check {
    check(
        "docker",
        if d["ok"].as_bool() == Some(true) {
            Ok(format!(
                "Docker {} (API {})",
                d["version"].as_str().unwrap_or("?"),
                d["api_version"].as_str().unwrap_or("?")
            ))
        } else {
            Err((
                format!(
                    "Docker does not answer the runner: {}",
                    d["error"].as_str().unwrap_or("no detail")
                ),
                "start dockerd and the root agent sandbox-agent (build_cluster.sh starts both)".into(),
            ))
        },
    )
}

/// The sandbox image is on the engine.
fn image_check(i: &serde_json::Value) -> Check {
    let name = i["name"].as_str().unwrap_or("?").to_owned();
    check(
        "sandbox image",
        if i["present"].as_bool() == Some(true) {
            Ok(format!("{name} is present"))
        } else {
            Err((
                format!("{name} is not present on this Docker engine"),
                "build it (build_cluster.sh builds the sandbox image)".into(),
            ))
        },
    )
}

/// perf counters reach the sandbox (or are off because the policy says so).
fn perf_check(p: &serde_json::Value, policy_off: bool) -> Check {
    let mode = p["mode"].as_str().unwrap_or("");
    let detail = p["detail"].as_str().unwrap_or("");
    check(
        "perf mode",
        match mode {
            "perfmon" | "seccomp" => Ok(format!("{mode}: {detail}")),
            "off" if policy_off => Ok(format!("off (as the site policy asks): {detail}")),
            other => Err((
                format!("perf counters are not available in the sandbox ({other}): {detail}"),
                "set perf_mode in the site policy and check kernel.perf_event_paranoid and the Docker version".into(),
            )),
        },
    )
}

/// How allocated GPUs reach the sandbox (devices, nvidia, cdi) or none on
/// this node; only a node whose gres.conf cannot be read is a failure.
fn gpu_check(g: &serde_json::Value) -> Check {
    let mode = g["mode"].as_str().unwrap_or("");
    let detail = g["detail"].as_str().unwrap_or("");
    check(
        "gpus",
        match mode {
            "unknown" => Err((
                format!("the GPUs of this node cannot be told: {detail}"),
                "check the site policy's gres_conf and Slurm's gres.conf on the workers".into(),
            )),
            "" => Ok("not reported by this runner".into()),
            other => Ok(format!("{other}: {detail}")),
        },
    )
}

/// Whether this node's cores can be tuned for measurement (the policy's
/// tune_cpus: performance governor, boost off): informational, never a
/// failure (a VM has no cpufreq; the calls' fingerprints then say so).
fn tuning_check(root: &Path) -> Check {
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).ok().map(|s| s.trim().to_owned());
    let governor = read("sys/devices/system/cpu/cpu0/cpufreq/scaling_governor");
    let available = read("sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors").unwrap_or_default();
    let boost = read("sys/devices/system/cpu/cpufreq/boost")
        .map(|b| format!("boost {}", if b == "1" { "on" } else { "off" }))
        .or_else(|| {
            read("sys/devices/system/cpu/intel_pstate/no_turbo")
                .map(|n| format!("turbo {}", if n == "1" { "off" } else { "on" }))
        })
        .unwrap_or_else(|| "no boost switch".into());
    let detail = match governor {
        None => "no cpufreq on this node: governor and boost cannot be set for calls (their fingerprints say unknown)"
            .to_owned(),
        Some(g) if available.split_whitespace().any(|a| a == "performance") => {
            format!("governor {g} now (calls run at performance while they run), {boost}")
        }
        Some(g) => format!("governor {g}, no performance governor to set ({available}), {boost}"),
    };
    Check {
        check: "tuning",
        ok: true,
        detail,
        fix: None,
    }
}

/// The delegate root is writable.
fn root_check(client: Result<&Client, String>) -> Check {
    check(
        "delegate root",
        (|| -> Result<String, String> {
            let c = client?;
            let probe = c.root().join(format!(".doctor-{}", std::process::id()));
            std::fs::write(&probe, b"ok").map_err(|e| format!("cannot write in {}: {e}", c.root().display()))?;
            let _ = std::fs::remove_file(&probe);
            Ok(format!("{} is writable", c.root().display()))
        })()
        .map_err(|e| {
            (
                e,
                "make the directory yours and mode 0700, or choose another with --root / DELEGATE_ROOT".into(),
            )
        }),
    )
}

/// Files in the delegate root keep this user's uid, here and on the workers.
fn home_uids_check(client: Result<&Client, String>) -> Check {
    let res = client.and_then(|c| c.check_home_uids().map_err(|e| e.to_string()));
    check(
        "home uids",
        res.map_err(|e| {
            (
                e,
                "export the home without squashing students' uids, and give each account the same uid on every machine"
                    .into(),
            )
        }),
    )
}

/// The site policy loads.
fn policy_check() -> Check {
    let policy_path = std::env::var_os(POLICY_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_POLICY_PATH));
    check(
        "site policy",
        match Policy::load(&policy_path, false) {
            Ok(p) => Ok(format!("{} (default image {})", policy_path.display(), p.default_image)),
            Err(e) => Err((
                e.to_string(),
                format!(
                    "install a root-owned policy at {DEFAULT_POLICY_PATH} (see build_cluster.sh) or set {POLICY_ENV}"
                ),
            )),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "NODE|PARTITION|" lines as sinfo's node lines in the one format.
    fn rows(lines: &str) -> Vec<NodeRow> {
        let full: String = lines.lines().map(|l| format!("{l}idle||none||\n")).collect();
        parse_nodes(&full)
    }

    #[test]
    fn the_slurm_checks_run_the_adapters_tools() {
        // (issue 57: doctor goes through the client's Slurm adapter, the
        // tools at its paths, not whatever `scontrol` $PATH finds)
        let missing = Path::new("/nonexistent/delegate-doctor-test");
        let slurm = Slurm {
            scontrol: missing.join("scontrol"),
            sinfo: missing.join("sinfo"),
            squeue: missing.join("squeue"),
            ..Slurm::default()
        };
        let mut checks = Vec::new();
        slurm_checks(&mut checks, &slurm, &sinfo_nodes(&slurm));
        let failed: Vec<&Check> = checks.iter().filter(|c| !c.ok).collect();
        assert_eq!(failed.len(), 2, "{checks:?}");
        for c in failed {
            assert!(c.detail.contains("/nonexistent/delegate-doctor-test/s"), "{c:?}");
        }
    }

    #[test]
    fn delegates_partitions_must_have_nodes_of_their_own() {
        let ours = ["course".to_owned()];
        let ok = rows("c1|course|\nc2|course|\ng1|general*|\n");
        assert_eq!(
            partition_overlap(&ok, &ours).unwrap(),
            "delegate's partitions course have 2 node(s) of their own: c1, c2"
        );
        let shared = rows("c1|course|\nc1|general*|\n");
        assert!(partition_overlap(&shared, &ours)
            .unwrap_err()
            .starts_with("node c1 is in delegate's partition course and in general"));
        assert_eq!(
            partition_overlap(&rows("g1|general*|\n"), &ours).unwrap_err(),
            "the site policy's partition course has no node in Slurm"
        );
    }

    #[test]
    fn tuning_is_informational_and_says_what_the_node_has() {
        let none = tempfile::tempdir().expect("tmp");
        let c = tuning_check(none.path());
        assert!(c.ok && c.detail.starts_with("no cpufreq on this node"), "{}", c.detail);
        let node = tempfile::tempdir().expect("tmp");
        let d = node.path().join("sys/devices/system/cpu/cpu0/cpufreq");
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(d.join("scaling_governor"), "powersave\n").expect("w");
        std::fs::write(d.join("scaling_available_governors"), "performance powersave\n").expect("w");
        let boost = node.path().join("sys/devices/system/cpu/cpufreq");
        std::fs::create_dir_all(&boost).expect("dir");
        std::fs::write(boost.join("boost"), "1\n").expect("w");
        let c = tuning_check(node.path());
        assert_eq!(
            c.detail,
            "governor powersave now (calls run at performance while they run), boost on"
        );
    }
}

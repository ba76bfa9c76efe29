//! Golden files: each configuration file as the deployment renders it for
//! fixed settings, compared whole with `tests/golden/<name>`. After an
//! intended change: `UPDATE_GOLDEN=1 cargo test -p delegate-deploy`, then
//! read the diff.

#![allow(clippy::unwrap_used)] // a test: a failure is a panic with its message

use std::path::{Path, PathBuf};

use delegate_deploy::lockdown::GateForm;
use delegate_deploy::slurm_conf::LocalNode;
use delegate_deploy::stack_file::Facts;
use delegate_deploy::{gres, lockdown, site_policy, slurm_conf, stack_file, Settings, Shape, MARKER};

fn golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    if want != text {
        let line = want
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(text.lines().count()));
        panic!(
            "{name} differs from its golden file at line {}:\n  golden:   {:?}\n  rendered: {:?}\n(UPDATE_GOLDEN=1 rewrites it)",
            line + 1,
            want.lines().nth(line),
            text.lines().nth(line)
        );
    }
}

/// The local settings build_cluster.sh has by default.
fn local_settings() -> Settings {
    Settings::from_pairs([
        ("DELEGATE_STATE_DIR", "/var/lib/delegate"),
        ("DELEGATE_LOG_DIR", "/var/log/delegate"),
        ("DELEGATE_RUN_DIR", "/run/delegate"),
        ("DELEGATE_DBD_PORT", "6819"),
        ("DELEGATE_SLURMD_TIMEOUT", "60"),
        ("DELEGATE_LOCAL_GPUS", "auto"),
        ("DELEGATE_SANDBOX_IMAGE", "delegate-sandbox:latest"),
        ("DELEGATE_MAX_CPUS", "2"),
        ("DELEGATE_MAX_MEM", ""),
        ("DELEGATE_MAX_TIME", "1h"),
        ("DELEGATE_MAX_PIDS", "512"),
        ("DELEGATE_TMP_SIZE", "256M"),
        ("DELEGATE_ACCOUNTING", "1"),
    ])
}

/// cluster.toml's defaults (two workers), elastic on or off.
fn stack_settings(elastic: bool) -> Settings {
    Settings::from_pairs([
        ("DELEGATE_STACK_NAME", "delegate"),
        ("DELEGATE_STACK_WORKERS", "2"),
        ("DELEGATE_STACK_HOME", "/srv/delegate-stack/home"),
        ("DELEGATE_STACK_WORKER_CPUS", "2"),
        ("DELEGATE_STACK_WORKER_MEM_MB", "1024"),
        ("DELEGATE_STACK_WORKER_GPUS", if elastic { "0" } else { "2" }),
        ("DELEGATE_STACK_FIRST_JOB_ID", "30000000"),
        ("DELEGATE_STACK_MAX_CPUS", "2"),
        ("DELEGATE_STACK_MAX_MEM", "1024M"),
        ("DELEGATE_STACK_MAX_TIME", "1h"),
        ("DELEGATE_STACK_MAX_PIDS", "512"),
        ("DELEGATE_STACK_TMP_SIZE", "256M"),
        ("DELEGATE_SANDBOX_IMAGE", "delegate-sandbox:latest"),
        ("DELEGATE_DBD_PORT", "6819"),
        ("DELEGATE_SLURMD_TIMEOUT", "60"),
        ("DELEGATE_ELASTIC", if elastic { "1" } else { "0" }),
        ("DELEGATE_ELASTIC_MIN", "1"),
        ("DELEGATE_ELASTIC_MAX", "3"),
        ("DELEGATE_ELASTIC_IDLE", "600"),
        ("DELEGATE_ELASTIC_RESUME_TIMEOUT", "180"),
        ("DELEGATE_STACK_DIR", "/srv/delegate-stack"),
        ("DELEGATE_STACK_STAGING", "/run/delegate-stack"),
        ("DELEGATE_CLUSTER_IMAGE", "delegate-cluster:latest"),
        ("DELEGATE_USER_IMAGE", "delegate-user:latest"),
        ("DELEGATE_DB_IMAGE", "delegate-db:latest"),
        ("DELEGATE_DB_NAME", "delegate_acct_db"),
        ("DELEGATE_JUPYTER_PORT", "8888"),
        ("DELEGATE_HUB_MEM_LIMIT", "2G"),
        ("DELEGATE_HUB_NPROC_LIMIT", "256"),
        ("DELEGATE_HUB_IDLE_TIMEOUT", "3600"),
        ("DELEGATE_HUB_STUDENT_MEM", "2G"),
        ("DELEGATE_HUB_STUDENT_CPUS", "1"),
        ("DELEGATE_USER_NODE_CPUS", "2"),
        ("DELEGATE_USER_NODE_MEM", "8G"),
        ("DELEGATE_RPC_RATE", "20"),
        ("DELEGATE_RPC_BURST", "60"),
        ("DELEGATE_RPC_CONNS", "8"),
        ("DELEGATE_STACK_WORKER_SCRATCH", "256M"),
        ("DELEGATE_USER_NODE_SCRATCH", "1G"),
        ("DELEGATE_POWER_HOOK", ""),
        ("DELEGATE_STACK_PLACEMENT", "0"),
    ])
}

fn facts(replicas: &[u8]) -> Facts {
    Facts {
        replicas: replicas.to_vec(),
        config_version: "e4569b270a".into(),
        key_version: "4de444640a".into(),
        hub_version: "ba4e3f976b".into(),
        db_version: "fe1f64d897".into(),
        db_volume: "delegate-accounting-db".into(),
        ctld_volume: "delegate-slurmctld-state".into(),
        cgroup_memory: "/sys/fs/cgroup/delegate-hub-delegate".into(),
        cgroup_cpu: "/sys/fs/cgroup/delegate-hub-delegate".into(),
        ..Facts::default()
    }
}

/// The facts of a deploy onto worker machines, whose images come from the
/// course's registry.
fn registry_facts(replicas: &[u8]) -> Facts {
    let digest = "sha256:".to_owned() + &"ab12".repeat(16);
    Facts {
        worker_image: format!("172.31.90.1:5000/delegate/cluster@{digest}"),
        sandbox_pull: format!("172.31.90.1:5000/delegate/sandbox@{digest}"),
        registry_version: "0c1a2b3d4e".into(),
        ..facts(replicas)
    }
}

fn node(gpus: u64) -> LocalNode {
    LocalNode {
        node: "vm".into(),
        hardware: "CPUs=2 RealMemory=24000".into(),
        gpus,
        slurm_user: "slurm".into(),
    }
}

#[test]
fn slurm_conf_of_each_shape() {
    golden(
        "slurm.conf.local",
        &slurm_conf::render(&local_settings(), Shape::Local, Some(&node(0))).unwrap(),
    );
    golden(
        "slurm.conf.local-gpus",
        &slurm_conf::render(&local_settings(), Shape::Local, Some(&node(2))).unwrap(),
    );
    // The offline bundle's GPU machine: no slurmdbd.
    golden(
        "slurm.conf.local-no-accounting",
        &slurm_conf::render(&local_settings().with("DELEGATE_ACCOUNTING", "0"), Shape::Local, Some(&node(1))).unwrap(),
    );
    golden(
        "slurm.conf.stack",
        &slurm_conf::render(&stack_settings(false), Shape::Stack, None).unwrap(),
    );
    golden(
        "slurm.conf.stack-elastic",
        &slurm_conf::render(&stack_settings(true), Shape::Stack, None).unwrap(),
    );
}

#[test]
fn gres_conf_of_each_shape() {
    golden(
        "gres.conf.local",
        &gres::render(&local_settings(), Shape::Local, "vm", 2, "/dev/nvidia[0-1]").unwrap(),
    );
    golden(
        "gres.conf.local-none",
        &gres::render(&local_settings(), Shape::Local, "vm", 0, "").unwrap(),
    );
    golden(
        "gres.conf.stack",
        &gres::render(&stack_settings(false), Shape::Stack, "", 0, "").unwrap(),
    );
}

#[test]
fn policy_of_each_shape() {
    golden(
        "policy.toml.local",
        &site_policy::render(&local_settings(), Shape::Local, 0, 24 * 1024 * 1024).unwrap(),
    );
    golden(
        "policy.toml.stack",
        &site_policy::render(&stack_settings(true), Shape::Stack, 0, 0).unwrap(),
    );
}

#[test]
fn gate_and_plugstack() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        site_policy::render(&stack_settings(false), Shape::Stack, 0, 0).unwrap(),
    )
    .unwrap();
    let runner = "/usr/local/bin/sandbox-runner";
    golden(
        "job_submit.lua.stack",
        &lockdown::gate(Some(runner), &policy, "delegate-admin", 64030, GateForm::Whole).unwrap(),
    );
    // Before the local policy exists: the policy's defaults.
    let none = dir.path().join("absent.toml");
    golden(
        "job_submit.lua.defaults",
        &lockdown::gate(Some(runner), &none, "delegate-admin", 64030, GateForm::Whole).unwrap(),
    );
    golden(
        "plugstack.conf",
        &lockdown::plugstack("/usr/local/lib/delegate/delegate_lockdown.so", 3990, runner, &[]).unwrap(),
    );
    // A cluster shared with plain Slurm jobs: delegate's partition and its nodes.
    let shared = dir.path().join("shared.toml");
    let settings = stack_settings(false).with("DELEGATE_PARTITIONS", "course");
    let text = site_policy::render(&settings, Shape::Stack, 0, 0).unwrap();
    assert!(text.contains("\npartitions = [\"course\"]\n"), "{text}");
    std::fs::write(&shared, text).unwrap();
    golden(
        "job_submit.lua.partitions",
        &lockdown::gate(Some(runner), &shared, "delegate-admin", 64030, GateForm::Whole).unwrap(),
    );
    golden(
        "job_submit.lua.module",
        &lockdown::gate(Some(runner), &shared, "delegate-admin", 64030, GateForm::Module).unwrap(),
    );
    let nodes = ["c1".to_owned(), "c2".to_owned()];
    golden(
        "plugstack.conf.nodes",
        &lockdown::plugstack("/usr/local/lib/delegate/delegate_lockdown.so", 3990, runner, &nodes).unwrap(),
    );
    let bad = ["c1;rm".to_owned()];
    let e = lockdown::plugstack("/l.so", 1, runner, &bad).unwrap_err().to_string();
    assert_eq!(e, "\"c1;rm\" is not a node name");
    let e = site_policy::render(&stack_settings(false).with("DELEGATE_PARTITIONS", "a,b"), Shape::Stack, 0, 0)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "DELEGATE_PARTITIONS must be partition names separated by spaces, not \"a,b\""
    );
}

#[test]
fn stack_file_fixed_elastic_and_placed() {
    golden(
        "delegate-stack.yml",
        &stack_file::render(&stack_settings(false), &facts(&[1, 1])).unwrap(),
    );
    golden(
        "delegate-stack.yml.elastic",
        &stack_file::render(&stack_settings(true), &facts(&[1, 0, 1])).unwrap(),
    );
    let placed = stack_settings(false)
        .with("DELEGATE_STACK_PLACEMENT", "1")
        .with("DELEGATE_STACK_SLOTS", "3");
    let e = stack_file::render(&placed, &registry_facts(&[1, 1])).unwrap_err().to_string();
    assert!(
        e.contains("--replicas must give 0 or 1 for each of the 3 workers, not [1, 1]"),
        "a service per slot: {e}"
    );
    let text = stack_file::render(&placed, &registry_facts(&[1, 1, 0])).unwrap();
    golden("delegate-stack.yml.placed", &text);
    // Slurm knows every slot, each FUTURE until its machine's slurmd
    // registers: `machine add` on a running course changes no file.
    let conf = slurm_conf::render(&placed, Shape::Stack, None).unwrap();
    assert!(
        conf.contains("\nNodeName=worker[1-3] CPUs=") && conf.contains(" State=FUTURE\n"),
        "{conf}"
    );
    assert!(conf.contains(" Nodes=worker[1-3] "), "{conf}");
    // The workers run the registry's image and pull its sandbox image; the
    // manager's services keep the local images.
    assert_eq!(text.matches("image: 172.31.90.1:5000/delegate/cluster@sha256:").count(), 3);
    assert_eq!(text.matches("DELEGATE_SANDBOX_PULL: \"172.31.90.1:5000/").count(), 3);
    assert_eq!(
        text.matches("source: registry_auth, target: registry-auth.json, mode: 0400")
            .count(),
        3
    );
    // Each worker on its own machine, by the label `machine add` gave it.
    for i in 1..=3 {
        let want = format!("constraints: [\"node.labels.delegate.worker == {i}\"]");
        assert_eq!(text.matches(&want).count(), 1, "{want}");
    }
    assert_eq!(text.matches("constraints: [\"node.labels.delegate.role == user\"]").count(), 1);
    // A site's power hook replaces the power service.
    let hooked = stack_settings(true).with("DELEGATE_POWER_HOOK", "/usr/local/sbin/ipmi-power");
    let text = stack_file::render(&hooked, &facts(&[1, 0, 0])).unwrap();
    assert!(
        !text.contains("\n  power:\n") && text.contains("DELEGATE_ELASTIC_NODE"),
        "{text}"
    );
}

#[test]
fn stack_file_refuses_wrong_replicas_and_facts() {
    let err = stack_file::render(&stack_settings(false), &facts(&[1]))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("--replicas must give 0 or 1 for each of the 2 workers"),
        "{err}"
    );
    let mut f = facts(&[1, 1]);
    f.db_volume = "db\"; rm".into();
    let err = stack_file::render(&stack_settings(false), &f).unwrap_err().to_string();
    assert!(err.contains("database volume"), "{err}");
    // The registry's facts: all or none, each pinned by digest.
    let mut f = registry_facts(&[1, 1]);
    f.registry_version = String::new();
    let err = stack_file::render(&stack_settings(false), &f).unwrap_err().to_string();
    assert!(err.contains("go together"), "{err}");
    let mut f = registry_facts(&[1, 1]);
    f.worker_image = "172.31.90.1:5000/delegate/cluster:latest".into();
    let err = stack_file::render(&stack_settings(false), &f).unwrap_err().to_string();
    assert!(err.contains("worker image"), "{err}");
    let s = stack_settings(false).with("DELEGATE_RPC_RATE", "fast");
    let err = stack_file::render(&s, &facts(&[1, 1])).unwrap_err().to_string();
    assert_eq!(err, "DELEGATE_RPC_RATE must be a number from 0 to 999999, not 'fast'");
}

#[test]
fn every_file_starts_with_the_marker_build_cluster_checks() {
    let common = Path::new(env!("CARGO_MANIFEST_DIR")).join("../build_cluster.d/common.sh");
    let text = std::fs::read_to_string(common).unwrap();
    assert!(
        text.contains(&format!("MARKER=\"{MARKER}\"")),
        "build_cluster.d/common.sh's MARKER differs from delegate_deploy::MARKER"
    );
    let conf = slurm_conf::render(&local_settings(), Shape::Local, Some(&node(0))).unwrap();
    assert_eq!(conf.lines().next(), Some(MARKER));
}

#[test]
fn the_partitions_maxtime_follows_the_policy() {
    // A map's allocation: max_allocation_time (10m), max_time and 30 s for
    // the call in progress, plus the client's minute.
    assert_eq!(slurm_conf::part_maxtime("1h").unwrap(), "01:12:00");
    assert_eq!(slurm_conf::part_maxtime("90s").unwrap(), "00:13:00");
    assert_eq!(slurm_conf::part_maxtime("2d").unwrap(), "48:12:00");
    let s = local_settings().with("DELEGATE_MAX_TIME", "30m");
    let conf = slurm_conf::render(&s, Shape::Local, Some(&node(0))).unwrap();
    assert!(conf.contains("MaxTime=00:42:00 DefaultTime=00:42:00"), "{conf}");
}

#[test]
fn a_bad_setting_is_named_and_nothing_is_rendered() {
    let s = stack_settings(false).with("DELEGATE_STACK_WORKERS", "two");
    let err = slurm_conf::render(&s, Shape::Stack, None).unwrap_err().to_string();
    assert_eq!(err, "DELEGATE_STACK_WORKERS must be a number from 1 to 999, not 'two'");
    let s = stack_settings(false).with("DELEGATE_SANDBOX_IMAGE", "x\"; rm -rf /");
    let err = site_policy::render(&s, Shape::Stack, 0, 0).unwrap_err().to_string();
    assert!(err.starts_with("DELEGATE_SANDBOX_IMAGE must be a Docker image name"), "{err}");
    let s = stack_settings(false).with("DELEGATE_STACK_HOME", "/srv/home\"}\nmax_cpus = 999");
    let err = site_policy::render(&s, Shape::Stack, 0, 0).unwrap_err().to_string();
    assert!(err.starts_with("DELEGATE_STACK_HOME must be an absolute path"), "{err}");
    let s = local_settings().with("DELEGATE_MAX_TIME", "2h\nNodeName=evil");
    let err = slurm_conf::render(&s, Shape::Local, Some(&node(0))).unwrap_err().to_string();
    assert!(err.starts_with("DELEGATE_MAX_TIME must be a duration"), "{err}");
}

//! The container configuration, built as a pure function of the (already
//! validated) spec, the site policy and the perf mode, so that its security
//! properties can be unit tested without an engine.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountBindOptions, MountBindOptionsPropagationEnum,
    MountType, ResourcesUlimits,
};
use delegate_protocol::{Spec, Task, SANDBOX_JOB_DIR};

use crate::gpu::devices::Passthrough;
use crate::sandbox::seccomp;

pub const LABEL_JOB: &str = "delegate.job";
pub const LABEL_SLURM_JOB: &str = "delegate.slurm-job";
pub const LABEL_UID: &str = "delegate.uid";
pub const LABEL_PROBE: &str = "delegate.probe";
/// The Slurm node whose agent created the container (for the epilog's sweep).
pub const LABEL_NODE: &str = "delegate.node";
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The capability asked for in perfmon mode.
pub const CAP_PERFMON: &str = "CAP_PERFMON";

/// How the sandbox reaches perf counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Perf {
    /// `CAP_PERFMON` added (Docker 24+), engine's default seccomp profile.
    Perfmon,
    /// delegate's own seccomp profile allowing `perf_event_open`, no capability.
    Seccomp,
    /// Neither: the engine's defaults.
    Off,
}

/// The lowest `kernel.perf_event_paranoid` at which a sandbox without a
/// capability gets perf counters: 2 lets a process count its own threads,
/// in user space only. Below it a process may profile the kernel (1) or
/// every CPU of the node (0, -1).
pub const MIN_PERF_PARANOID: i32 = 2;

/// How the sandbox reaches perf counters, from the site's `perf_mode` and
/// the node's `kernel.perf_event_paranoid` (`None`: unreadable). `auto`
/// never adds CAP_PERFMON: with it (Docker 24+) a sandbox could profile
/// the kernel and watch the whole node, whatever the paranoid level; only
/// an explicit `perf_mode = "perfmon"` asks for it. Without the capability
/// the kernel's level decides what the sandbox may watch: below
/// [`MIN_PERF_PARANOID`] perf is off (and the reason says so).
pub fn perf_for(mode: delegate_protocol::policy::PerfMode, paranoid: Option<i32>) -> (Perf, Option<String>) {
    use delegate_protocol::policy::PerfMode;
    match mode {
        PerfMode::Off => (Perf::Off, None),
        PerfMode::Perfmon => (Perf::Perfmon, None),
        PerfMode::Auto | PerfMode::Seccomp => match paranoid {
            Some(p) if p >= MIN_PERF_PARANOID => (Perf::Seccomp, None),
            Some(p) => (
                Perf::Off,
                Some(format!(
                    "perf counters are off: this node's kernel.perf_event_paranoid is {p} (below {MIN_PERF_PARANOID} a sandbox could watch the kernel or the whole node)"
                )),
            ),
            None => (
                Perf::Off,
                Some("perf counters are off: this node's kernel.perf_event_paranoid cannot be read".into()),
            ),
        },
    }
}

/// This node's `kernel.perf_event_paranoid`.
pub fn perf_paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl Perf {
    pub fn as_str(self) -> &'static str {
        match self {
            Perf::Perfmon => "perfmon",
            Perf::Seccomp => "seccomp",
            Perf::Off => "off",
        }
    }
}

/// Everything the container configuration depends on.
#[derive(Clone, Debug)]
pub struct Params<'a> {
    pub spec: &'a Spec,
    /// The bind source: the agent's staging mount of the checked job
    /// directory, as the engine sees it (never a path the user can rename).
    pub job_dir: &'a Path,
    /// The uid and gid the sandbox runs as.
    pub uid: u32,
    pub gid: u32,
    /// The Slurm job id the agent verified with slurmctld.
    pub slurm_job: &'a str,
    pub tmp_bytes: u64,
    pub max_pids: i64,
    pub perf: Perf,
    /// RLIMIT_NOFILE (soft = hard).
    pub max_open_files: u32,
    /// RLIMIT_FSIZE in bytes (0: none).
    pub max_file_bytes: u64,
    /// This node's Slurm name.
    pub node: &'a str,
    /// The GPUs Slurm allocated to the job (none for most jobs).
    pub gpus: &'a Passthrough,
    /// The sandbox's own cores (`"1"`, `"2,3"`), replacing the CPU quota;
    /// `None`: a quota of the spec's cpus.
    pub cpuset: Option<&'a str>,
}

/// The command the container runs.
pub fn command(task: &Task) -> Vec<String> {
    match task {
        Task::Command { argv } => argv.clone(),
        Task::Python { .. } => ["python3", "-m", "delegate_sandbox", SANDBOX_JOB_DIR]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    }
}

/// Environment of the sandbox: ours first, then the spec's (which may
/// override HOME or PATH but not DELEGATE_JOB_ID, the GPU variables
/// `gpu_env` sets, or any `NVIDIA_*`: an engine whose default runtime is
/// NVIDIA's would read `NVIDIA_VISIBLE_DEVICES=all` as a grant of every GPU).
pub fn environment(spec: &Spec, gpu_env: &[String]) -> Vec<String> {
    let mut env = vec![format!("HOME={SANDBOX_JOB_DIR}"), format!("PATH={SANDBOX_PATH}")];
    let ours = |k: &str| {
        k == "DELEGATE_JOB_ID"
            || k.starts_with("NVIDIA_")
            || gpu_env.iter().any(|e| e.split_once('=').is_some_and(|(n, _)| n == k))
    };
    env.extend(spec.env.iter().filter(|(k, _)| !ours(k)).map(|(k, v)| format!("{k}={v}")));
    env.extend(gpu_env.iter().cloned());
    env.push(format!("DELEGATE_JOB_ID={}", spec.job_id));
    env
}

pub fn labels(job: &str, slurm_job: &str, uid: u32) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_JOB.to_string(), job.to_string()),
        (LABEL_SLURM_JOB.to_string(), slurm_job.to_string()),
        (LABEL_UID.to_string(), uid.to_string()),
    ])
}

/// Security-relevant host configuration shared by jobs and the probe.
pub fn base_host_config(tmp_bytes: u64, max_pids: i64, perf: Perf) -> HostConfig {
    let mut security_opt = vec!["no-new-privileges:true".to_string()];
    let mut cap_add = None;
    match perf {
        Perf::Perfmon => cap_add = Some(vec![CAP_PERFMON.to_string()]),
        Perf::Seccomp => security_opt.push(format!("seccomp={}", seccomp::profile_json())),
        Perf::Off => {}
    }
    HostConfig {
        network_mode: Some("none".into()),
        readonly_rootfs: Some(true),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            format!("rw,nosuid,nodev,size={tmp_bytes}"),
        )])),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add,
        security_opt: Some(security_opt),
        privileged: Some(false),
        pids_limit: Some(max_pids),
        ipc_mode: Some("private".into()),
        // Output is taken from the attach stream; the engine keeps no log.
        log_config: Some(HostConfigLogConfig { typ: Some("none".into()), config: None }),
        binds: None,
        mounts: None,
        auto_remove: Some(false),
        ..Default::default()
    }
}

/// The whole container configuration for a job.
pub fn container_config(p: &Params<'_>) -> ContainerCreateBody {
    let spec = p.spec;
    let mem = i64::try_from(spec.resources.mem_bytes).unwrap_or(i64::MAX);
    let mut host = base_host_config(p.tmp_bytes, p.max_pids, p.perf);
    host.mounts = Some(vec![Mount {
        typ: Some(MountType::BIND),
        source: Some(p.job_dir.display().to_string()),
        target: Some(SANDBOX_JOB_DIR.into()),
        read_only: Some(false),
        bind_options: Some(MountBindOptions {
            propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    // No core dumps (a large process would leave a file of its size in
    // /job), a sane number of open files, and no single file past the
    // job's byte limit (SIGXFSZ; the agent's watcher caps the sum).
    let mut ulimits = vec![
        ResourcesUlimits {
            name: Some("core".into()),
            soft: Some(0),
            hard: Some(0),
        },
        ResourcesUlimits {
            name: Some("nofile".into()),
            soft: Some(i64::from(p.max_open_files)),
            hard: Some(i64::from(p.max_open_files)),
        },
    ];
    if p.max_file_bytes > 0 {
        let b = i64::try_from(p.max_file_bytes).unwrap_or(i64::MAX);
        ulimits.push(ResourcesUlimits {
            name: Some("fsize".into()),
            soft: Some(b),
            hard: Some(b),
        });
    }
    host.ulimits = Some(ulimits);
    host.memory = Some(mem);
    host.memory_swap = Some(mem);
    match p.cpuset {
        Some(cpus) => host.cpuset_cpus = Some(cpus.to_string()),
        None => host.nano_cpus = Some(i64::from(spec.resources.cpus).saturating_mul(1_000_000_000)),
    }
    let mut body = ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: Some(command(&spec.task)),
        // The image's entrypoint (if any, e.g. an init such as tini) is
        // kept: images come from the site's allowlist.
        user: Some(format!("{}:{}", p.uid, p.gid)),
        working_dir: Some(SANDBOX_JOB_DIR.into()),
        env: Some(environment(spec, &p.gpus.environment())),
        labels: Some({
            let mut l = labels(spec.job_id.as_str(), p.slurm_job, p.uid);
            l.insert(LABEL_NODE.to_string(), p.node.to_string());
            l
        }),
        attach_stdin: Some(false),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(false),
        tty: Some(false),
        network_disabled: Some(true),
        host_config: Some(host),
        hostname: sandbox_hostname(p.node),
        ..Default::default()
    };
    p.gpus.apply(&mut body);
    body
}

/// The sandbox's hostname: the node's name, what a student expects
/// `hostname` to say (was the container's id); the engine's default when
/// the name is not a plain host name (RFC 1123 label).
pub fn sandbox_hostname(node: &str) -> Option<String> {
    let label_ok = !node.is_empty()
        && node.len() <= 63
        && node.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !node.starts_with('-')
        && !node.ends_with('-');
    label_ok.then(|| node.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use delegate_protocol::{now_ms, JobId, Resources};

    fn spec() -> Spec {
        Spec {
            job_id: JobId::new(),
            uid: 2001,
            gid: 2001,
            created_ms: now_ms(),
            image: "delegate-sandbox:latest".into(),
            task: Task::Command { argv: vec!["echo".into(), "hi".into()] },
            resources: Resources {
                cpus: 2,
                mem_bytes: 512 << 20,
                ..Resources::default()
            },
            env: vec![
                ("FOO".into(), "bar".into()),
                ("DELEGATE_JOB_ID".into(), "evil".into()),
                ("NVIDIA_VISIBLE_DEVICES".into(), "all".into()),
                ("CUDA_VISIBLE_DEVICES".into(), "5".into()),
            ],
        }
    }

    fn build(perf: Perf) -> ContainerCreateBody {
        build_with(perf, &Passthrough::none())
    }

    fn build_with(perf: Perf, gpus: &Passthrough) -> ContainerCreateBody {
        let s = spec();
        container_config(&params(&s, perf, gpus))
    }

    /// A test job's parameters (cpuset: none, the CFS quota).
    fn params<'a>(s: &'a Spec, perf: Perf, gpus: &'a Passthrough) -> Params<'a> {
        Params {
            spec: s,
            job_dir: Path::new("/home/u/.delegate/jobs/x"),
            uid: 2001,
            gid: 2001,
            slurm_job: "42",
            tmp_bytes: 256 << 20,
            max_pids: 512,
            perf,
            max_open_files: 1024,
            max_file_bytes: 1 << 30,
            node: "n1",
            gpus,
            cpuset: None,
        }
    }

    #[test]
    fn cores_of_its_own_replace_the_quota() {
        let s = spec();
        let none = Passthrough::none();
        let p = Params {
            cpuset: Some("2,3"),
            ..params(&s, Perf::Seccomp, &none)
        };
        let h = container_config(&p).host_config.unwrap();
        assert_eq!(h.cpuset_cpus.as_deref(), Some("2,3"));
        assert_eq!(h.nano_cpus, None);
    }

    #[test]
    fn sandbox_is_locked_down() {
        for perf in [Perf::Perfmon, Perf::Seccomp, Perf::Off] {
            let c = build(perf);
            let h = c.host_config.clone().unwrap();
            assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
            assert_eq!(h.network_mode.as_deref(), Some("none"));
            assert_eq!(h.readonly_rootfs, Some(true));
            assert_eq!(h.privileged, Some(false));
            assert_eq!(h.ipc_mode.as_deref(), Some("private"));
            assert!(h.binds.is_none());
            let mounts = h.mounts.clone().unwrap();
            assert_eq!(mounts.len(), 1, "only the job directory is mounted");
            assert_eq!(mounts[0].source.as_deref(), Some("/home/u/.delegate/jobs/x"));
            assert_eq!(mounts[0].target.as_deref(), Some("/job"));
            assert_eq!(mounts[0].typ, Some(MountType::BIND));
            assert!(h.volumes_from.is_none() && h.devices.is_none());
            assert!(h.pid_mode.is_none() && h.userns_mode.is_none() && h.uts_mode.is_none());
            let sec = h.security_opt.clone().unwrap();
            assert!(sec.contains(&"no-new-privileges:true".to_string()));
            assert!(!sec.iter().any(|s| s.contains("unconfined")));
            let caps = h.cap_add.clone().unwrap_or_default();
            assert!(!caps.iter().any(|c| c.contains("SYS_ADMIN")));
            assert_eq!(h.memory, Some(512 << 20));
            assert_eq!(h.memory_swap, Some(512 << 20));
            assert_eq!(h.nano_cpus, Some(2_000_000_000));
            assert_eq!(h.pids_limit, Some(512));
            assert_eq!(
                h.tmpfs.unwrap().get("/tmp").map(String::as_str),
                Some("rw,nosuid,nodev,size=268435456")
            );
            assert_eq!(c.user.as_deref(), Some("2001:2001"));
            assert_eq!(c.working_dir.as_deref(), Some("/job"));
            assert_eq!(c.tty, Some(false));
            assert_eq!(c.network_disabled, Some(true));
            assert_eq!(c.hostname.as_deref(), Some("n1"), "the node's name");
            let ul = h.ulimits.clone().unwrap();
            let get = |n: &str| ul.iter().find(|u| u.name.as_deref() == Some(n)).map(|u| (u.soft, u.hard));
            assert_eq!(get("core"), Some((Some(0), Some(0))));
            assert_eq!(get("nofile"), Some((Some(1024), Some(1024))));
            assert_eq!(get("fsize"), Some((Some(1 << 30), Some(1 << 30))));
        }
    }

    #[test]
    fn the_sandbox_is_named_after_its_node() {
        assert_eq!(sandbox_hostname("worker1").as_deref(), Some("worker1"));
        assert_eq!(sandbox_hostname("vm").as_deref(), Some("vm"));
        for bad in ["", "-a", "a-", "a.b", "a b", "a_b", &"x".repeat(64)] {
            assert_eq!(sandbox_hostname(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn perf_modes() {
        let h = build(Perf::Perfmon).host_config.unwrap();
        assert_eq!(h.cap_add, Some(vec!["CAP_PERFMON".to_string()]));
        assert!(!h.security_opt.unwrap().iter().any(|s| s.starts_with("seccomp=")));
        let h = build(Perf::Seccomp).host_config.unwrap();
        assert!(h.cap_add.is_none());
        let sec = h.security_opt.unwrap();
        let prof = sec.iter().find_map(|s| s.strip_prefix("seccomp=")).unwrap();
        assert!(prof.contains("perf_event_open"));
        let h = build(Perf::Off).host_config.unwrap();
        assert!(h.cap_add.is_none());
        assert_eq!(h.security_opt, Some(vec!["no-new-privileges:true".to_string()]));
    }

    #[test]
    fn env_labels_and_command() {
        let c = build(Perf::Off);
        let env = c.env.unwrap();
        assert_eq!(env[0], "HOME=/job");
        assert!(env.contains(&format!("PATH={SANDBOX_PATH}")));
        assert!(env.contains(&"FOO=bar".to_string()));
        assert!(!env.contains(&"DELEGATE_JOB_ID=evil".to_string()));
        assert!(env.last().unwrap().starts_with("DELEGATE_JOB_ID="));
        // No GPUs: the spec's NVIDIA_* never reaches the engine, and an
        // NVIDIA default runtime is told to inject none.
        assert!(!env.contains(&"NVIDIA_VISIBLE_DEVICES=all".to_string()));
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
        let g = Passthrough {
            mode: crate::gpu::devices::Mode::Devices,
            devices: vec!["/dev/delegate-gpu1".into()],
            ordinals: vec![1],
            control: vec![],
        };
        let c = build_with(Perf::Off, &g);
        let env = c.env.unwrap();
        assert!(env.contains(&"CUDA_VISIBLE_DEVICES=0".to_string()), "{env:?}");
        assert!(!env.contains(&"CUDA_VISIBLE_DEVICES=5".to_string()), "{env:?}");
        let devs = c.host_config.unwrap().devices.unwrap();
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].path_in_container.as_deref(), Some("/dev/delegate-gpu1"));
        let labels = c.labels.unwrap();
        assert_eq!(labels.get(LABEL_SLURM_JOB).map(String::as_str), Some("42"));
        assert_eq!(labels.get(LABEL_UID).map(String::as_str), Some("2001"));
        assert_eq!(c.cmd, Some(vec!["echo".to_string(), "hi".to_string()]));
        let py = command(&Task::Python {
            python_version: "3.11".into(),
            cloudpickle_version: "3".into(),
        });
        assert_eq!(py, ["python3", "-m", "delegate_sandbox", "/job"]);
    }

    #[test]
    fn auto_never_asks_for_perfmon_and_needs_paranoid_2() {
        use delegate_protocol::policy::PerfMode;
        assert_eq!(perf_for(PerfMode::Auto, Some(2)), (Perf::Seccomp, None));
        assert_eq!(perf_for(PerfMode::Auto, Some(3)).0, Perf::Seccomp);
        assert_eq!(perf_for(PerfMode::Seccomp, Some(2)).0, Perf::Seccomp);
        let (p, why) = perf_for(PerfMode::Auto, Some(-1));
        assert_eq!(p, Perf::Off);
        assert!(why.expect("a reason").contains("perf_event_paranoid is -1"));
        assert_eq!(perf_for(PerfMode::Auto, None).0, Perf::Off);
        assert_eq!(perf_for(PerfMode::Perfmon, Some(-1)).0, Perf::Perfmon);
        assert_eq!(perf_for(PerfMode::Off, Some(2)).0, Perf::Off);
    }
}

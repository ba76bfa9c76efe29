//! The site policy: a root-owned TOML file on every worker
//! (`/etc/delegate/policy.toml` by default). The runner trusts only this
//! file, never the user's spec, for what a job may have.
//!
//! ```toml
//! allowed_images = ["delegate-sandbox:latest"]
//! default_image = "delegate-sandbox:latest"
//! max_cpus = 2
//! max_mem = "4G"
//! max_time = "1h"
//! max_pids = 512
//! max_gpus = 0                # GPUs (Slurm GRES "gpu") one job may ask for
//! gpu_mode = "auto"           # auto | devices | nvidia | cdi: how allocated GPUs reach the sandbox
//! gres_conf = "/etc/slurm/gres.conf"  # where the agent reads this node's GPU device files
//! max_nodes = 1
//! max_retries = 2             # times a call may run again after its node was lost (0 to 10)
//! tmp_size = "256M"
//! perf_mode = "auto"          # auto | perfmon | seccomp | off
//! job_roots = ["/home"]       # job directories must live below one of these
//! docker_socket = "/var/run/docker.sock"
//! allow_root = false          # jobs of uid 0 are refused unless true
//! calls_per_allocation = 100  # a map's calls share exclusive allocations, at most this many each
//! max_output = "256M"         # stdout + stderr bytes of one call; past it output is dropped
//! output_limit = "truncate"   # truncate (the call goes on) | stop (the call is stopped)
//! max_job_bytes = "1G"        # bytes under /job (the job directory) while a call runs
//! max_open_files = 1024       # RLIMIT_NOFILE in the sandbox
//! agent_socket = "/run/delegate/agent.sock"
//! staging_dir = "/run/delegate/jobs"  # where the agent pins job directories (root-owned)
//! staging_host_dir = ""       # the same directory as the engine sees it, when it differs
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::units::{format_duration, format_size, parse_duration, parse_size};
use crate::{check_clean_absolute, Spec};

pub const DEFAULT_POLICY_PATH: &str = "/etc/delegate/policy.toml";
/// Environment variable naming another policy file. Honoured only by
/// programs that are not privileged (the CLI, tests); the runner ignores it.
pub const POLICY_ENV: &str = "DELEGATE_POLICY";
const MAX_POLICY_BYTES: u64 = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PerfMode {
    /// The seccomp profile (no capability) where the node's
    /// `kernel.perf_event_paranoid` is 2 or more, else no perf access.
    /// Never CAP_PERFMON (kernel profiling, every CPU of the node).
    Auto,
    /// CAP_PERFMON (Docker 24+): the sandbox may also profile the kernel
    /// and watch the whole node; only where the site wants that. Jobs fail
    /// where the engine rejects it.
    Perfmon,
    /// The seccomp profile that permits perf_event_open, no capability.
    Seccomp,
    /// No perf access: the engine's default seccomp profile.
    Off,
}

/// How the agent hands a job's allocated GPUs to its sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMode {
    /// CDI specs for `nvidia.com/gpu` with an engine that reads them, else
    /// the NVIDIA container runtime when the engine has one, else devices.
    Auto,
    /// The allocated device nodes only (and NVIDIA's control nodes when
    /// present); the image brings its own user-space driver libraries.
    Devices,
    /// Docker's `nvidia` device driver (the NVIDIA container toolkit): the
    /// allocated GPUs by index, the host's driver libraries mounted in.
    Nvidia,
    /// CDI device names `nvidia.com/gpu=<index>` (Docker 25+ with CDI on).
    Cdi,
}

/// What happens to a call whose output passes `max_output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputLimit {
    /// The rest of the output is dropped (counted); the call goes on.
    Truncate,
    /// The call is stopped.
    Stop,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub allowed_images: Vec<String>,
    pub default_image: String,
    pub max_cpus: u32,
    pub max_mem: String,
    pub max_time: String,
    pub max_pids: i64,
    pub max_gpus: u32,
    /// How allocated GPUs reach the sandbox (the agent detects in `auto`).
    pub gpu_mode: GpuMode,
    /// Slurm's gres.conf on this node: its `Name=gpu File=...` lines are
    /// the device files behind the allocation's GPU indexes.
    pub gres_conf: PathBuf,
    pub max_nodes: u32,
    /// How many times a call may run again after its node was lost (the
    /// `retries` a call asks for, default [`crate::attempt::DEFAULT_RETRIES`]
    /// or this when lower; at most [`crate::attempt::MAX_RETRIES`]).
    pub max_retries: u32,
    pub tmp_size: String,
    pub perf_mode: PerfMode,
    /// On an exclusive node: the sandbox on cores of its own (a cpuset of
    /// the highest cores of the allocation) instead of a CFS quota, and
    /// the runner and the agent on the other cores while it runs. Off where
    /// "nodes" share a machine's cores (the stack's workers).
    pub pin_cpus: bool,
    /// While a call runs, its cores at the `performance` governor and
    /// turbo/boost off where the node's cpufreq allows (restored after);
    /// the call's fingerprint says what was done and what could not be.
    pub tune_cpus: bool,
    pub job_roots: Vec<PathBuf>,
    pub docker_socket: PathBuf,
    pub allow_root: bool,
    /// `1`: every call of a submission (a `map`) is its own Slurm job;
    /// above 1, a map's calls are pulled by its allocations (one per usable
    /// node, each running the next unclaimed call, each call still in its
    /// own fresh container). Read by the client when it submits.
    pub calls_per_allocation: u32,
    /// How long a map's allocation claims calls: once this old it runs no
    /// new call (the agent refuses one), and with calls left it requeues
    /// itself, so the rest waits in Slurm's queue again. It also steps
    /// aside between calls as soon as another user's job that has not run
    /// yet waits for the partition (a map's allocation that stepped aside
    /// before waits its turn). Its Slurm limit is this plus the call's own
    /// limit (and 30 s), which the site's job gate and the partition's
    /// MaxTime allow.
    pub max_allocation_time: String,
    /// Bytes of stdout plus stderr one call may produce (`0`: no limit).
    pub max_output: String,
    pub output_limit: OutputLimit,
    /// Bytes the job directory may hold while a call runs (the agent
    /// watches; it is also each file's RLIMIT_FSIZE). `0`: no limit.
    pub max_job_bytes: String,
    /// Files and directories the job directory may hold while a call runs
    /// (the agent counts them with the bytes). `0`: no limit.
    pub max_job_files: u64,
    /// RLIMIT_NOFILE of the sandbox.
    pub max_open_files: u32,
    /// After each job, the Slurm epilog (`slurm-conf/epilog.sh`, which
    /// reads this key itself) removes the job user's files from the node's
    /// `/tmp`, `/var/tmp` and `/dev/shm`. Only where the node is no user's
    /// login or notebook node.
    pub clean_scratch: bool,
    /// The agent's socket (the runner connects, the agent listens).
    pub agent_socket: PathBuf,
    /// Root-owned directory where the agent bind-mounts each running job
    /// directory (the only path the engine is given).
    pub staging_dir: PathBuf,
    /// The staging directory as the engine sees it, when the engine runs in
    /// another mount namespace (the stack's workers use the host's engine);
    /// empty: the same as `staging_dir`.
    pub staging_host_dir: PathBuf,
    /// The /proc that shows the engine's containers' processes, when the
    /// agent runs in another pid namespace than the engine (the stack's
    /// workers: the host's /proc bound read-only into a root-only
    /// directory); empty: the agent's own /proc. The agent reads the
    /// sandbox's deleted-but-open files there (the job directory's budget).
    pub host_proc: PathBuf,
    /// The Slurm partitions that are delegate's, on a cluster whose other
    /// partitions run plain Slurm jobs: the client submits to the first
    /// (unless `DELEGATE_PARTITION` names another), the job gate and the
    /// SPANK plugin lock down only these (and their nodes). Empty: the
    /// whole cluster is delegate's (Slurm's default partition).
    pub partitions: Vec<String>,
    /// The path of sandbox-runner on the workers: what delegate's batch
    /// scripts exec (the client writes it, the job gate and the SPANK
    /// plugin are rendered with it). `/usr/bin/sandbox-runner` where
    /// delegate's Debian packages installed it.
    pub runner: PathBuf,
    /// The size and time settings above in machine units, parsed once
    /// when the policy is read ([`Policy::limits`]).
    #[serde(skip)]
    limits: Limits,
}

/// Whether `name` can be a Slurm partition of the site policy: 1 to 64
/// letters, digits, `_`, `-` or `.`.
pub fn is_partition_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

impl Default for Policy {
    fn default() -> Self {
        let mut p = Policy {
            allowed_images: vec!["delegate-sandbox:latest".into()],
            default_image: "delegate-sandbox:latest".into(),
            max_cpus: 64,
            max_mem: "16G".into(),
            max_time: "1h".into(),
            max_pids: 512,
            max_gpus: 0,
            gpu_mode: GpuMode::Auto,
            gres_conf: PathBuf::from("/etc/slurm/gres.conf"),
            max_nodes: 1,
            max_retries: crate::attempt::DEFAULT_RETRIES,
            tmp_size: "256M".into(),
            perf_mode: PerfMode::Auto,
            pin_cpus: true,
            tune_cpus: true,
            job_roots: vec![PathBuf::from("/home")],
            docker_socket: PathBuf::from("/var/run/docker.sock"),
            allow_root: false,
            calls_per_allocation: 100,
            max_allocation_time: "10m".into(),
            max_output: "256M".into(),
            output_limit: OutputLimit::Truncate,
            max_job_bytes: "1G".into(),
            max_job_files: 100_000,
            max_open_files: 1024,
            clean_scratch: false,
            agent_socket: PathBuf::from(crate::agent::DEFAULT_AGENT_SOCKET),
            staging_dir: PathBuf::from("/run/delegate/jobs"),
            staging_host_dir: PathBuf::new(),
            host_proc: PathBuf::new(),
            partitions: Vec::new(),
            runner: PathBuf::from("/usr/local/bin/sandbox-runner"),
            limits: Limits::default(),
        };
        // (the defaults above are valid sizes and times)
        p.limits = p.parse_limits().unwrap_or_default();
        p
    }
}

/// A size limit: `0` or `"unlimited"` is 0 (no limit), else a size.
fn parse_limit(s: &str) -> Result<u64, crate::units::UnitError> {
    match s.trim() {
        "0" | "unlimited" => Ok(0),
        t => parse_size(t),
    }
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read the site policy {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("the site policy {path} is not owned by root or is writable by others; refusing to trust it")]
    Untrusted { path: String },
    #[error("the site policy {path} is invalid: {reason}")]
    Invalid { path: String, reason: String },
}

/// Why a job is refused by the policy. Each message is one sentence.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Violation {
    #[error("image {0:?} is not allowed by the site policy (allowed: {1})")]
    Image(String, String),
    #[error("{what} {asked} is more than the site maximum of {max}")]
    Limit {
        what: &'static str,
        asked: String,
        max: String,
    },
    #[error("jobs of uid 0 (root) are not allowed by the site policy")]
    Root,
    #[error("job directory {0} is not below an allowed job root ({1})")]
    OutsideRoots(String, String),
    #[error("the spec asks to run as uid {asked}, but the job runs as uid {actual}")]
    Uid { asked: u32, actual: u32 },
}

/// Seconds a map's allocation is given, on top of `max_allocation_time`
/// and the call's own limit, for the call in progress when it reaches its
/// bound (container create, start, removal; output draining): the client
/// asks Slurm for it, the gate and the partition's MaxTime allow it.
pub const MAP_CALL_ALLOWANCE_SECS: u64 = 30;

/// Policy values in machine units, parsed and checked once at load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_mem_bytes: u64,
    pub max_time_secs: u64,
    pub tmp_bytes: u64,
    pub max_output_bytes: u64,
    pub max_job_bytes: u64,
    pub max_allocation_secs: u64,
}

impl Policy {
    /// Loads the policy from `path`. With `require_root_owned`, the file must
    /// be owned by root and not writable by group or others (the runner).
    pub fn load(path: &Path, require_root_owned: bool) -> Result<Policy, PolicyError> {
        use std::os::unix::fs::MetadataExt;
        let p = path.display().to_string();
        let read_err = |e: std::io::Error| PolicyError::Read { path: p.clone(), reason: e.to_string() };
        let meta = std::fs::symlink_metadata(path).map_err(read_err)?;
        if require_root_owned && (meta.uid() != 0 || meta.mode() & 0o022 != 0 || !meta.is_file()) {
            return Err(PolicyError::Untrusted { path: p });
        }
        if meta.len() > MAX_POLICY_BYTES {
            return Err(PolicyError::Invalid {
                path: p,
                reason: format!("larger than {MAX_POLICY_BYTES} bytes"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Self::parse(&text, &p)
    }

    /// Parses and checks policy text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let mut policy: Policy = toml::from_str(text).map_err(|e| PolicyError::Invalid {
            path: origin.into(),
            reason: e.message().to_owned(),
        })?;
        policy.limits = policy
            .parse_limits()
            .map_err(|reason| PolicyError::Invalid { path: origin.into(), reason })?;
        if policy.max_retries > crate::attempt::MAX_RETRIES {
            return Err(PolicyError::Invalid {
                path: origin.into(),
                reason: format!("max_retries must be 0 to {}", crate::attempt::MAX_RETRIES),
            });
        }
        if policy.calls_per_allocation == 0 {
            return Err(PolicyError::Invalid {
                path: origin.into(),
                reason: "calls_per_allocation must be at least 1".into(),
            });
        }
        for p in [
            &policy.agent_socket,
            &policy.staging_dir,
            &policy.gres_conf,
            &policy.runner,
        ] {
            check_clean_absolute(p).map_err(|e| PolicyError::Invalid {
                path: origin.into(),
                reason: e.to_string(),
            })?;
        }
        if !policy.staging_host_dir.as_os_str().is_empty() {
            check_clean_absolute(&policy.staging_host_dir).map_err(|e| PolicyError::Invalid {
                path: origin.into(),
                reason: e.to_string(),
            })?;
        }
        if let Some(bad) = policy.partitions.iter().find(|p| !is_partition_name(p)) {
            return Err(PolicyError::Invalid {
                path: origin.into(),
                reason: format!("partitions: {bad:?} is not a partition name (letters, digits, _, - and .)"),
            });
        }
        for r in &policy.job_roots {
            check_clean_absolute(r).map_err(|e| PolicyError::Invalid {
                path: origin.into(),
                reason: e.to_string(),
            })?;
        }
        Ok(policy)
    }

    /// The policy a client uses: `$DELEGATE_POLICY`, else the default path,
    /// else built-in defaults when no file exists.
    pub fn load_for_client() -> Result<Policy, PolicyError> {
        let path = std::env::var_os(POLICY_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_POLICY_PATH));
        match Self::load(&path, false) {
            Err(PolicyError::Read { .. }) if !path.exists() => Ok(Policy::default()),
            other => other,
        }
    }

    /// The size and time limits in machine units, as parsed when the policy
    /// was read.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn parse_limits(&self) -> Result<Limits, String> {
        Ok(Limits {
            max_mem_bytes: parse_size(&self.max_mem).map_err(|e| format!("max_mem: {e}"))?,
            max_time_secs: parse_duration(&self.max_time).map_err(|e| format!("max_time: {e}"))?,
            tmp_bytes: parse_size(&self.tmp_size).map_err(|e| format!("tmp_size: {e}"))?,
            max_output_bytes: parse_limit(&self.max_output).map_err(|e| format!("max_output: {e}"))?,
            max_job_bytes: parse_limit(&self.max_job_bytes).map_err(|e| format!("max_job_bytes: {e}"))?,
            max_allocation_secs: match parse_duration(&self.max_allocation_time) {
                Ok(0) => return Err("max_allocation_time: must be more than 0".into()),
                Ok(s) => s,
                Err(e) => return Err(format!("max_allocation_time: {e}")),
            },
        })
    }

    /// Checks a spec against the policy, for a job that runs as `uid` from
    /// `job_dir`. Returns the first violation.
    pub fn check(&self, spec: &Spec, uid: u32, job_dir: &Path) -> Result<(), Violation> {
        if spec.uid != uid {
            return Err(Violation::Uid { asked: spec.uid, actual: uid });
        }
        if uid == 0 && !self.allow_root {
            return Err(Violation::Root);
        }
        if !self.job_roots.iter().any(|r| job_dir.starts_with(r) && job_dir != r) {
            return Err(Violation::OutsideRoots(
                job_dir.display().to_string(),
                self.job_roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        if !self.allowed_images.iter().any(|i| i == &spec.image) {
            return Err(Violation::Image(spec.image.clone(), self.allowed_images.join(", ")));
        }
        self.check_resources(&spec.resources)
    }

    /// Checks what a job asks for (CPUs, memory, time, GPUs, nodes)
    /// against the site's maxima: the runner for every job, the client
    /// before it submits (one sentence instead of Slurm's own refusal).
    pub fn check_resources(&self, r: &crate::Resources) -> Result<(), Violation> {
        let lim = self.limits();
        let over = |what, asked: String, max: String| Err(Violation::Limit { what, asked, max });
        if r.cpus > self.max_cpus {
            return over("cpus", r.cpus.to_string(), self.max_cpus.to_string());
        }
        if r.mem_bytes > lim.max_mem_bytes {
            return over("memory", format_size(r.mem_bytes), format_size(lim.max_mem_bytes));
        }
        if r.time_limit_secs > lim.max_time_secs {
            return over(
                "time limit",
                format_duration(r.time_limit_secs),
                format_duration(lim.max_time_secs),
            );
        }
        if r.gpus > self.max_gpus {
            return over("gpus", r.gpus.to_string(), self.max_gpus.to_string());
        }
        if r.nodes > self.max_nodes {
            return over("nodes", r.nodes.to_string(), self.max_nodes.to_string());
        }
        if r.retries > self.max_retries.min(crate::attempt::MAX_RETRIES) {
            let max = self.max_retries.min(crate::attempt::MAX_RETRIES);
            return over("retries", r.retries.to_string(), max.to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{now_ms, JobId, Resources, Task};

    fn spec() -> Spec {
        Spec {
            job_id: JobId::new(),
            uid: 1000,
            gid: 1000,
            created_ms: now_ms(),
            image: "delegate-sandbox:latest".into(),
            task: Task::Command { argv: vec!["true".into()] },
            resources: Resources::default(),
            env: vec![],
        }
    }

    /// Why the policy `text` is invalid.
    fn invalid(text: &str) -> String {
        match Policy::parse(text, "t") {
            Err(PolicyError::Invalid { reason, .. }) => reason,
            other => panic!("{text}: expected an invalid policy, got {other:?}"),
        }
    }

    const NOT_CLEAN: &str = "is not a clean absolute path (it must be absolute, without '..' or '.')";

    #[test]
    fn parse_and_defaults() {
        let p = Policy::parse("max_cpus = 2\nmax_mem = \"2G\"\n", "t").unwrap();
        assert_eq!(p.max_cpus, 2);
        assert_eq!(p.default_image, "delegate-sandbox:latest");
        let e = invalid("bogus = 1");
        assert!(e.contains("unknown field `bogus`"), "{e}");
        assert_eq!(
            invalid("max_mem = \"lots\""),
            "max_mem: \"lots\" is not a size (examples: 512M, 4G, 1048576)"
        );
        assert_eq!(invalid("job_roots = [\"/home/../etc\"]"), format!("/home/../etc {NOT_CLEAN}"));
        let e = invalid("perf_mode = \"sysadmin\"");
        assert!(e.contains("unknown variant `sysadmin`"), "{e}");
        assert_eq!(p.calls_per_allocation, 100);
        assert_eq!(Policy::parse("calls_per_allocation = 1", "t").unwrap().calls_per_allocation, 1);
        assert_eq!(invalid("calls_per_allocation = 0"), "calls_per_allocation must be at least 1");
        let e = invalid("calls_per_allocation = -3");
        assert!(e.contains("invalid value: integer `-3`, expected u32"), "{e}");
        let l = Policy::parse("max_output = \"1M\"\nmax_job_bytes = \"0\"\noutput_limit = \"stop\"", "t").unwrap();
        assert_eq!(l.output_limit, OutputLimit::Stop);
        assert_eq!(l.limits().max_output_bytes, 1 << 20);
        assert_eq!(l.limits().max_job_bytes, 0);
        assert_eq!(invalid("staging_dir = \"rel\""), format!("rel {NOT_CLEAN}"));
    }

    #[test]
    fn checks() {
        let p = Policy::parse("max_cpus = 2\nmax_mem = \"2G\"\nmax_time = \"10m\"", "t").unwrap();
        let dir = Path::new("/home/u/.delegate/jobs/x");
        assert_eq!(p.check(&spec(), 1000, dir), Ok(()));
        assert!(matches!(p.check(&spec(), 1001, dir), Err(Violation::Uid { .. })));
        let mut s = spec();
        s.image = "evil:latest".into();
        assert!(matches!(p.check(&s, 1000, dir), Err(Violation::Image(..))));
        let mut s = spec();
        s.resources.cpus = 3;
        assert!(matches!(p.check(&s, 1000, dir), Err(Violation::Limit { what: "cpus", .. })));
        let mut s = spec();
        s.resources.mem_bytes = 3 << 30;
        assert!(matches!(p.check(&s, 1000, dir), Err(Violation::Limit { what: "memory", .. })));
        let mut s = spec();
        s.resources.time_limit_secs = 3600;
        let e = p.check(&s, 1000, dir).unwrap_err();
        assert_eq!(e.to_string(), "time limit 1h is more than the site maximum of 10m");
        assert!(matches!(
            p.check(&spec(), 1000, Path::new("/tmp/x")),
            Err(Violation::OutsideRoots(..))
        ));
        let mut s = spec();
        s.uid = 0;
        assert_eq!(p.check(&s, 0, dir), Err(Violation::Root));
    }

    /// Issue 52: a spec that asks for more retries than the site allows
    /// (a forged one too: the runner checks it before anything runs) is
    /// refused in one sentence naming the bound; a site cannot allow more
    /// than the hard bound.
    #[test]
    fn retries_within_the_sites_bound() {
        let dir = Path::new("/home/u/.delegate/jobs/x");
        let p = Policy::default();
        let mut s = spec();
        s.resources.retries = crate::attempt::DEFAULT_RETRIES;
        assert_eq!(p.check(&s, 1000, dir), Ok(()));
        s.resources.retries = 3;
        let e = p.check(&s, 1000, dir).unwrap_err();
        assert_eq!(e.to_string(), "retries 3 is more than the site maximum of 2");
        let none = Policy::parse("max_retries = 0", "t").unwrap();
        s.resources.retries = 1;
        assert!(matches!(
            none.check(&s, 1000, dir),
            Err(Violation::Limit { what: "retries", .. })
        ));
        let e = Policy::parse("max_retries = 11", "t").unwrap_err();
        assert!(e.to_string().contains("max_retries must be 0 to 10"), "{e}");
    }

    #[test]
    fn gpus() {
        let dir = Path::new("/home/u/.delegate/jobs/x");
        let p = Policy::parse("max_gpus = 1\ngpu_mode = \"devices\"", "t").unwrap();
        assert_eq!(p.gpu_mode, GpuMode::Devices);
        assert_eq!(p.gres_conf, Path::new("/etc/slurm/gres.conf"));
        let mut s = spec();
        s.resources.gpus = 1;
        assert_eq!(p.check(&s, 1000, dir), Ok(()));
        s.resources.gpus = 2;
        let e = p.check(&s, 1000, dir).unwrap_err();
        assert_eq!(e.to_string(), "gpus 2 is more than the site maximum of 1");
        // The default allows none.
        assert_eq!(
            Policy::default().check(&s, 1000, dir),
            Err(Violation::Limit {
                what: "gpus",
                asked: "2".into(),
                max: "0".into()
            })
        );
        s.validate().expect("two GPUs on one node are a valid spec");
        s.resources.gpus = crate::spec::MAX_GPUS + 1;
        let too_many = format!("more than {} GPUs", crate::spec::MAX_GPUS);
        let r = s.validate();
        assert!(
            matches!(&r, Err(crate::ProtocolError::InvalidSpec(why)) if *why == too_many),
            "{r:?}"
        );
        let e = invalid("gpu_mode = \"magic\"");
        assert!(e.contains("unknown variant `magic`"), "{e}");
        assert_eq!(invalid("gres_conf = \"etc/gres.conf\""), format!("etc/gres.conf {NOT_CLEAN}"));
    }

    /// Docs that are true (issue 31): every key of the policy is in the
    /// configuration block of docs/configuration.md and in the template build_cluster.sh
    /// installs, and every key the README's block names exists.
    #[test]
    fn every_policy_key_is_documented_and_no_documented_key_is_absent() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let keys: Vec<String> = toml::to_string(&Policy::default())
            .expect("the default policy serializes")
            .lines()
            .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim().to_string()))
            .collect();
        assert!(keys.len() > 20, "{keys:?}");
        let readme = std::fs::read_to_string(root.join("docs/configuration.md")).expect("docs/configuration.md");
        let block = readme
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("the ```toml block of docs/configuration.md");
        let template = std::fs::read_to_string(root.join("slurm-conf/policy.toml.j2")).expect("policy.toml.j2");
        let key_of = |l: &str| {
            let l = l.trim_start_matches("# ");
            l.split_once('=')
                .map(|(k, _)| k.trim().to_string())
                .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        };
        let documented: Vec<String> = block.lines().filter_map(key_of).collect();
        let templated: Vec<String> = template.lines().filter_map(key_of).collect();
        for k in &keys {
            assert!(documented.contains(k), "policy key {k} is missing from docs/configuration.md");
            assert!(
                templated.contains(k),
                "policy key {k} is missing from slurm-conf/policy.toml.j2"
            );
        }
        for k in &documented {
            assert!(
                keys.contains(k),
                "docs/configuration.md documents a policy key {k} that does not exist"
            );
        }
    }
}

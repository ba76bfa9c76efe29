//! GPUs: which device files Slurm allocated to the calling job, and how
//! they reach its sandbox.
//!
//! Only root-owned sources count: slurmctld's record of the allocation
//! (`squeue --json`, `gres_detail`: the GRES indexes of the job's GPUs on
//! its node) and this node's gres.conf (the device file behind each index,
//! in the order Slurm numbers them: the order of its `File=` entries).
//! Never the job's environment (`SLURM_JOB_GPUS`, `CUDA_VISIBLE_DEVICES`,
//! a step's environ): the student writes those.
//!
//! delegate's jobs have their node to themselves (`--exclusive`), and
//! Slurm then allocates every GPU of the node to the job whatever it asked
//! for (`JOB_GRES=gpu:<all>`; the batch step's `CUDA_VISIBLE_DEVICES` lists
//! them all). The sandbox gets the number of GPUs the job asked for —
//! slurmctld's record of the request (`tres_per_node`, which the site's
//! job_submit.lua ties to the script's own line), which must equal the
//! spec's — taken from Slurm's allocation in Slurm's order, and no other.
//!
//! The sandbox gets exactly those devices: as device nodes (and
//! their device-cgroup rules) in `devices` mode, or through the NVIDIA
//! container toolkit (Docker's `nvidia` device driver) or CDI, which also
//! mount the host's driver libraries. `CUDA_VISIBLE_DEVICES` counts from 0
//! inside; a job without GPUs gets `NVIDIA_VISIBLE_DEVICES=void` so that an
//! engine whose default runtime is NVIDIA's injects none.

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::models::{ContainerCreateBody, DeviceMapping, DeviceRequest};
use bollard::Docker;
use delegate_protocol::policy::{GpuMode, Policy};

use crate::ask::BoundedRun;

/// Bounds on what is read: gres.conf, squeue's answer, the device list.
const MAX_GRES_CONF: u64 = 1 << 20;
const MAX_SQUEUE_JSON: usize = 64 << 20;
const MAX_DEVICES: usize = 1024;
/// NVIDIA's per-node control devices, given with the GPUs in `devices` mode
/// (those that exist): without them the driver cannot reach any GPU.
pub const NVIDIA_CONTROL: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];
/// Where CDI specs live (the CDI specification's default directories).
pub const CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
const CDI_KIND: &str = "nvidia.com/gpu";
/// Engine major version from which Docker reads CDI device requests.
const CDI_DOCKER_MAJOR: u32 = 25;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GpuError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} is not owned by root or is writable by others; refusing to trust it")]
    Untrusted { path: String },
    #[error("{path}: {reason}")]
    GresConf { path: String, reason: String },
    #[error("the job asks for {asked} GPU(s), but this node ({node}) has no GPUs in its gres.conf")]
    NoGpus { asked: u32, node: String },
    #[error("Slurm job {job} asked Slurm for {requested} GPU(s), but its spec asks for {asked}")]
    Mismatch { job: String, requested: u32, asked: u32 },
    #[error("Slurm allocated {allocated} GPU(s) to job {job}, fewer than the {asked} it asks for")]
    Short { job: String, allocated: usize, asked: u32 },
    #[error("Slurm allocated GPU index {index} to job {job}, but gres.conf lists {known} GPU(s) on this node")]
    UnknownIndex { job: String, index: u32, known: usize },
    #[error("cannot ask slurmctld about job {job}'s GPUs: {reason}")]
    Slurm { job: String, reason: String },
    #[error("unreadable GPU allocation {0:?}")]
    Detail(String),
    #[error("GPU device {path}: {reason}")]
    Device { path: String, reason: String },
}

/// How the allocated GPUs reach the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Devices,
    Nvidia,
    Cdi,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Devices => "devices",
            Mode::Nvidia => "nvidia",
            Mode::Cdi => "cdi",
        }
    }
}

/// One job's GPUs: the allocated device files (in Slurm's order) and how
/// they are passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Passthrough {
    pub mode: Mode,
    pub devices: Vec<PathBuf>,
    /// NVIDIA's index of each device (its minor number): what the toolkit
    /// and CDI name it by.
    pub ordinals: Vec<u64>,
    /// Control devices given alongside in `devices` mode.
    pub control: Vec<PathBuf>,
}

impl Passthrough {
    /// No GPUs.
    pub fn none() -> Passthrough {
        Passthrough {
            mode: Mode::Devices,
            devices: Vec::new(),
            ordinals: Vec::new(),
            control: Vec::new(),
        }
    }

    /// The environment the sandbox gets for its GPUs (after the spec's,
    /// from which every `NVIDIA_*` name is dropped).
    pub fn environment(&self) -> Vec<String> {
        let n = self.devices.len();
        if n == 0 {
            return vec!["NVIDIA_VISIBLE_DEVICES=void".into()];
        }
        let renumbered = (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let mut env = vec![format!("CUDA_VISIBLE_DEVICES={renumbered}")];
        match self.mode {
            // No NVIDIA hook sees it: it tells the job what it has.
            Mode::Devices => env.push(format!("NVIDIA_VISIBLE_DEVICES={renumbered}")),
            // Docker sets NVIDIA_VISIBLE_DEVICES to the host's indexes for
            // the toolkit's hook itself; the capabilities say what to mount.
            Mode::Nvidia => env.push("NVIDIA_DRIVER_CAPABILITIES=compute,utility".into()),
            Mode::Cdi => {}
        }
        env
    }

    /// Adds the devices (or device requests) to `body` (the environment is
    /// [`Passthrough::environment`], placed by the container configuration).
    pub fn apply(&self, body: &mut ContainerCreateBody) {
        if self.devices.is_empty() {
            return;
        }
        let host = body.host_config.get_or_insert_with(Default::default);
        match self.mode {
            Mode::Devices => {
                // Each mapping also allows exactly that device's major:minor
                // in the container's device cgroup; nothing broader.
                host.devices = Some(
                    self.devices
                        .iter()
                        .chain(&self.control)
                        .map(|p| DeviceMapping {
                            path_on_host: Some(p.display().to_string()),
                            path_in_container: Some(p.display().to_string()),
                            cgroup_permissions: Some("rwm".into()),
                        })
                        .collect(),
                );
            }
            Mode::Nvidia => {
                host.device_requests = Some(vec![DeviceRequest {
                    driver: Some("nvidia".into()),
                    device_ids: Some(self.ordinals.iter().map(u64::to_string).collect()),
                    capabilities: Some(vec![vec!["gpu".into(), "compute".into(), "utility".into()]]),
                    ..Default::default()
                }]);
            }
            Mode::Cdi => {
                host.device_requests = Some(vec![DeviceRequest {
                    driver: Some("cdi".into()),
                    device_ids: Some(self.ordinals.iter().map(|o| format!("{CDI_KIND}={o}")).collect()),
                    ..Default::default()
                }]);
            }
        }
    }
}

/// Expands a Slurm host-list style expression: `a,b`, `x[0-3]`,
/// `/dev/nvidia[0-1,3]` (one bracket group per item), in order.
pub fn expand(expr: &str) -> Result<Vec<String>, String> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in expr.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("unbalanced brackets in {expr:?}"));
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced brackets in {expr:?}"));
    }
    items.push(&expr[start..]);
    let mut out = Vec::new();
    for item in items.into_iter().filter(|s| !s.is_empty()) {
        let Some(open) = item.find('[') else {
            out.push(item.to_string());
            continue;
        };
        let close = item.find(']').ok_or_else(|| format!("unbalanced brackets in {expr:?}"))?;
        let (prefix, ranges, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
        if suffix.contains('[') {
            return Err(format!("more than one bracket group in {item:?}"));
        }
        for r in ranges.split(',') {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let (Ok(lo), Ok(hi)) = (a.parse::<u32>(), b.parse::<u32>()) else {
                return Err(format!("bad range {r:?} in {item:?}"));
            };
            if lo > hi || (hi - lo) as usize >= MAX_DEVICES {
                return Err(format!("bad range {r:?} in {item:?}"));
            }
            // Zero padding as written ("[00-07]").
            let width = if a.len() > 1 && a.starts_with('0') { a.len() } else { 0 };
            for n in lo..=hi {
                out.push(format!("{prefix}{n:0width$}{suffix}"));
            }
        }
        if out.len() > MAX_DEVICES {
            return Err(format!("more than {MAX_DEVICES} entries in {expr:?}"));
        }
    }
    Ok(out)
}

/// The GPU device files gres.conf declares for `node`, in Slurm's order.
pub fn gres_devices(text: &str, node: &str) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: HashMap<String, &str> = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
        if let Some(nodes) = fields.get("nodename") {
            if !expand(nodes)
                .map_err(|e| format!("line {}: {e}", n + 1))?
                .iter()
                .any(|h| h == node)
            {
                continue;
            }
        }
        if fields.get("name").is_none_or(|v| !v.eq_ignore_ascii_case("gpu")) {
            continue;
        }
        let Some(files) = fields.get("file").or_else(|| fields.get("files")) else {
            return Err(format!(
                "line {}: GPUs without File=: delegate needs the device file of each GPU",
                n + 1
            ));
        };
        for f in expand(files).map_err(|e| format!("line {}: {e}", n + 1))? {
            out.push(PathBuf::from(f));
        }
        if out.len() > MAX_DEVICES {
            return Err(format!("more than {MAX_DEVICES} GPUs"));
        }
    }
    Ok(out)
}

/// The GPU indexes in one node's `gres_detail` entry, e.g. `gpu:2(IDX:0-1)`,
/// `gpu:a100:1(IDX:3),nic:1(IDX:0)`, `gpu(IDX:0,2)`.
pub fn parse_detail(s: &str) -> Result<Vec<u32>, GpuError> {
    let bad = || GpuError::Detail(s.chars().take(200).collect());
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        // One entry: up to the comma after its closing parenthesis.
        let end = match (rest.find('('), rest.find(',')) {
            (Some(p), Some(c)) if c < p => c,
            (Some(_), _) => rest.find(')').map(|i| i + 1).ok_or_else(bad)?,
            (None, Some(c)) => c,
            (None, None) => rest.len(),
        };
        let entry = &rest[..end];
        rest = rest[end..].strip_prefix(',').unwrap_or(&rest[end..]);
        let name = entry.split([':', '(']).next().unwrap_or("");
        if name != "gpu" {
            continue;
        }
        let Some(open) = entry.find("(IDX:") else {
            return Err(bad());
        };
        let list = entry[open + 5..].strip_suffix(')').ok_or_else(bad)?;
        if list == "N/A" {
            continue;
        }
        for r in list.split(',') {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let (Ok(lo), Ok(hi)) = (a.parse::<u32>(), b.parse::<u32>()) else {
                return Err(bad());
            };
            if lo > hi || (hi - lo) as usize >= MAX_DEVICES {
                return Err(bad());
            }
            out.extend(lo..=hi);
            if out.len() > MAX_DEVICES {
                return Err(bad());
            }
        }
    }
    Ok(out)
}

/// The GPUs a `tres_per_node` request names: `gres:gpu:N`,
/// `gres:gpu:<type>:N` (or without `gres:`), among other resources; 0 for none.
pub fn requested_gpus(tres_per_node: &str) -> Result<u32, GpuError> {
    let bad = || GpuError::Detail(tres_per_node.chars().take(200).collect());
    let mut total: u32 = 0;
    for item in tres_per_node.split(',').filter(|s| !s.is_empty()) {
        let item = item.strip_prefix("gres:").unwrap_or(item);
        let mut parts = item.split(':');
        if parts.next() != Some("gpu") {
            continue;
        }
        let n = match parts.next_back() {
            None => 1,
            Some(c) => c.parse::<u32>().map_err(|_| bad())?,
        };
        total = total.checked_add(n).ok_or_else(bad)?;
    }
    Ok(total)
}

/// What slurmctld records about `job`'s GPUs, from `squeue --json` (JSON:
/// no field a user chose can pass for another): the GPUs the job asked
/// for per node, and the GPU indexes allocated on its (first) node.
pub fn gpus_in_squeue_json(json: &str, job: &str) -> Result<(u32, Vec<u32>), GpuError> {
    let slurm = |reason: String| GpuError::Slurm { job: job.into(), reason };
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| slurm(format!("unreadable answer: {e}")))?;
    let id: u64 = job.parse().map_err(|_| slurm("not a job id".into()))?;
    let jobs = v["jobs"].as_array().ok_or_else(|| slurm("no job list".into()))?;
    let mine: Vec<&serde_json::Value> = jobs.iter().filter(|j| j["job_id"].as_u64() == Some(id)).collect();
    let [j] = mine.as_slice() else {
        return Err(slurm("slurmctld does not know the job".into()));
    };
    let requested = requested_gpus(j["tres_per_node"].as_str().unwrap_or(""))?;
    let details = j["gres_detail"].as_array().ok_or_else(|| slurm("no gres_detail".into()))?;
    let allocated = match details.first() {
        None => Vec::new(),
        Some(d) => parse_detail(d.as_str().ok_or_else(|| slurm("gres_detail is not text".into()))?)?,
    };
    Ok((requested, allocated))
}

async fn slurm_gpus(job: &str) -> Result<(u32, Vec<u32>), GpuError> {
    let question = BoundedRun {
        argv: &["squeue", "--json", "-t", "all", "-j", job],
        deadline: Duration::from_secs(15),
        max_answer: MAX_SQUEUE_JSON,
        env: &[],
        clear_env: false,
    };
    let json = question
        .ask()
        .await
        .map_err(|e| GpuError::Slurm { job: job.into(), reason: e.to_string() })?;
    gpus_in_squeue_json(&json, job)
}

/// This node's GPU device files from the policy's gres.conf (none when the
/// file does not exist). The file must be root's.
pub fn node_devices(policy: &Policy, node: &str) -> Result<Vec<PathBuf>, GpuError> {
    let path = &policy.gres_conf;
    let p = path.display().to_string();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(GpuError::Read { path: p, reason: e.to_string() }),
    };
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 || !meta.is_file() {
        return Err(GpuError::Untrusted { path: p });
    }
    if meta.len() > MAX_GRES_CONF {
        return Err(GpuError::GresConf {
            path: p,
            reason: "larger than 1 MiB".into(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| GpuError::Read { path: p.clone(), reason: e.to_string() })?;
    gres_devices(&text, node).map_err(|reason| GpuError::GresConf { path: p, reason })
}

/// A character device's minor number (NVIDIA's index for /dev/nvidiaN).
pub(crate) fn char_device_minor(path: &Path) -> Result<u64, GpuError> {
    let dev = |reason: String| GpuError::Device { path: path.display().to_string(), reason };
    let m = std::fs::metadata(path).map_err(|e| dev(e.to_string()))?;
    if !m.file_type().is_char_device() {
        return Err(dev("not a character device".into()));
    }
    Ok(nix::sys::stat::minor(m.rdev()))
}

/// How GPUs reach sandboxes on this node, and why.
pub async fn detect(policy: &Policy, docker: &Docker) -> (Mode, String) {
    match policy.gpu_mode {
        GpuMode::Devices => return (Mode::Devices, "gpu_mode = \"devices\" in the site policy".into()),
        GpuMode::Nvidia => return (Mode::Nvidia, "gpu_mode = \"nvidia\" in the site policy".into()),
        GpuMode::Cdi => return (Mode::Cdi, "gpu_mode = \"cdi\" in the site policy".into()),
        GpuMode::Auto => {}
    }
    let info = docker.info().await.ok();
    let major = info
        .as_ref()
        .and_then(|i| i.server_version.as_deref())
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if let Some(spec) = cdi_spec() {
        if major >= CDI_DOCKER_MAJOR {
            return (Mode::Cdi, format!("CDI spec {} names {CDI_KIND}", spec.display()));
        }
    }
    if info
        .as_ref()
        .and_then(|i| i.runtimes.as_ref())
        .is_some_and(|r| r.contains_key("nvidia"))
    {
        return (
            Mode::Nvidia,
            "the engine has the NVIDIA container runtime (nvidia-container-toolkit)".into(),
        );
    }
    (
        Mode::Devices,
        "no NVIDIA container toolkit or CDI spec: device nodes only (the image brings the driver's libraries)".into(),
    )
}

/// The first CDI spec file that declares NVIDIA GPUs.
fn cdi_spec() -> Option<PathBuf> {
    for dir in CDI_DIRS {
        let Ok(rd) = std::fs::read_dir(dir) else { continue };
        for e in rd.flatten().take(256) {
            let p = e.path();
            let ext_ok = p
                .extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| matches!(x, "json" | "yaml" | "yml"));
            let small = e.metadata().is_ok_and(|m| m.is_file() && m.len() <= MAX_GRES_CONF);
            if ext_ok && small && std::fs::read_to_string(&p).is_ok_and(|t| t.contains(CDI_KIND)) {
                return Some(p);
            }
        }
    }
    None
}

/// The GPUs of the calling job: as many as it asked Slurm for (which must
/// be what its spec asks for), the first of those Slurm allocated to `job`
/// on this node.
pub async fn for_job(
    policy: &Policy,
    docker: &Docker,
    job: &str,
    node: &str,
    asked: u32,
) -> Result<Passthrough, GpuError> {
    if asked == 0 {
        // Nothing to pass (whatever an exclusive allocation holds).
        return Ok(Passthrough::none());
    }
    let devices = node_devices(policy, node)?;
    if devices.is_empty() {
        return Err(GpuError::NoGpus { asked, node: node.into() });
    }
    let (requested, allocated) = slurm_gpus(job).await?;
    if requested != asked {
        return Err(GpuError::Mismatch { job: job.into(), requested, asked });
    }
    if allocated.len() < asked as usize {
        return Err(GpuError::Short {
            job: job.into(),
            allocated: allocated.len(),
            asked,
        });
    }
    let idx = &allocated[..asked as usize];
    let mut chosen = Vec::with_capacity(idx.len());
    let mut ordinals = Vec::with_capacity(idx.len());
    for &i in idx {
        let d = devices.get(i as usize).ok_or_else(|| GpuError::UnknownIndex {
            job: job.into(),
            index: i,
            known: devices.len(),
        })?;
        ordinals.push(char_device_minor(d)?);
        chosen.push(d.clone());
    }
    let (mode, _) = detect(policy, docker).await;
    let control = if mode == Mode::Devices {
        NVIDIA_CONTROL
            .iter()
            .map(PathBuf::from)
            .filter(|p| char_device_minor(p).is_ok())
            .collect()
    } else {
        Vec::new()
    };
    Ok(Passthrough { mode, devices: chosen, ordinals, control })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands() {
        assert_eq!(
            expand("/dev/nvidia[0-2]").unwrap(),
            ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]
        );
        assert_eq!(expand("a,b[1,3-4]").unwrap(), ["a", "b1", "b3", "b4"]);
        assert_eq!(expand("n[08-10]").unwrap(), ["n08", "n09", "n10"]);
        assert_eq!(expand("x[1-"), Err("unbalanced brackets in \"x[1-\"".into()));
        assert_eq!(expand("x[3-1]"), Err("bad range \"3-1\" in \"x[3-1]\"".into()));
        assert_eq!(
            expand("x[0-99999999]"),
            Err("bad range \"0-99999999\" in \"x[0-99999999]\"".into())
        );
    }

    #[test]
    fn gres_conf() {
        let text = "# GPUs\nAutoDetect=off\nNodeName=worker[1-2] Name=gpu File=/dev/nvidia[0-1]\n\
                    NodeName=other Name=gpu File=/dev/nvidia[0-7]\nName=nic File=/dev/nic0\n\
                    Name=gpu Type=a100 File=/dev/nvidia9 # every node\n";
        assert_eq!(
            gres_devices(text, "worker2").unwrap(),
            [
                PathBuf::from("/dev/nvidia0"),
                "/dev/nvidia1".into(),
                "/dev/nvidia9".into()
            ]
        );
        assert_eq!(gres_devices(text, "n1").unwrap(), [PathBuf::from("/dev/nvidia9")]);
        assert!(gres_devices("Name=gpu Count=2\n", "n").unwrap_err().contains("File="));
        assert!(gres_devices("", "n").unwrap().is_empty());
    }

    #[test]
    fn details() {
        assert_eq!(parse_detail("gpu:1(IDX:1)").unwrap(), [1]);
        assert_eq!(parse_detail("gpu:a100:2(IDX:0-1)").unwrap(), [0, 1]);
        assert_eq!(parse_detail("gpu(IDX:0,2-3)").unwrap(), [0, 2, 3]);
        assert_eq!(parse_detail("nic:1(IDX:0),gpu:1(IDX:3)").unwrap(), [3]);
        assert_eq!(parse_detail("gpu:0(IDX:N/A)").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_detail("").unwrap(), Vec::<u32>::new());
        for bad in ["gpu:1(IDX:x)", "gpu:1", "gpu:1(IDX:0-99999999)"] {
            assert_eq!(parse_detail(bad), Err(GpuError::Detail(bad.into())));
        }
    }

    #[test]
    fn requests() {
        assert_eq!(requested_gpus("").unwrap(), 0);
        assert_eq!(requested_gpus("gres:gpu:2").unwrap(), 2);
        assert_eq!(requested_gpus("gres:gpu:a100:1").unwrap(), 1);
        assert_eq!(requested_gpus("gres:nic:1,gres:gpu:3").unwrap(), 3);
        assert_eq!(requested_gpus("gres:gpu").unwrap(), 1);
        assert_eq!(requested_gpus("gres:gpu:x"), Err(GpuError::Detail("gres:gpu:x".into())));
    }

    #[test]
    fn squeue_json() {
        // An exclusive node: Slurm allocates all its GPUs whatever was asked.
        let j = r#"{"jobs":[{"job_id":41,"tres_per_node":"gres:gpu:2","gres_detail":["gpu:2(IDX:0-1)"]},
                           {"job_id":42,"tres_per_node":"gres:gpu:1","gres_detail":["gpu:2(IDX:0-1)"]},
                           {"job_id":43,"tres_per_node":"","gres_detail":[]}]}"#;
        assert_eq!(gpus_in_squeue_json(j, "42").unwrap(), (1, vec![0, 1]));
        assert_eq!(gpus_in_squeue_json(j, "43").unwrap(), (0, vec![]));
        assert_eq!(
            gpus_in_squeue_json(j, "44"),
            Err(GpuError::Slurm {
                job: "44".into(),
                reason: "slurmctld does not know the job".into()
            })
        );
        match gpus_in_squeue_json("nope", "42") {
            Err(GpuError::Slurm { job, reason }) => {
                assert_eq!(job, "42");
                assert!(reason.starts_with("unreadable answer: "), "{reason}");
            }
            other => panic!("expected slurmctld's answer refused, got {other:?}"),
        }
        // A forged name or comment is just a string value: never parsed.
        let forged = r#"{"jobs":[{"job_id":42,"name":"gres_detail gpu:2(IDX:0-1)","gres_detail":[]}]}"#;
        assert_eq!(gpus_in_squeue_json(forged, "42").unwrap(), (0, vec![]));
    }

    #[test]
    fn passthrough_config() {
        let p = Passthrough {
            mode: Mode::Devices,
            devices: vec!["/dev/delegate-gpu1".into()],
            ordinals: vec![7],
            control: vec![],
        };
        let mut body = ContainerCreateBody::default();
        p.apply(&mut body);
        let env = p.environment();
        assert!(env.contains(&"CUDA_VISIBLE_DEVICES=0".to_string()), "{env:?}");
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=0".to_string()), "{env:?}");
        let devs = body.host_config.unwrap().devices.unwrap();
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].path_on_host.as_deref(), Some("/dev/delegate-gpu1"));
        let mut none = ContainerCreateBody::default();
        Passthrough::none().apply(&mut none);
        assert_eq!(Passthrough::none().environment(), ["NVIDIA_VISIBLE_DEVICES=void"]);
        assert!(none.host_config.is_none());
        let nv = Passthrough { mode: Mode::Nvidia, ..p.clone() };
        let mut body = ContainerCreateBody::default();
        nv.apply(&mut body);
        let h = body.host_config.unwrap();
        assert!(h.devices.is_none());
        let r = &h.device_requests.unwrap()[0];
        assert_eq!(r.driver.as_deref(), Some("nvidia"));
        assert_eq!(r.device_ids.as_deref(), Some(&["7".to_string()][..]));
        assert!(!nv.environment().iter().any(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=")));
        let cdi = Passthrough { mode: Mode::Cdi, ..p };
        let mut body = ContainerCreateBody::default();
        cdi.apply(&mut body);
        let r = &body.host_config.unwrap().device_requests.unwrap()[0];
        assert_eq!(r.device_ids.as_deref(), Some(&["nvidia.com/gpu=7".to_string()][..]));
    }
}

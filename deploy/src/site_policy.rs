//! The site policy (/etc/delegate/policy.toml) as the deployment first
//! writes it; the rendered text is parsed by the protocol's own parser
//! before it is handed out.

use delegate_protocol::policy::Policy;
use serde::Serialize;

use crate::settings::{is_image, is_safe_path};
use crate::slurm_conf::stack_workers;
use crate::{templates, RenderError, Settings, Shape};

#[derive(Serialize)]
struct Context {
    sandbox_image: String,
    max_cpus: u64,
    max_mem: String,
    max_time: String,
    max_pids: u64,
    max_gpus: u64,
    max_nodes: u64,
    tmp_size: String,
    pin_cpus: bool,
    clean_scratch: bool,
    job_roots: Vec<String>,
    partitions: Vec<String>,
    runner: String,
}

/// The runner's path on the stack's nodes (docker/cluster.Dockerfile).
const STACK_RUNNER: &str = "/usr/local/bin/sandbox-runner";

/// The runner's path on the single machine: sandbox-runner in DELEGATE_PREFIX.
fn local_runner(s: &Settings) -> Result<String, RenderError> {
    let prefix = s.raw_or("DELEGATE_PREFIX", "/usr/local/bin");
    let runner = format!("{}/sandbox-runner", prefix.trim_end_matches('/'));
    if is_safe_path(&runner) {
        Ok(runner)
    } else {
        Err(RenderError::Invalid(format!(
            "DELEGATE_PREFIX must be an absolute path of A-Z a-z 0-9 . _ / + @ = , : -, not {prefix:?}"
        )))
    }
}

/// DELEGATE_PARTITIONS as a list.
fn partitions(s: &Settings) -> Result<Vec<String>, RenderError> {
    let words: Vec<String> = s
        .raw_or("DELEGATE_PARTITIONS", "")
        .split(' ')
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect();
    match words.iter().find(|w| !delegate_protocol::policy::is_partition_name(w)) {
        Some(bad) => Err(RenderError::Invalid(format!(
            "DELEGATE_PARTITIONS must be partition names separated by spaces, not {bad:?}"
        ))),
        None => Ok(words),
    }
}

/// Three quarters of the machine's memory in whole GiB (512M on a machine
/// with less than 2 GiB): the local default of max_mem.
pub fn default_max_mem(mem_total_kib: u64) -> String {
    match mem_total_kib * 3 / 4 / 1024 / 1024 {
        0 => "512M".into(),
        g => format!("{g}G"),
    }
}

/// The machine's MemTotal in KiB, from /proc/meminfo.
pub fn mem_total_kib() -> Result<u64, RenderError> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| RenderError::Invalid(format!("cannot read /proc/meminfo: {e}")))?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| RenderError::Invalid("/proc/meminfo has no MemTotal".into()))
}

fn image(s: &Settings) -> Result<String, RenderError> {
    Ok(s.checked(
        "DELEGATE_SANDBOX_IMAGE",
        "a Docker image name such as delegate-sandbox:latest",
        is_image,
    )?)
}

fn local(s: &Settings, max_gpus: u64, mem_total_kib: u64) -> Result<Context, RenderError> {
    let max_mem = match s.raw_or("DELEGATE_MAX_MEM", "") {
        "" => default_max_mem(mem_total_kib),
        _ => s.size("DELEGATE_MAX_MEM")?,
    };
    Ok(Context {
        sandbox_image: image(s)?,
        max_cpus: s.count("DELEGATE_MAX_CPUS", 1, 100_000)?,
        max_mem,
        max_time: s.duration("DELEGATE_MAX_TIME")?,
        max_pids: s.count("DELEGATE_MAX_PIDS", 16, 10_000_000)?,
        max_gpus,
        max_nodes: 1,
        tmp_size: s.size("DELEGATE_TMP_SIZE")?,
        pin_cpus: true,
        clean_scratch: false,
        job_roots: vec!["/home".into()],
        partitions: partitions(s)?,
        runner: local_runner(s)?,
    })
}

fn stack(s: &Settings) -> Result<Context, RenderError> {
    let home = s.checked(
        "DELEGATE_STACK_HOME",
        "an absolute path of A-Z a-z 0-9 . _ / + @ = , : -",
        is_safe_path,
    )?;
    Ok(Context {
        sandbox_image: image(s)?,
        max_cpus: s.count("DELEGATE_STACK_MAX_CPUS", 1, 100_000)?,
        max_mem: s.size("DELEGATE_STACK_MAX_MEM")?,
        max_time: s.duration("DELEGATE_STACK_MAX_TIME")?,
        max_pids: s.count("DELEGATE_STACK_MAX_PIDS", 16, 10_000_000)?,
        max_gpus: 0,
        max_nodes: stack_workers(s)?.count,
        tmp_size: s.size("DELEGATE_STACK_TMP_SIZE")?,
        pin_cpus: false,
        clean_scratch: true,
        job_roots: vec![home],
        partitions: partitions(s)?,
        runner: STACK_RUNNER.into(),
    })
}

/// The policy of `shape` (local: `max_gpus` real GPUs, and the machine's
/// memory for the default max_mem), checked by parsing it.
pub fn render(s: &Settings, shape: Shape, max_gpus: u64, mem_total_kib: u64) -> Result<String, RenderError> {
    let ctx = match shape {
        Shape::Local => local(s, max_gpus, mem_total_kib)?,
        Shape::Stack => stack(s)?,
    };
    let text = templates::render("policy.toml", &ctx)?;
    Policy::parse(&text, "the rendered policy")
        .map_err(|e| RenderError::Invalid(format!("the rendered policy does not parse: {e}")))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_memory_is_three_quarters_in_gib() {
        assert_eq!(default_max_mem(24 * 1024 * 1024), "18G");
        assert_eq!(default_max_mem(1024 * 1024), "512M");
    }
}

//! The stack file (`docker stack deploy`): head, dbd, db, one service per
//! worker, the power service of elastic workers, the user node.

use serde::Serialize;

use crate::schema::is_cpus;
use crate::settings::{is_image, is_safe_path, is_unix_name};
use crate::slurm_conf::stack_workers;
use crate::{templates, RenderError, Settings, MARKER};

/// What build_cluster.sh knows at deploy time and the settings do not:
/// versions (hashes) of the configs and secrets, the volumes, the hub's
/// cgroups, and how many replicas each worker service has now.
/// (Also `delegate-deploy stack-file`'s options, one `--name` each.)
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Facts {
    /// One 0 or 1 per worker, in order (elastic workers Slurm started stay
    /// 1); on the command line space separated: `--replicas "1 0"`.
    #[arg(long, value_parser = parse_replicas)]
    pub replicas: Replicas,
    /// Hash of the swarm configs (slurm.conf, policy, ...): their names carry it.
    #[arg(long)]
    pub config_version: String,
    #[arg(long)]
    pub key_version: String,
    #[arg(long)]
    pub hub_version: String,
    #[arg(long)]
    pub db_version: String,
    #[arg(long)]
    pub db_volume: String,
    #[arg(long)]
    pub ctld_volume: String,
    /// The host's cgroup directories for the students' servers.
    #[arg(long)]
    pub cgroup_memory: String,
    #[arg(long)]
    pub cgroup_cpu: String,
    /// The course's registry (worker machines, `build_cluster.sh machine
    /// add`): the cluster image's reference there, by digest, which the
    /// worker services run; empty: the local cluster image.
    #[arg(long, default_value = "")]
    pub worker_image: String,
    /// The sandbox image's reference in the registry, by digest, which each
    /// worker has its machine's engine pull (with the registry-auth secret).
    #[arg(long, default_value = "")]
    pub sandbox_pull: String,
    /// Hash of the registry's client credentials (their secret's name).
    #[arg(long, default_value = "")]
    pub registry_version: String,
}

/// The replicas of the worker services, in order.
pub type Replicas = Vec<u8>;

/// `"1 0"` as replicas (each checked to be 0 or 1 with the worker count
/// when the file is rendered).
pub fn parse_replicas(s: &str) -> Result<Replicas, String> {
    s.split_whitespace()
        .map(|r| r.parse::<u8>().map_err(|_| format!("'{r}' is not 0 or 1")))
        .collect()
}

#[derive(Serialize)]
struct Worker {
    i: u64,
    replicas: u8,
}

#[derive(Serialize)]
struct Context {
    marker: &'static str,
    stack: String,
    cluster_image: String,
    worker_image: String,
    sandbox_pull: String,
    registry_version: String,
    user_image: String,
    db_image: String,
    db_name: String,
    home: String,
    staging: String,
    hub_state: String,
    power_spool: String,
    jupyter_port: u64,
    hub_mem: String,
    hub_nproc: u64,
    hub_idle: u64,
    hub_student_mem: String,
    hub_student_cpus: String,
    user_cpus: String,
    user_mem: String,
    rpc_rate: u64,
    rpc_burst: u64,
    rpc_conns: u64,
    worker_scratch: u64,
    user_scratch: u64,
    head_constraint: &'static str,
    placement: bool,
    user_constraint: &'static str,
    workers: Vec<Worker>,
    elastic: bool,
    elastic_min: u64,
    elastic_max: u64,
    power_start_wait: u64,
    power_service: bool,
    cfgv: String,
    keyv: String,
    hubv: String,
    dbv: String,
    db_volume: String,
    ctld_volume: String,
    hub_cg_mem: String,
    hub_cg_cpu: String,
}

const PATH_WANT: &str = "an absolute path of A-Z a-z 0-9 . _ / + @ = , : -";

fn is_version(s: &str) -> bool {
    (6..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_volume(s: &str) -> bool {
    s.len() <= 128
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn fact(what: &str, value: &str, ok: fn(&str) -> bool) -> Result<String, RenderError> {
    if ok(value) {
        Ok(value.to_owned())
    } else {
        Err(RenderError::Invalid(format!("the stack file's {what} '{value}' is not valid")))
    }
}

fn bytes(s: &Settings, name: &str) -> Result<u64, RenderError> {
    let v = s.size(name)?;
    delegate_protocol::units::parse_size(&v).map_err(|e| RenderError::Invalid(format!("{name}: {e}")))
}

fn cpus(s: &Settings, name: &str) -> Result<String, RenderError> {
    Ok(s.checked(name, "a number of CPUs such as 2 or 0.5", is_cpus)?)
}

/// The stack file for the settings and `facts`.
pub fn render(s: &Settings, facts: &Facts) -> Result<String, RenderError> {
    let workers = stack_workers(s)?;
    if facts.replicas.len() as u64 != workers.declared() || facts.replicas.iter().any(|r| *r > 1) {
        return Err(RenderError::Invalid(format!(
            "--replicas must give 0 or 1 for each of the {} workers, not {:?}",
            workers.declared(),
            facts.replicas
        )));
    }
    let dir = s.checked("DELEGATE_STACK_DIR", PATH_WANT, is_safe_path)?;
    let placement = s.raw_or("DELEGATE_STACK_PLACEMENT", "0") == "1";
    let hook = !s.raw_or("DELEGATE_POWER_HOOK", "").is_empty();
    let elastic = workers.elastic;
    let ctx = Context {
        marker: MARKER,
        stack: s.checked("DELEGATE_STACK_NAME", "a name of a-z 0-9 _ -", is_unix_name)?,
        cluster_image: s.checked("DELEGATE_CLUSTER_IMAGE", "a Docker image name", is_image)?,
        worker_image: String::new(),
        sandbox_pull: String::new(),
        registry_version: String::new(),
        user_image: s.checked("DELEGATE_USER_IMAGE", "a Docker image name", is_image)?,
        db_image: s.checked("DELEGATE_DB_IMAGE", "a Docker image name", is_image)?,
        db_name: s.checked("DELEGATE_DB_NAME", "a database name of a-z 0-9 _ -", is_unix_name)?,
        home: s.checked("DELEGATE_STACK_HOME", PATH_WANT, is_safe_path)?,
        staging: s.checked("DELEGATE_STACK_STAGING", PATH_WANT, is_safe_path)?,
        hub_state: format!("{dir}/hub"),
        power_spool: format!("{dir}/power"),
        jupyter_port: s.count("DELEGATE_JUPYTER_PORT", 1, 65535)?,
        hub_mem: s.size("DELEGATE_HUB_MEM_LIMIT")?,
        hub_nproc: s.count("DELEGATE_HUB_NPROC_LIMIT", 16, 1_000_000)?,
        hub_idle: s.count("DELEGATE_HUB_IDLE_TIMEOUT", 60, 10_000_000)?,
        hub_student_mem: s.size("DELEGATE_HUB_STUDENT_MEM")?,
        hub_student_cpus: cpus(s, "DELEGATE_HUB_STUDENT_CPUS")?,
        user_cpus: cpus(s, "DELEGATE_USER_NODE_CPUS")?,
        user_mem: s.size("DELEGATE_USER_NODE_MEM")?,
        rpc_rate: s.count("DELEGATE_RPC_RATE", 0, 999_999)?,
        rpc_burst: s.count("DELEGATE_RPC_BURST", 0, 999_999)?,
        rpc_conns: s.count("DELEGATE_RPC_CONNS", 0, 999_999)?,
        worker_scratch: bytes(s, "DELEGATE_STACK_WORKER_SCRATCH")?,
        user_scratch: bytes(s, "DELEGATE_USER_NODE_SCRATCH")?,
        head_constraint: if placement { "\"node.role == manager\"" } else { "" },
        placement,
        user_constraint: if placement {
            "\"node.labels.delegate.role == user\""
        } else {
            ""
        },
        workers: (1..=workers.declared())
            .zip(&facts.replicas)
            .map(|(i, r)| Worker { i, replicas: *r })
            .collect(),
        elastic: elastic.is_some(),
        elastic_min: elastic.map_or(0, |e| e.min),
        elastic_max: elastic.map_or(0, |e| e.max),
        power_start_wait: elastic.map_or(0, |e| e.resume_timeout.saturating_sub(10).min(60)),
        power_service: elastic.is_some() && !hook,
        cfgv: fact("config version", &facts.config_version, is_version)?,
        keyv: fact("munge key version", &facts.key_version, is_version)?,
        hubv: fact("hub secrets version", &facts.hub_version, is_version)?,
        dbv: fact("database secrets version", &facts.db_version, is_version)?,
        db_volume: fact("database volume", &facts.db_volume, is_volume)?,
        ctld_volume: fact("slurmctld state volume", &facts.ctld_volume, is_volume)?,
        hub_cg_mem: fact("memory cgroup", &facts.cgroup_memory, is_safe_path)?,
        hub_cg_cpu: fact("cpu cgroup", &facts.cgroup_cpu, is_safe_path)?,
    };
    templates::render_yaml("delegate-stack.yml", &with_registry(ctx, facts)?)
}

/// The context with the registry's facts: all three or none, each checked.
fn with_registry(mut ctx: Context, facts: &Facts) -> Result<Context, RenderError> {
    let given = [&facts.worker_image, &facts.sandbox_pull, &facts.registry_version];
    if given.iter().all(|f| f.is_empty()) {
        ctx.worker_image = ctx.cluster_image.clone();
        return Ok(ctx);
    }
    if given.iter().any(|f| f.is_empty()) {
        return Err(RenderError::Invalid(
            "--worker-image, --sandbox-pull and --registry-version go together".into(),
        ));
    }
    ctx.worker_image = fact("worker image", &facts.worker_image, is_image_digest)?;
    ctx.sandbox_pull = fact("sandbox image to pull", &facts.sandbox_pull, is_image_digest)?;
    ctx.registry_version = fact("registry credentials version", &facts.registry_version, is_version)?;
    Ok(ctx)
}

/// An image reference pinned by its digest (`host:port/name@sha256:...`).
fn is_image_digest(s: &str) -> bool {
    is_image(s)
        && s.split_once("@sha256:")
            .is_some_and(|(_, d)| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_volumes() {
        assert!(is_version("0123abcdef") && !is_version("xyz") && !is_version("01234"));
        assert!(is_volume("delegate-accounting-db") && !is_volume("-x") && !is_volume("a b"));
    }
}

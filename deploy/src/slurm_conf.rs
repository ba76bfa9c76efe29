//! slurm.conf for either shape, and what it needs from the settings.

use serde::Serialize;

use crate::nodes::{Elastic, Workers};
use crate::settings::{is_node_name, is_unix_name};
use crate::{templates, RenderError, Settings, Shape, MARKER};

/// What only the local machine can say about itself (build_cluster.sh
/// asks slurmd -C, hostname, the GPU probe).
#[derive(Debug, Clone)]
pub struct LocalNode {
    /// `hostname -s`.
    pub node: String,
    /// `CPUs=.. RealMemory=..` (and more `Key=Value` words) from `slurmd -C`.
    pub hardware: String,
    /// GPUs declared to Slurm.
    pub gpus: u64,
    /// `slurm` when that account exists, else `root`.
    pub slurm_user: String,
}

#[derive(Serialize)]
struct Context {
    marker: &'static str,
    shape: &'static str,
    cluster_name: String,
    node: String,
    slurm_user: String,
    state_dir: String,
    log_dir: String,
    run_dir: String,
    accounting: bool,
    dbd_host: &'static str,
    dbd_port: u64,
    part_maxtime: String,
    gpus: bool,
    local_gpus: String,
    node_lines: Vec<String>,
    partition_nodes: String,
    first_job_id: u64,
    slurmd_timeout: u64,
    elastic: Option<ElasticContext>,
}

#[derive(Serialize)]
struct ElasticContext {
    #[serde(flatten)]
    limits: Elastic,
    always_on: String,
}

/// `Key=Value` words of a node's hardware, as Slurm prints and reads them.
fn is_hardware(s: &str) -> bool {
    !s.is_empty()
        && s.split(' ').all(|w| {
            w.split_once('=').is_some_and(|(k, v)| {
                !k.is_empty()
                    && k.bytes().all(|b| b.is_ascii_alphabetic())
                    && !v.is_empty()
                    && v.bytes().all(|b| b.is_ascii_alphanumeric() || b":.,()-_".contains(&b))
            })
        })
}

/// The stack's workers from the settings (`DELEGATE_ELASTIC=1`: the
/// elastic maximum, whatever `DELEGATE_STACK_WORKERS` says; placement:
/// `DELEGATE_STACK_SLOTS` slots for machines).
pub fn stack_workers(s: &Settings) -> Result<Workers, RenderError> {
    if !s.flag("DELEGATE_ELASTIC")? {
        let slots = if s.flag("DELEGATE_STACK_PLACEMENT")? {
            Some(s.count("DELEGATE_STACK_SLOTS", 1, 999)?)
        } else {
            None
        };
        return Ok(Workers {
            count: s.count("DELEGATE_STACK_WORKERS", 1, 999)?,
            elastic: None,
            slots,
        });
    }
    let e = Elastic {
        min: s.count("DELEGATE_ELASTIC_MIN", 0, 999)?,
        max: s.count("DELEGATE_ELASTIC_MAX", 1, 999)?,
        idle: s.count("DELEGATE_ELASTIC_IDLE", 10, 10_000_000)?,
        resume_timeout: s.count("DELEGATE_ELASTIC_RESUME_TIMEOUT", 30, 86_400)?,
    };
    if e.min > e.max {
        return Err(RenderError::Invalid(format!(
            "DELEGATE_ELASTIC_MIN ({}) is above DELEGATE_ELASTIC_MAX ({})",
            e.min, e.max
        )));
    }
    Ok(Workers {
        count: e.max,
        elastic: Some(e),
        slots: None,
    })
}

/// The partition's MaxTime (HH:MM:SS): the longest limit a student's job
/// asks for, a map's allocation's (the default policy's
/// max_allocation_time, max_time, and the allowance for the call in
/// progress), as the client asks Slurm for it (its minute of slack,
/// delegate-client `time_limit_minutes`). A student's job cannot ask for
/// more, nor be raised to more (slurmctld lets a user raise a pending
/// job's limit up to MaxTime; the gate refuses any raise): security round
/// 4, item 2.
pub fn part_maxtime(max_time: &str) -> Result<String, RenderError> {
    let secs = |d: &str| {
        delegate_protocol::units::parse_duration(d)
            .map_err(|e| RenderError::Invalid(format!("the duration '{d}': {e}")))
    };
    let call = secs(max_time)?;
    let longest = secs(&delegate_protocol::policy::Policy::default().max_allocation_time)?
        .saturating_add(call)
        .saturating_add(delegate_protocol::policy::MAP_CALL_ALLOWANCE_SECS);
    let minutes = longest.saturating_add(60).div_ceil(60);
    Ok(format!("{:02}:{:02}:00", minutes / 60, minutes % 60))
}

fn dir(s: &Settings, name: &str) -> Result<String, RenderError> {
    Ok(s.checked(
        name,
        "an absolute path of A-Z a-z 0-9 . _ / + @ = , : -",
        crate::settings::is_safe_path,
    )?)
}

fn local_context(s: &Settings, n: &LocalNode) -> Result<Context, RenderError> {
    if !is_node_name(&n.node) {
        return Err(RenderError::Invalid(format!(
            "the node name '{}' is not a short host name",
            n.node
        )));
    }
    if !is_hardware(&n.hardware) {
        return Err(RenderError::Invalid(format!(
            "the node's hardware '{}' is not Key=Value words",
            n.hardware
        )));
    }
    if !is_unix_name(&n.slurm_user) {
        return Err(RenderError::Invalid(format!("SlurmUser '{}' is not a user name", n.slurm_user)));
    }
    let gres = if n.gpus > 0 {
        format!(" Gres=gpu:{}", n.gpus)
    } else {
        String::new()
    };
    Ok(Context {
        marker: MARKER,
        shape: "local",
        cluster_name: "delegate".into(),
        node: n.node.clone(),
        slurm_user: n.slurm_user.clone(),
        state_dir: dir(s, "DELEGATE_STATE_DIR")?,
        log_dir: dir(s, "DELEGATE_LOG_DIR")?,
        run_dir: dir(s, "DELEGATE_RUN_DIR")?,
        accounting: s.flag("DELEGATE_ACCOUNTING")?,
        dbd_host: "127.0.0.1",
        dbd_port: s.count("DELEGATE_DBD_PORT", 1, 65535)?,
        part_maxtime: part_maxtime(&s.duration("DELEGATE_MAX_TIME")?)?,
        gpus: n.gpus > 0,
        local_gpus: s
            .raw_or("DELEGATE_LOCAL_GPUS", "auto")
            .chars()
            .filter(|c| !c.is_control())
            .take(200)
            .collect(),
        node_lines: vec![format!(
            "NodeName={} NodeAddr=127.0.0.1 {}{gres} State=UNKNOWN",
            n.node, n.hardware
        )],
        partition_nodes: n.node.clone(),
        first_job_id: 1,
        slurmd_timeout: s.count("DELEGATE_SLURMD_TIMEOUT", 10, 3600)?,
        elastic: None,
    })
}

fn stack_context(s: &Settings) -> Result<Context, RenderError> {
    let name = s.checked("DELEGATE_STACK_NAME", "a name of a-z 0-9 _ -", is_unix_name)?;
    let workers = stack_workers(s)?;
    let gpus = s.count("DELEGATE_STACK_WORKER_GPUS", 0, 64)?;
    let mut hardware = format!(
        "CPUs={} RealMemory={}",
        s.count("DELEGATE_STACK_WORKER_CPUS", 1, 100_000)?,
        s.count("DELEGATE_STACK_WORKER_MEM_MB", 64, 1 << 40)?
    );
    if gpus > 0 {
        hardware.push_str(&format!(" Gres=gpu:{gpus}"));
    }
    Ok(Context {
        marker: MARKER,
        shape: "stack",
        cluster_name: format!("{name}-stack"),
        node: "head".into(),
        slurm_user: "slurm".into(),
        state_dir: "/var/lib/delegate".into(),
        log_dir: "/var/log/delegate".into(),
        run_dir: "/run/delegate".into(),
        accounting: true,
        dbd_host: "dbd",
        dbd_port: s.count("DELEGATE_DBD_PORT", 1, 65535)?,
        part_maxtime: part_maxtime(&s.duration("DELEGATE_STACK_MAX_TIME")?)?,
        gpus: gpus > 0,
        local_gpus: String::new(),
        node_lines: workers.node_lines(&hardware),
        partition_nodes: workers.all(),
        first_job_id: s.count("DELEGATE_STACK_FIRST_JOB_ID", 1, 2_000_000_000)?,
        slurmd_timeout: s.count("DELEGATE_SLURMD_TIMEOUT", 10, 3600)?,
        elastic: workers
            .elastic
            .map(|limits| ElasticContext { limits, always_on: workers.always_on() }),
    })
}

/// slurm.conf of `shape` (`local` needs the machine's facts).
pub fn render(s: &Settings, shape: Shape, local: Option<&LocalNode>) -> Result<String, RenderError> {
    let ctx = match (shape, local) {
        (Shape::Local, Some(n)) => local_context(s, n)?,
        (Shape::Local, None) => {
            return Err(RenderError::Invalid(
                "slurm.conf of the local shape needs --node and --hardware".into(),
            ))
        }
        (Shape::Stack, _) => stack_context(s)?,
    };
    templates::render("slurm.conf", &ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_words() {
        assert!(is_hardware(
            "CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24000"
        ));
        for bad in [
            "",
            "CPUs=2  RealMemory=1",
            "CPUs=2\nNodeName=x",
            "CPUs",
            "=2",
            "CPUs=2 State=UP#",
        ] {
            assert!(!is_hardware(bad), "{bad:?}");
        }
    }

    #[test]
    fn elastic_minimum_above_maximum_is_refused() {
        let s = Settings::from_pairs([
            ("DELEGATE_ELASTIC", "1"),
            ("DELEGATE_ELASTIC_MIN", "3"),
            ("DELEGATE_ELASTIC_MAX", "2"),
            ("DELEGATE_ELASTIC_IDLE", "600"),
            ("DELEGATE_ELASTIC_RESUME_TIMEOUT", "180"),
        ]);
        assert!(stack_workers(&s).unwrap_err().to_string().contains("is above"));
    }
}

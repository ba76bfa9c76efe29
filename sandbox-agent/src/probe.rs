//! The agent's answer to `sandbox-runner probe` (what `delegate doctor`
//! shows, since students cannot reach the Docker socket themselves).
//! Anyone may ask; the CAP_PERFMON test (a container created, never
//! started) runs at most once a minute whoever asks.

use std::collections::HashMap;

use bollard::models::ContainerCreateBody;
use delegate_protocol::agent::ProbeReport as Report;
use delegate_protocol::policy::Policy;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::{self, Perf, LABEL_PROBE, LABEL_UID};
use crate::engine;

/// A throwaway container that is created (never started) to see whether the
/// engine accepts CAP_PERFMON.
fn probe_body(policy: &Policy, tmp_bytes: u64) -> ContainerCreateBody {
    // Never started; runs as nobody.
    let uid = 65534;
    ContainerCreateBody {
        image: Some(policy.default_image.clone()),
        cmd: Some(vec!["true".into()]),
        user: Some(format!("{uid}:{uid}")),
        labels: Some(HashMap::from([
            (LABEL_PROBE.to_string(), "1".to_string()),
            (LABEL_UID.to_string(), uid.to_string()),
        ])),
        network_disabled: Some(true),
        host_config: Some(config::base_host_config(tmp_bytes, policy.max_pids, Perf::Perfmon)),
        ..Default::default()
    }
}

pub async fn probe(policy: &Policy) -> Report {
    let mut r = Report {
        image: policy.default_image.clone(),
        ..Default::default()
    };
    let docker = match engine::connect(&policy.docker_socket).await {
        Ok(d) => d,
        Err(e) => {
            r.error = e.to_string();
            r.perf_mode = "unknown".into();
            r.perf_detail = "the engine could not be reached".into();
            return r;
        }
    };
    match docker.version().await {
        Ok(v) => {
            r.docker_ok = true;
            r.version = v.version.unwrap_or_default();
        }
        Err(e) => {
            r.error = engine::short_reason(&e);
            return r;
        }
    }
    r.api_version = docker.client_version().to_string();
    r.image_present = docker.inspect_image(&policy.default_image).await.is_ok();
    let tmp_bytes = policy.limits().map(|l| l.tmp_bytes).unwrap_or(64 << 20);
    let (perf, off_reason) = config::perf_for(policy.perf_mode, config::perf_paranoid());
    let (mode, detail) = match (perf, off_reason) {
        (Perf::Off, Some(why)) => (Perf::Off.as_str().to_string(), why),
        (Perf::Perfmon, _) => match perfmon_cached(&docker, policy, tmp_bytes).await {
            Ok(true) => ("perfmon".to_string(), Perf::Perfmon.detail().to_string()),
            Ok(false) => (
                "off".to_string(),
                "the engine rejects CAP_PERFMON and the site policy asks for perf_mode = \"perfmon\": jobs will fail"
                    .to_string(),
            ),
            Err(e) => (
                "unknown".to_string(),
                format!("could not test CAP_PERFMON: {}", engine::short_reason(&e)),
            ),
        },
        (p, _) => (p.as_str().to_string(), p.detail().to_string()),
    };
    r.perf_mode = mode;
    r.perf_detail = detail;
    let node = crate::ident::node_name();
    match crate::gpu::node_devices(policy, &node) {
        Ok(devs) if devs.is_empty() => {
            r.gpu_mode = "none".into();
            r.gpu_detail = format!("no GPUs for node {node} in {}", policy.gres_conf.display());
        }
        Ok(devs) => {
            let (mode, why) = crate::gpu::detect(policy, &docker).await;
            r.gpu_mode = mode.as_str().into();
            r.gpu_detail = format!(
                "{} GPU(s) in {} ({}); {why}; max_gpus = {}",
                devs.len(),
                policy.gres_conf.display(),
                devs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
                policy.max_gpus
            );
        }
        Err(e) => {
            r.gpu_mode = "unknown".into();
            r.gpu_detail = e.to_string();
        }
    }
    r
}

/// The last CAP_PERFMON test and when it ran.
static PERFMON: Mutex<Option<(Instant, bool)>> = Mutex::new(None);
const PERFMON_FOR: Duration = Duration::from_secs(60);

async fn perfmon_cached(
    docker: &bollard::Docker,
    policy: &Policy,
    tmp_bytes: u64,
) -> Result<bool, bollard::errors::Error> {
    if let Ok(g) = PERFMON.lock() {
        if let Some((at, v)) = *g {
            if at.elapsed() < PERFMON_FOR {
                return Ok(v);
            }
        }
    }
    let v = engine::perfmon_accepted(docker, probe_body(policy, tmp_bytes)).await?;
    if let Ok(mut g) = PERFMON.lock() {
        *g = Some((Instant::now(), v));
    }
    Ok(v)
}

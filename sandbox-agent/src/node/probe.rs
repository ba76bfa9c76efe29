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

use crate::sandbox::config::{self, Perf, LABEL_PROBE, LABEL_UID};
use crate::sandbox::engine;

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
    let tmp_bytes = policy.limits().tmp_bytes;
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
    let node = crate::caller::ident::node_name();
    match crate::gpu::devices::node_devices(policy, &node) {
        Ok(devs) if devs.is_empty() => {
            r.gpu_mode = "none".into();
            r.gpu_detail = format!("no GPUs for node {node} in {}", policy.gres_conf.display());
        }
        Ok(devs) => {
            let (mode, why) = crate::gpu::devices::detect(policy, &docker).await;
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

/// How long one probe's report answers every asker.
pub const PROBE_FOR: Duration = Duration::from_secs(5);

/// The last probe's report, shared by every connection: a flood of
/// probes costs the engine one probe in [`PROBE_FOR`] (security round 4,
/// item 6: 16 connections of probes, two engine calls each, slowed
/// everyone's calls 3-4x). Askers while a probe runs wait for it. A report
/// is reused only for the same `key` (what the probe reads cheaply: the
/// policy file, kernel.perf_event_paranoid), so a change of either shows
/// at once.
#[derive(Default)]
pub struct Cached {
    last: tokio::sync::Mutex<Option<(Instant, String, Report)>>,
}

impl Cached {
    /// The report of the last [`PROBE_FOR`] for `key`, or a new one from `probe`.
    pub async fn get<F, Fut>(&self, key: String, probe: F) -> Report
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Report>,
    {
        let mut last = self.last.lock().await;
        if let Some((at, k, r)) = last.as_ref() {
            if at.elapsed() < PROBE_FOR && *k == key {
                return r.clone();
            }
        }
        let r = probe().await;
        *last = Some((Instant::now(), key, r.clone()));
        r
    }
}

/// What a probe's report depends on that is cheap to read: the policy
/// file's identity and size and time, and kernel.perf_event_paranoid.
pub fn cache_key(policy_path: &std::path::Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::metadata(policy_path)
        .map(|m| format!("{}:{}:{}:{}", m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
        .unwrap_or_default();
    format!("{file}|{:?}", config::perf_paranoid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_flood_of_probes_costs_one_probe() {
        let cached = Cached::default();
        let runs = AtomicUsize::new(0);
        for _ in 0..100 {
            let r = cached
                .get("k".into(), || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Report {
                        version: "26.1".into(),
                        ..Default::default()
                    }
                })
                .await;
            assert_eq!(r.version, "26.1");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // Another key (the policy or perf_event_paranoid changed): probed afresh.
        cached.get("k2".into(), || async { Report::default() }).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the counter is the first closure's");
        let r = cached.get("k2".into(), || async { unreachable!() }).await;
        assert_eq!(r, Report::default());
    }
}

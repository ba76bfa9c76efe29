//! Multi-node rank jobs: the job-private network and the rank's part of
//! the container configuration.
//!
//! One Docker network per Slurm job, `delegate-job-<slurm job>`, created by
//! the agent serving rank 0 and joined by the others: `internal` (no route
//! out, no NAT, no published port) and with the bridge's host address
//! inhibited (`com.docker.network.bridge.inhibit_ipv4`), so that a sandbox
//! cannot reach even the host's own services through the gateway address.
//! Only containers this job's agents create join it: nothing else names
//! it. Rank 0 carries the network alias [`MASTER_ALIAS`], which is
//! `MASTER_ADDR`. Each rank's agent tries to remove the network when its
//! sandbox is gone; the last one succeeds (the engine refuses while
//! endpoints remain), and the epilog sweeps it with the job.
//!
//! This needs every rank's engine to see the same network: true when the
//! workers share one engine (the swarm stack on one host). On a real
//! multi-host cluster the network must be a swarm-scoped `overlay` with
//! `attachable` and `internal` (see docs/ml.md); the driver is the site
//! policy's choice there.

use std::collections::HashMap;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, EndpointSettings, NetworkCreateRequest, NetworkingConfig};
use bollard::query_parameters::ListNetworksOptions;
use bollard::Docker;
use delegate_protocol::agent::{rank_env, MASTER_ALIAS};

use crate::caller::ident::{Caller, RankPlace};
use crate::sandbox::config::{LABEL_NODE, LABEL_SLURM_JOB, LABEL_UID};
use crate::sandbox::engine;

/// The label that marks delegate's job networks.
pub const LABEL_NETWORK: &str = "delegate.network";
/// How long a rank waits for rank 0's agent to create the network.
const NETWORK_WAIT: Duration = Duration::from_secs(60);

/// The network's name for a Slurm job.
pub fn network_name(slurm_job: &str) -> String {
    format!("delegate-job-{slurm_job}")
}

/// The container name of a rank (two ranks may share one engine).
pub fn container_name(job: &str, rank: u32) -> String {
    format!("delegate-{job}-rank{rank}")
}

/// The network's labels: its job, its student and the node whose agent
/// created it (an engine may serve the nodes of several clusters: each
/// node's epilog sweeps only the ended jobs' networks its own agent made).
fn labels(slurm_job: &str, uid: u32, node: &str) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_SLURM_JOB.to_string(), slurm_job.to_string()),
        (LABEL_UID.to_string(), uid.to_string()),
        (LABEL_NETWORK.to_string(), "rank".to_string()),
        (LABEL_NODE.to_string(), node.to_string()),
    ])
}

/// The creation request of a job's network (rank 0's agent on `node`).
pub fn network_request(slurm_job: &str, uid: u32, node: &str) -> NetworkCreateRequest {
    NetworkCreateRequest {
        name: network_name(slurm_job),
        driver: Some("bridge".into()),
        internal: Some(true),
        attachable: Some(false),
        labels: Some(labels(slurm_job, uid, node)),
        options: Some(HashMap::from([(
            "com.docker.network.bridge.inhibit_ipv4".to_string(),
            "true".to_string(),
        )])),
        ..Default::default()
    }
}

/// Why a rank has no network of its job.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("cannot list the job's network: {}", engine::short_reason(.0))]
    List(bollard::errors::Error),
    #[error("cannot create the job's network: {}", engine::short_reason(.0))]
    Create(bollard::errors::Error),
    #[error("the rank task ended while waiting for the job's network")]
    CallerEnded,
    #[error("rank 0 did not create the job's network within {}s", .0.as_secs())]
    NotCreated(Duration),
}

/// The id of this job's network, if one exists (the oldest when several do).
async fn find(docker: &Docker, slurm_job: &str, uid: u32) -> Result<Option<String>, NetworkError> {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![
            format!("{LABEL_SLURM_JOB}={slurm_job}"),
            format!("{LABEL_UID}={uid}"),
            format!("{LABEL_NETWORK}=rank"),
        ],
    )]);
    let mut nets = docker
        .list_networks(Some(ListNetworksOptions { filters: Some(filters) }))
        .await
        .map_err(NetworkError::List)?;
    nets.retain(|n| n.name.as_deref() == Some(network_name(slurm_job).as_str()));
    nets.sort_by_key(|n| (n.created.as_ref().map(|c| c.to_string()), n.id.clone()));
    Ok(nets.into_iter().find_map(|n| n.id))
}

/// The job's network for this rank: rank 0 creates it, the others wait
/// for it (while their caller lives).
pub async fn ensure_network(
    docker: &Docker,
    caller: &Caller,
    place: RankPlace,
    node: &str,
) -> Result<String, NetworkError> {
    let slurm_job = caller.job.as_str();
    if place.rank == 0 {
        if let Some(id) = find(docker, slurm_job, caller.uid).await? {
            return Ok(id);
        }
        let r = docker
            .create_network(network_request(slurm_job, caller.uid, node))
            .await
            .map_err(NetworkError::Create)?;
        tracing::info!("Slurm job {slurm_job}: created network {} ({})", network_name(slurm_job), r.id);
        return Ok(r.id);
    }
    let deadline = tokio::time::Instant::now() + NETWORK_WAIT;
    loop {
        if let Some(id) = find(docker, slurm_job, caller.uid).await? {
            return Ok(id);
        }
        if !caller.alive() {
            return Err(NetworkError::CallerEnded);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(NetworkError::NotCreated(NETWORK_WAIT));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Removes the network unless other ranks' sandboxes are still on it.
pub async fn release_network(docker: &Docker, id: &str) {
    match docker.remove_network(id).await {
        Ok(()) => tracing::info!("removed network {id}"),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
        Err(e) => tracing::info!("network {id} not removed yet: {}", engine::short_reason(&e)),
    }
}

/// The rank's part of the container: the job's network (rank 0 under the
/// alias `MASTER_ADDR` names) instead of none, and the rank environment
/// replacing any of the spec's own variables of those names.
pub fn apply(body: &mut ContainerCreateBody, network: &str, place: RankPlace) {
    body.network_disabled = Some(false);
    if let Some(h) = body.host_config.as_mut() {
        h.network_mode = Some(network.to_string());
    }
    let aliases = (place.rank == 0).then(|| vec![MASTER_ALIAS.to_string()]);
    body.networking_config = Some(NetworkingConfig {
        endpoints_config: Some(HashMap::from([(
            network.to_string(),
            EndpointSettings { aliases, ..Default::default() },
        )])),
    });
    let env: Vec<(String, String)> = body
        .env
        .take()
        .unwrap_or_default()
        .into_iter()
        .map(|e| match e.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (e, String::new()),
        })
        .collect();
    body.env = Some(
        rank_env(&env, place.rank, place.world)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_is_internal_without_host_address() {
        let r = network_request("42", 1001, "worker1");
        assert_eq!(r.name, "delegate-job-42");
        assert_eq!(r.internal, Some(true));
        assert_eq!(r.attachable, Some(false));
        assert_eq!(
            r.options
                .unwrap()
                .get("com.docker.network.bridge.inhibit_ipv4")
                .map(String::as_str),
            Some("true")
        );
        let labels = r.labels.unwrap();
        assert_eq!(labels.get(LABEL_SLURM_JOB).map(String::as_str), Some("42"));
        assert_eq!(labels.get(LABEL_NODE).map(String::as_str), Some("worker1"));
    }

    #[test]
    fn apply_joins_the_network_with_rank_env() {
        let mut body = ContainerCreateBody {
            env: Some(vec!["HOME=/job".into(), "RANK=9".into()]),
            network_disabled: Some(true),
            host_config: Some(bollard::models::HostConfig {
                network_mode: Some("none".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        apply(&mut body, "netid", RankPlace { rank: 0, world: 2 });
        assert_eq!(body.network_disabled, Some(false));
        assert_eq!(body.host_config.as_ref().unwrap().network_mode.as_deref(), Some("netid"));
        let env = body.env.clone().unwrap();
        assert!(env.contains(&"HOME=/job".to_string()));
        assert!(env.contains(&"RANK=0".to_string()));
        assert!(!env.contains(&"RANK=9".to_string()));
        assert!(env.contains(&"WORLD_SIZE=2".to_string()));
        assert!(env.contains(&format!("MASTER_ADDR={MASTER_ALIAS}")));
        let ep = body.networking_config.unwrap().endpoints_config.unwrap();
        assert_eq!(ep["netid"].aliases, Some(vec![MASTER_ALIAS.to_string()]));
        let mut b1 = ContainerCreateBody {
            host_config: Some(Default::default()),
            ..Default::default()
        };
        apply(&mut b1, "netid", RankPlace { rank: 1, world: 2 });
        assert_eq!(b1.networking_config.unwrap().endpoints_config.unwrap()["netid"].aliases, None);
    }
}

//! The call measured: the cores it runs on tuned for it, the machine's
//! fingerprint before and after, sent before its end.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use bollard::Docker;
use delegate_protocol::agent::{Answer, Ended};
use delegate_protocol::Fingerprint;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::caller::conn::{self, Incoming};
use crate::gpu::devices::{self as gpu};
use crate::measure::fingerprint;
use crate::sandbox::call::CheckedCall;
use crate::sandbox::config::Perf;
use crate::sandbox::supervise;

/// The created sandbox of a call and where its answers go.
pub(super) struct CreatedSandbox<'a> {
    pub(super) docker: &'a Docker,
    pub(super) id: &'a str,
    pub(super) gpus: &'a gpu::Passthrough,
    pub(super) perf: Perf,
    pub(super) dir: &'a OwnedFd,
    pub(super) stream: &'a UnixStream,
}

/// Runs the call on `cores`, tuned for it (restored when `tuned` is
/// dropped, after the fingerprint has read the state the call ran in), and
/// sends its fingerprint before its end.
pub(super) async fn measured_call(
    ctx: &CheckedCall<'_>,
    call: &CreatedSandbox<'_>,
    cores: Vec<u32>,
    out: OwnedFd,
    err: OwnedFd,
    rx: &mut mpsc::Receiver<Incoming>,
) -> Ended {
    let tuned = if ctx.policy.tune_cpus {
        crate::measure::tune::tune(std::path::Path::new("/"), &cores)
    } else {
        crate::measure::tune::untouched()
    };
    let before = fingerprint_before(ctx, cores).await;
    let gpus = crate::gpu::info::now(&call.gpus.devices, &call.gpus.ordinals).await;
    let (docker, perf) = (call.docker, call.perf);
    let ended = supervise::supervise(ctx, docker, call.id, perf, call.dir, out, err, call.stream, rx).await;
    let mut fp = fingerprint_after(ctx, docker, before, perf).await;
    fp.tuning = tuned.notes.clone();
    fp.gpus = gpus;
    drop(tuned);
    let _ = conn::send(call.stream, &Answer::Fingerprint(Box::new(fp))).await;
    ended
}

/// The cores the call runs on: its own (pinned), else the allocation's.
pub(super) fn call_cores(ctx: &CheckedCall<'_>, placement: Option<&delegate_protocol::cpus::Placement>) -> Vec<u32> {
    let cores = placement.map_or(&ctx.caller.cpus, |p| &p.sandbox);
    cores.iter().filter_map(|&c| u32::try_from(c).ok()).collect()
}

/// The /proc that shows the node's tasks (the host's on a stack worker).
pub(super) fn node_proc(ctx: &CheckedCall<'_>) -> PathBuf {
    match &ctx.policy.host_proc {
        p if p.as_os_str().is_empty() => PathBuf::from("/proc"),
        p => p.clone(),
    }
}

/// The machine's state just before the call starts (crate::measure::fingerprint).
pub(super) async fn fingerprint_before(ctx: &CheckedCall<'_>, cores: Vec<u32>) -> fingerprint::Before {
    let proc = node_proc(ctx);
    let skip = [std::process::id() as i32].into_iter().collect();
    let caller = ctx.uid;
    tokio::task::spawn_blocking(move || fingerprint::before(std::path::Path::new("/"), &proc, &cores, &skip, caller))
        .await
        .unwrap_or_else(|_| fingerprint::Before::unknown(caller))
}

/// The fingerprint of the call that just ended.
pub(super) async fn fingerprint_after(
    ctx: &CheckedCall<'_>,
    docker: &Docker,
    before: fingerprint::Before,
    perf: Perf,
) -> Fingerprint {
    let image_id = docker.inspect_image(&ctx.spec.image).await.ok().and_then(|i| i.id);
    let (proc, node) = (node_proc(ctx), ctx.node.clone());
    let skip = [std::process::id() as i32].into_iter().collect();
    let perf = perf.as_str();
    tokio::task::spawn_blocking(move || {
        let hw = fingerprint::hardware_counters();
        fingerprint::after(std::path::Path::new("/"), &proc, before, &skip, &node, perf, image_id, hw)
    })
    .await
    .unwrap_or_default()
}

//! gres.conf: the GPUs' device files, in Slurm's order.

use serde::Serialize;

use crate::settings::is_node_name;
use crate::slurm_conf::stack_workers;
use crate::{templates, RenderError, Settings, Shape, MARKER};

#[derive(Serialize)]
struct Context {
    marker: &'static str,
    shape: &'static str,
    origin: String,
    gpus: u64,
    nodes: String,
    files: String,
}

/// Device files as gres.conf lists them: paths, ranges `[0-1]`, commas.
fn is_device_list(s: &str) -> bool {
    s.starts_with('/') && s.len() <= 4096 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-[],".contains(&b))
}

/// The local node's gres.conf: `gpus` devices `files` (DELEGATE_LOCAL_GPUS
/// says where they came from).
pub fn local(s: &Settings, node: &str, gpus: u64, files: &str) -> Result<String, RenderError> {
    if !is_node_name(node) {
        return Err(RenderError::Invalid(format!("the node name '{node}' is not a short host name")));
    }
    if gpus > 0 && !is_device_list(files) {
        return Err(RenderError::Invalid(format!(
            "the GPU device files '{files}' are not absolute paths"
        )));
    }
    let how: String = s
        .raw_or("DELEGATE_LOCAL_GPUS", "auto")
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    let ctx = Context {
        marker: MARKER,
        shape: "local",
        origin: format!("build_cluster.sh, DELEGATE_LOCAL_GPUS={how}"),
        gpus,
        nodes: node.into(),
        files: files.into(),
    };
    templates::render("gres.conf", &ctx)
}

/// The stack's gres.conf: DELEGATE_STACK_WORKER_GPUS on every worker.
pub fn stack(s: &Settings) -> Result<String, RenderError> {
    let gpus = s.count("DELEGATE_STACK_WORKER_GPUS", 0, 64)?;
    let ctx = Context {
        marker: MARKER,
        shape: "stack",
        origin: "cluster.toml DELEGATE_STACK_WORKER_GPUS".into(),
        gpus,
        nodes: stack_workers(s)?.all(),
        files: format!("/dev/nvidia[0-{}]", gpus.saturating_sub(1)),
    };
    templates::render("gres.conf", &ctx)
}

/// gres.conf of `shape`.
pub fn render(s: &Settings, shape: Shape, node: &str, gpus: u64, files: &str) -> Result<String, RenderError> {
    match shape {
        Shape::Local => local(s, node, gpus, files),
        Shape::Stack => stack(s),
    }
}

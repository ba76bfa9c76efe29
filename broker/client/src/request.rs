//! What a caller asks for ([`SubmitRequest`]) and gets back ([`JobHandle`]).

use std::path::PathBuf;

use delegate_protocol::{JobId, Resources, Task};
use serde::Serialize;

/// What to run and with which resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubmitRequest {
    pub task: Task,
    /// `None`: the site policy's default image.
    pub image: Option<String>,
    /// CPUs, memory, time, GPUs and nodes (the spec's own type). More than
    /// one node makes a multi-node rank job (one sandbox per node,
    /// `RANK`/`WORLD_SIZE`/`MASTER_ADDR`...), submitted alone.
    pub resources: Resources,
    pub env: Vec<(String, String)>,
    /// Opaque bytes for the sandbox (a pickled call); at most [`MAX_PAYLOAD_BYTES`].
    pub payload: Option<Vec<u8>>,
    /// Submit held: the job stays pending until `scontrol release <slurm-id>`.
    pub hold: bool,
    /// Files and directories copied into the job directory before
    /// submission (the sandbox sees `/job/<name>`; see [`crate::ship`]).
    pub files: Vec<std::path::PathBuf>,
    /// Let the calls of this submission run on nodes of different hardware
    /// classes (default: a map's calls, and a multi-node job's nodes, keep
    /// to one class; see [`crate::slurm::nodes`]).
    pub mix_classes: bool,
    /// How many times a call runs again after its node was lost; `None`:
    /// [`delegate_protocol::attempt::DEFAULT_RETRIES`], or the site's
    /// `max_retries` when lower. A multi-node job is never run again.
    pub retries: Option<u32>,
}

impl SubmitRequest {
    /// A request with the default resources (1 CPU, 1G, 10 minutes).
    pub fn new(task: Task) -> SubmitRequest {
        SubmitRequest {
            task,
            image: None,
            resources: Resources::default(),
            env: Vec::new(),
            payload: None,
            hold: false,
            files: Vec::new(),
            mix_classes: false,
            retries: None,
        }
    }

    /// A command job (argv, no shell).
    pub fn command(argv: Vec<String>) -> SubmitRequest {
        SubmitRequest::new(Task::Command { argv })
    }

    /// `n` calls of this request for one submission: call `i` gets
    /// `DELEGATE_INDEX=i` (replacing any of its own); one call is the
    /// request itself, unchanged.
    pub fn copies(&self, n: u32) -> Vec<SubmitRequest> {
        if n == 1 {
            return vec![self.clone()];
        }
        (0..n)
            .map(|i| {
                let mut r = self.clone();
                r.env.retain(|(k, _)| k != INDEX_ENV);
                r.env.push((INDEX_ENV.into(), i.to_string()));
                r
            })
            .collect()
    }
}

/// The variable that numbers the calls of a `--count`/`count:` submission.
pub const INDEX_ENV: &str = "DELEGATE_INDEX";

/// A submitted job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JobHandle {
    pub id: JobId,
    pub slurm_id: String,
    pub dir: PathBuf,
}

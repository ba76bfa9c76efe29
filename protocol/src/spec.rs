//! The job's request ([`Spec`]): what to run and with which resources,
//! written once by the client; its structural checks.

use serde::{Deserialize, Serialize};

use crate::{JobId, ProtocolError, Result};

/// Upper bound on the number of argv entries and environment variables.
pub const MAX_ARGS: usize = 4096;
pub const MAX_ENV: usize = 128;
/// Upper bound on the GPUs one job may ask for (whatever the policy says).
pub const MAX_GPUS: u32 = 64;
/// Upper bound on a single string inside the spec.
pub const MAX_STRING: usize = 8 * 1024;

/// What the sandbox runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Task {
    /// Run argv (no shell) in the image, working directory [`SANDBOX_JOB_DIR`].
    Command { argv: Vec<String> },
    /// Run the Python executor on `payload`; it writes `result`. The versions
    /// are the caller's, so the executor can name a mismatch.
    Python {
        python_version: String,
        cloudpickle_version: String,
    },
}

/// Resources asked for. The runner checks each against the site policy.
/// (Ordered only so that callers may group requests by them.)
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Resources {
    pub cpus: u32,
    pub mem_bytes: u64,
    pub time_limit_secs: u64,
    /// Nodes of the allocation: one sandbox (rank) per node, at most
    /// [`crate::MAX_RANKS`], checked against the policy's `max_nodes`.
    pub nodes: u32,
    /// GPUs per node (Slurm GRES `gpu`), passed through to the container:
    /// exactly the devices Slurm allocated, checked against `max_gpus`.
    pub gpus: u32,
    /// How many times the call runs again when an attempt ends without an
    /// outcome because of its node (the node failed or was set down, the
    /// allocation was requeued): checked against `max_retries`; always 0
    /// for a multi-node job ([`crate::attempt`]).
    pub retries: u32,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: 1,
            mem_bytes: 1 << 30,
            time_limit_secs: 600,
            nodes: 1,
            gpus: 0,
            retries: 0,
        }
    }
}

/// The job's request, written once by the client before submission.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub job_id: JobId,
    /// The uid the job must run as; the runner checks it is its own real uid.
    pub uid: u32,
    pub gid: u32,
    pub created_ms: u64,
    pub image: String,
    pub task: Task,
    pub resources: Resources,
    /// Extra environment for the sandbox (names `[A-Z_][A-Z0-9_]*`).
    pub env: Vec<(String, String)>,
}

impl Spec {
    /// Structural checks that need no site policy: bounds and well-formedness.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ProtocolError::InvalidSpec(m));
        if self.image.is_empty() || self.image.len() > 256 {
            return bad("the image name must be 1 to 256 characters".into());
        }
        match &self.task {
            Task::Command { argv } => {
                if argv.is_empty() {
                    return bad("the command is empty".into());
                }
                if argv.len() > MAX_ARGS {
                    return bad(format!("more than {MAX_ARGS} arguments"));
                }
                if argv.iter().any(|a| a.len() > MAX_STRING || a.contains('\0')) {
                    return bad(format!("an argument is longer than {MAX_STRING} bytes or contains NUL"));
                }
            }
            Task::Python { python_version, cloudpickle_version } => {
                if python_version.len() > 64 || cloudpickle_version.len() > 64 {
                    return bad("version strings longer than 64 bytes".into());
                }
            }
        }
        if self.env.len() > MAX_ENV {
            return bad(format!("more than {MAX_ENV} environment variables"));
        }
        for (k, v) in &self.env {
            let valid_name = !k.is_empty()
                && k.len() <= 128
                && k.bytes()
                    .enumerate()
                    .all(|(i, c)| c == b'_' || c.is_ascii_uppercase() || (i > 0 && c.is_ascii_digit()));
            if !valid_name {
                return bad(format!("invalid environment variable name {k:?}"));
            }
            if v.len() > MAX_STRING || v.contains('\0') {
                return bad(format!("environment variable {k} is too long or contains NUL"));
            }
        }
        let r = &self.resources;
        if r.cpus == 0 || r.mem_bytes == 0 || r.time_limit_secs == 0 || r.nodes == 0 {
            return bad("cpus, memory, time limit and nodes must be positive".into());
        }
        if r.nodes > crate::MAX_RANKS {
            return bad(format!("more than {} nodes", crate::MAX_RANKS));
        }
        if r.nodes > 1 && r.gpus > 0 {
            return bad("GPUs are not available to multi-node jobs yet".into());
        }
        if r.gpus > MAX_GPUS {
            return bad(format!("more than {MAX_GPUS} GPUs"));
        }
        Ok(())
    }
}

/// A valid spec, for the tests of this crate.
#[cfg(test)]
pub(crate) fn sample_spec() -> Spec {
    Spec {
        job_id: JobId::new(),
        uid: 1000,
        gid: 1000,
        created_ms: crate::now_ms(),
        image: "delegate-sandbox:latest".into(),
        task: Task::Command { argv: vec!["echo".into(), "hi".into()] },
        resources: Resources::default(),
        env: vec![("FOO".into(), "bar".into())],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        sample_spec()
    }

    /// Why `s` is refused.
    fn refused(s: &Spec) -> String {
        match s.validate() {
            Err(ProtocolError::InvalidSpec(why)) => why,
            other => panic!("expected an invalid spec, got {other:?}"),
        }
    }

    #[test]
    fn validate_rejects() {
        let mut s = spec();
        s.task = Task::Command { argv: vec![] };
        assert_eq!(refused(&s), "the command is empty");
        let mut s = spec();
        s.env = vec![("lower".into(), "x".into())];
        assert_eq!(refused(&s), "invalid environment variable name \"lower\"");
        let mut s = spec();
        s.resources.cpus = 0;
        assert_eq!(refused(&s), "cpus, memory, time limit and nodes must be positive");
        let mut s = spec();
        s.resources.nodes = crate::MAX_RANKS + 1;
        assert_eq!(refused(&s), format!("more than {} nodes", crate::MAX_RANKS));
        s.resources.nodes = 2;
        s.validate().expect("two nodes without GPUs are valid");
        s.resources.gpus = 1;
        assert_eq!(refused(&s), "GPUs are not available to multi-node jobs yet");
        spec().validate().expect("the sample spec is valid");
    }
}

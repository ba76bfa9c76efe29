//! The layout of a job directory: the names of its files, and the bound of
//! the opaque payload and result (see the crate documentation for who
//! writes which file).

/// Upper bound on the size of the opaque payload.
pub const MAX_PAYLOAD_BYTES: u64 = 256 * 1024 * 1024;
/// The bound of the `result` file the sandbox writes (a pickled return
/// value or exception): the same as the payload's.
pub const MAX_RESULT_BYTES: u64 = MAX_PAYLOAD_BYTES;

/// First bytes of a Python call's `payload` (the format is the Python
/// package's, `delegate_sandbox`: this magic, a JSON header line, the
/// pickled call); the client reads the header for the function's name.
pub const PYTHON_PAYLOAD_MAGIC: &[u8] = b"DLGTPY1\n";

pub const SPEC: &str = "spec";
pub const PAYLOAD: &str = "payload";
pub const SLURM_ID: &str = "slurm-id";
pub const CANCEL: &str = "cancel";
pub const STARTED: &str = "started";
pub const STDOUT: &str = "stdout";
pub const STDERR: &str = "stderr";
pub const OUTCOME: &str = "outcome";
pub const RESULT: &str = "result";
/// Written by the sandbox beside `result` when a Python call raised: the
/// exception's type name (untrusted: read bounded, shown only when it is
/// a dotted name).
pub const RAISED: &str = "raised";
/// Written by the sandbox's timer of `delegate submit --repeat N`: JSON
/// with each measured run's seconds and a summary line (untrusted: the
/// call's own file, read bounded by [`MAX_REPEATS_BYTES`]).
pub const REPEATS: &str = "repeats";
/// The bound of the `repeats` file (100,000 runs' figures).
pub const MAX_REPEATS_BYTES: u64 = 4 * 1024 * 1024;
/// Files the client writes before the runner starts; anything else present
/// when the runner starts is refused.
/// (The entries a [`crate::shipped::SHIPPED`] manifest lists are accepted
/// too.)
pub const CLIENT_FILES: &[&str] = &[SPEC, PAYLOAD, SLURM_ID, CANCEL, crate::shipped::SHIPPED];
/// Upper bound on the nodes (ranks) of one job, whatever the policy says.
pub const MAX_RANKS: u32 = 256;

/// The name of rank `rank`'s copy of a per-run file (`stdout`, `stderr`,
/// `started`, `outcome`) in a multi-node job: `<name>.<rank>`. The job's
/// own `outcome` (and `started`, written by rank 0) keep their names.
pub fn rank_file(name: &str, rank: u32) -> String {
    format!("{name}.{rank}")
}

/// Where the job directory appears inside the sandbox.
pub const SANDBOX_JOB_DIR: &str = "/job";

#[cfg(test)]
mod tests {
    /// The Python package writes the payload with the same magic.
    #[test]
    fn the_python_payload_magic_is_the_python_packages() {
        let py = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../python/pysrc/delegate_sandbox/__init__.py"
        ))
        .expect("delegate_sandbox");
        assert!(
            py.contains("PAYLOAD_MAGIC = b\"DLGTPY1\\n\""),
            "delegate_sandbox's PAYLOAD_MAGIC differs"
        );
        assert_eq!(super::PYTHON_PAYLOAD_MAGIC, b"DLGTPY1\n");
    }
}

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
/// The manifest of the files a student shipped with the job, one name per
/// line (a client file; see [`crate::shipped`]).
pub const SHIPPED: &str = "shipped";
/// Written by the runner from the agent's record of the machine the call
/// ran on ([`crate::Fingerprint`]).
pub const FINGERPRINT: &str = "fingerprint";
/// Created (`O_EXCL`) by the allocation of a map that runs the call
/// ([`crate::claim`]): who claimed it.
pub const CLAIM: &str = "claim";
/// The earlier attempts of a call that ran again after its node was lost
/// ([`crate::attempt`]): written by the runner that starts a new attempt.
pub const ATTEMPTS: &str = "attempts";
/// Where `delegate.cfiddle`'s sandbox half writes the executables a
/// CFiddle experiment sent (`/job/cfiddle`).
pub const CFIDDLE: &str = "cfiddle";

/// Every name delegate itself writes at the top of a job directory: the
/// one list. A student cannot ship a file under any of these names (nor a
/// rank's copy, `<name>.<rank>`): whatever delegate reads under them is
/// delegate's own record ([`crate::shipped::shipped_name_problem`]). A
/// unit test checks that every name written anywhere, Rust or Python, is
/// here.
pub const DELEGATE_NAMES: &[&str] = &[
    SPEC,
    PAYLOAD,
    SLURM_ID,
    CANCEL,
    SHIPPED,
    CLAIM,
    STARTED,
    STDOUT,
    STDERR,
    OUTCOME,
    RESULT,
    RAISED,
    REPEATS,
    FINGERPRINT,
    CFIDDLE,
    ATTEMPTS,
];

/// Files the client writes before the runner starts; anything else present
/// when the runner starts is refused, but for the allocation's [`CLAIM`].
/// (The entries a [`SHIPPED`] manifest lists are accepted too.)
pub const CLIENT_FILES: &[&str] = &[SPEC, PAYLOAD, SLURM_ID, CANCEL, SHIPPED];
/// What may be in a job directory when the runner starts the call: the
/// client's files, the claim, and the record of earlier attempts.
pub const BEFORE_START: &[&str] = &[SPEC, PAYLOAD, SLURM_ID, CANCEL, SHIPPED, CLAIM, ATTEMPTS];
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
    use super::*;

    fn source(rel: &str) -> String {
        std::fs::read_to_string(format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"))).expect(rel)
    }

    /// The quoted word after `prefix` on each line that has it.
    fn quoted_after(text: &str, prefix: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(prefix))
            .filter_map(|rest| rest.split('"').nth(1).map(str::to_owned))
            .collect()
    }

    /// Security round 4, item 4: the names delegate writes drifted from the
    /// reserved list (`repeats`, `fingerprint` could be shipped and then
    /// read back as delegate's records). Every file-name constant here and
    /// every name the sandbox's Python writes into `/job` is in the list.
    #[test]
    fn every_name_delegate_writes_is_reserved() {
        let mut written: Vec<String> = source("protocol/src/layout.rs")
            .lines()
            .filter(|l| l.starts_with("pub const ") && l.contains(": &str = \""))
            .filter_map(|l| l.split('"').nth(1).map(str::to_owned))
            .filter(|n| !n.starts_with('/'))
            .collect();
        for py in [
            "python/pysrc/delegate_sandbox/__init__.py",
            "python/pysrc/delegate_sandbox/repeat.py",
            "python/pysrc/delegate_sandbox/measure.py",
            "python/pysrc/delegate/_cfiddle_sandbox.py",
        ] {
            let text = source(py);
            for part in text.split("\"/job/").skip(1) {
                let name: String = part.chars().take_while(|c| *c != '"' && *c != '/').collect();
                written.push(name);
            }
            // The sandbox's own module constants of the files it writes.
            for c in ["PAYLOAD = ", "RESULT = ", "RAISED = "] {
                written.extend(quoted_after(&text, c));
            }
        }
        assert!(written.len() >= 16, "the scan found too little: {written:?}");
        for name in &written {
            assert!(DELEGATE_NAMES.contains(&name.as_str()), "{name:?} is written but not reserved");
            assert!(
                crate::shipped::shipped_name_problem(name).is_some(),
                "{name:?} could be shipped"
            );
        }
        assert!(crate::shipped::shipped_name_problem(&rank_file(REPEATS, 2)).is_some());
    }

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

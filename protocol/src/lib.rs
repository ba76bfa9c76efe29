//! delegate's protocol crate, the bottom of the house. The job-directory
//! protocol: the whole contract between the user side
//! (CLI, Python shim) and the worker side (`sandbox-runner`).
//!
//! A job lives in one directory, `<delegate-root>/<job-id>/`, on the shared
//! filesystem. Files and who writes them:
//!
//! | file       | writer           | content                                              |
//! |------------|------------------|------------------------------------------------------|
//! | `spec`     | client           | [`Spec`], encoded (header + postcard), bounded        |
//! | `payload`  | client, optional | opaque bytes (a pickled call); never parsed by Rust   |
//! | `slurm-id` | client           | the Slurm job id, text (see [`format_slurm_id`])      |
//! | `cancel`   | client, optional | marker: the user asked to cancel; its text, if any, says why in the user's words ([`cancel`]) |
//! | `shipped`  | client, optional | the names of the files shipped with the job, one per line ([`shipped`]) |
//! | *shipped names* | client, optional | the files and directories the student shipped (`/job/NAME`) |
//! | `claim`    | runner of a map's allocation | who claimed the call, created `O_EXCL` before it starts ([`claim`]) |
//! | `started`  | runner           | [`Started`], encoded                                  |
//! | `stdout`   | runner           | the container's standard output, streamed             |
//! | `stderr`   | runner           | the container's standard error, streamed              |
//! | `outcome`  | runner (client when the runner never ran) | [`Outcome`], encoded          |
//! | `result`   | the sandbox      | opaque bytes (a pickled return value or exception)    |
//! | `raised`   | the sandbox, optional | the type name of the exception a Python call raised (read bounded, shown only when a dotted name) |
//! | `repeats`  | the sandbox's timer, optional | `--repeat`'s measured runs, JSON (read bounded) |
//! | `fingerprint` | runner | the machine the call ran on, from the agent ([`Fingerprint`]); shown only for a call that started |
//! | `cfiddle`  | the sandbox, optional | a CFiddle experiment's executables |
//! | `attempts` | runner of a new attempt | the earlier attempts of a call run again after its node was lost, one line each ([`attempt`]) |
//!
//! Every one of these names is in [`DELEGATE_NAMES`] (`layout.rs`, the one
//! list), and none of them can be shipped.
//!
//! A lost attempt's directory is kept beside the job's, as
//! `<delegate-root>/<job-id>.attempt-<n>/` ([`attempt`]).
//!
//! Slurm's own log of the batch script goes to `<delegate-root>/<job-id>.log`,
//! beside (not inside) the directory, so a runner that refuses a directory can
//! still explain why. Calls that share an allocation (`sandbox-runner batch`,
//! one after another) have the runner write that file per call instead, and
//! the client lists the calls of each such allocation in
//! `<delegate-root>/shared-<slurm-id>.calls` (job ids, one per line; see
//! [`shared_calls_name`]) so that cancelling its last live call one by one
//! also cancels the allocation.
//!
//! Every encoded file starts with an 8-byte header: the magic `DLGT`, a
//! one-byte kind, a reserved zero byte and the protocol version (u16, little
//! endian); the body is postcard. Every file a reader may see is written
//! atomically ([`atomic_write_at`]): temporary name, fsync, rename, fsync of
//! the directory.
//!
//! Everything here treats the directory as untrusted: files are opened
//! relative to a directory descriptor with `O_NOFOLLOW`, sizes are bounded
//! before reading, versions are checked before decoding.
//!
//! Modules: [`layout`] (file names and bounds), [`job_id`], [`spec`] (the
//! request), [`outcome`] (the runner's records and the job's states),
//! [`record`] (header, encoding, decoding), [`slurm_id`] (the `slurm-id` file
//! and the lists of shared calls), [`fsio`] (symlink-proof file access),
//! [`line`] (the lines the runner leaves in Slurm's log), [`policy`] (the
//! site policy), [`units`] (human sizes and durations), [`cancel`] (the
//! cancel marker's reason), [`claim`] (a map's allocation claiming a call),
//! [`attempt`] (a call run again after its node was lost, from a fresh
//! directory),
//! [`shipped`] (the shipped files' manifest),
//! [`fingerprint`] (the machine of a call), [`node_class`] (node classes
//! and their Slurm features), [`agent`] (the wire protocol between the
//! runner and the root agent), [`place`] (the place helper's answer: where
//! a student's waiting jobs stand), [`cpus`] (core placement on an exclusive
//! node), [`host`] (this host's name), [`error`] and [`clock`].
//!
//! Nothing here is CLI-only: `sandbox-runner` (an ordinary program that
//! hands the job to the root agent `sandbox-agent`) links this crate and
//! nothing above it.

pub mod agent;
pub mod attempt;
pub mod cancel;
pub mod claim;
pub mod clock;
pub mod cpus;
pub mod error;
pub mod fingerprint;
pub mod fsio;
pub mod host;
pub mod job_id;
pub mod layout;
pub mod line;
pub mod node_class;
pub mod outcome;
pub mod place;
pub mod policy;
pub mod record;
pub mod shipped;
pub mod slurm_id;
pub mod spec;
pub mod units;

pub use clock::now_ms;
pub use error::{ProtocolError, Result};
pub use fingerprint::{Fingerprint, Gpu, FINGERPRINT};
pub use fsio::{
    atomic_write_at, atomic_write_at_deferred, check_clean_absolute, check_owner, exists_at, list_entries,
    open_dir_nofollow, open_regular_at, read_bounded_at, sync_filesystem,
};
pub use job_id::JobId;
pub use layout::*;
pub use line::{error_line, one_line, parse_lost_line, parse_refused_line, refused_line, state_line, REFUSED_PREFIX};
pub use outcome::{Outcome, Started, State, Writer};
pub use record::{
    decode, encode, read_record_at, write_record_at, write_record_at_deferred, Record, MAGIC, MAX_RECORD_BYTES,
    MAX_SPEC_BYTES, PROTOCOL_VERSION,
};
pub use slurm_id::{format_slurm_id, parse_shared_calls, parse_slurm_id, shared_calls_name};
pub use spec::{Resources, Spec, Task, MAX_ARGS, MAX_ENV, MAX_STRING};

#[cfg(test)]
mod tests {
    /// The crate documentation's module list names every module (issue
    /// 44: it had drifted, five were missing).
    #[test]
    fn the_module_list_names_every_module() {
        let src = include_str!("lib.rs");
        let doc: String = src.lines().filter(|l| l.starts_with("//!")).collect();
        for m in src.lines().filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';')) {
            assert!(doc.contains(&format!("[`{m}`]")), "the crate doc does not list module {m}");
        }
    }
}

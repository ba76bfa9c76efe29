//! The user side of delegate: submit, status, wait, cancel, list, and
//! readers for a job's files, over the job-directory protocol
//! ([`delegate_protocol`]) and Slurm's command-line tools ([`slurm`]). Used
//! by the `delegate` CLI and (through PyO3) the Python shim, so nothing here
//! prints or exits.
//!
//! All state lives in the job directory and in Slurm, so any new process can
//! reattach to any job by id. The state of a job is computed by one pure
//! function, [`state::decide`], shared by status, wait, cancel and list.
//!
//! The [`Client`] is split by operation: [`client`] opens the root, then
//! `submit`, `jobsfile` (a map's calls from a jobs file), `job_files` (reading a
//! job directory), `reconcile` (statuses), `list`, `wait`, `cancel`,
//! `files`, `follow` (a running job's output) and `home_uids` (the home's
//! uids as the workers see them) each add their `impl Client` block.
//! Every Slurm tool runs through [`subprocess::run`], with a time limit.

pub mod client;
pub mod config;
pub mod doctor;
pub mod error;
pub mod jobsfile;
pub mod place;
pub mod plan;
pub mod request;
pub mod slurm;
pub mod state;
pub mod status;
pub mod subprocess;
pub mod tensorboard;

mod cancel;
mod files;
mod follow;
mod home_uids;
mod job_files;
mod list;
mod reconcile;
pub mod ship;
mod site_terms;
mod submit;
mod wait;

pub use cancel::CANCEL_WAIT;
pub use client::Client;
pub use config::{default_root, home_dir, Config, CALLS_PER_ALLOCATION_ENV, DEFAULT_RUNNER, ROOT_ENV, RUNNER_ENV};
pub use error::{ClientError, Result};
pub use follow::FOLLOW_PAUSE;
pub use home_uids::HomeUidError;
pub use job_files::LOG_TAIL_BYTES;
pub use jobsfile::{JobsFile, JobsFileError};
pub use list::{JobSummary, MAX_WHAT_CHARS};
pub use plan::{plan_map, MapPlan, MAX_ARRAY, SHARED_CALL_ALLOWANCE_SECS};
pub use reconcile::REPLACED_VIEW;
pub use request::{JobHandle, SubmitRequest};
pub use state::{decide, scan_log, Facts, LogFacts, SlurmView, Verdict, SUBMIT_GRACE_SECS};
pub use status::{exit_status_for, JobStatus, Stream};
pub use wait::SLURM_INTERVAL;

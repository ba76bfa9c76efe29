//! The client's one error type.

use delegate_protocol::policy::PolicyError;
use delegate_protocol::{JobId, ProtocolError};

use crate::slurm::{Refusal, SlurmError};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot find the home directory: $HOME is unset and uid {0} has no passwd entry")]
    NoHome(u32),
    #[error("cannot use the delegate root {path}: {reason}")]
    Root { path: String, reason: String },
    #[error("no job {id} in {root}")]
    NoSuchJob { id: String, root: String },
    /// A job whose directory is not one the caller owns (`own_job_dir`).
    #[error("no job {id} of yours in {root}")]
    NotYours { id: String, root: String },
    #[error("invalid job request: {0}")]
    InvalidRequest(String),
    /// The request asks for more than the site policy allows; nothing was
    /// submitted.
    #[error("the site does not allow this job: {0}")]
    NotAllowed(#[from] delegate_protocol::policy::Violation),
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
    #[error("{0}")]
    Policy(#[from] PolicyError),
    #[error("{0}")]
    Slurm(#[from] SlurmError),
    /// Slurm refused the submission by the course's accounting policy; the
    /// one sentence for the user. Nothing was left behind (the prepared job
    /// directories were removed).
    #[error("{0}")]
    Refused(Refusal),
    #[error("job {id} could not be submitted: {reason}")]
    SubmitFailed { id: JobId, reason: String },
    /// A jobs file's problems, each with its line; nothing was submitted.
    #[error("{0}")]
    JobsFile(#[from] crate::jobsfile::JobsFileError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

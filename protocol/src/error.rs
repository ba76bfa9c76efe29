//! The one error type of the protocol: every refusal names the path and why.

use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a valid job id (expected YYYYMMDDTHHMMSS-xxxxxxxx)")]
    BadJobId(String),
    #[error("{path} is {size} bytes, more than the limit of {limit}")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("{path} is not a delegate file (bad magic)")]
    BadMagic { path: String },
    #[error("{path} has protocol version {found}, this program speaks version {expected}")]
    VersionMismatch { path: String, found: u16, expected: u16 },
    #[error("{path} holds a {found} record where a {expected} record was expected")]
    WrongKind { path: String, found: char, expected: char },
    #[error("{path} could not be decoded: {reason}")]
    Decode { path: String, reason: String },
    #[error("{path} is a symbolic link; delegate never follows links in job directories")]
    Symlink { path: String },
    #[error("{path} is not a {expected}")]
    NotKind { path: String, expected: &'static str },
    #[error("{path} is owned by uid {found}, expected uid {expected}")]
    WrongOwner { path: String, found: u32, expected: u32 },
    #[error("{path} is owned by uid {owner} and cannot be opened (permission denied)")]
    NoAccess { path: String, owner: u32 },
    #[error("{path} is writable by group or others (mode {mode:o})")]
    TooOpen { path: String, mode: u32 },
    #[error("{path} is not a clean absolute path (it must be absolute, without '..' or '.')")]
    BadPath { path: String },
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
}

impl ProtocolError {
    pub fn io(path: impl fmt::Display, source: impl Into<std::io::Error>) -> Self {
        ProtocolError::Io {
            path: path.to_string(),
            source: source.into(),
        }
    }
    /// True when the error means "the file does not exist".
    pub fn is_not_found(&self) -> bool {
        matches!(self, ProtocolError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

pub type Result<T, E = ProtocolError> = std::result::Result<T, E>;

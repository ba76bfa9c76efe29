//! The encoding of the protocol's records: an 8-byte header (magic, kind,
//! reserved byte, version) and a postcard body, bounded in size; reading and
//! writing them in a job directory.

use std::os::fd::AsFd;
use std::path::Path;

use serde::{de::DeserializeOwned, Serialize};

use crate::{atomic_write_at, read_bounded_at, Outcome, ProtocolError, Result, Spec, Started, OUTCOME, SPEC, STARTED};

/// Version of the encoded records that have not changed since the first
/// (spec, started, outcome, the agent's requests). A record whose type
/// changes gets a version of its own ([`Record::VERSION`]); bump it on any
/// change of that type.
pub const PROTOCOL_VERSION: u16 = 1;
/// First four bytes of every encoded file.
pub const MAGIC: &[u8; 4] = b"DLGT";
const HEADER_LEN: usize = 8;

/// Upper bound on the size of an encoded spec.
pub const MAX_SPEC_BYTES: u64 = 64 * 1024;
/// Upper bound on the size of an encoded started record or outcome.
pub const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// A record type of the protocol: its one-byte kind and its size bound.
pub trait Record: Serialize + DeserializeOwned {
    const KIND: u8;
    const MAX_BYTES: u64;
    const NAME: &'static str;
    /// The version written into this record's header.
    const VERSION: u16 = PROTOCOL_VERSION;

    /// The body of an older version of this record, rewritten as the body
    /// of [`Record::VERSION`]; None: that version is not read.
    fn upgrade(_version: u16, _body: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

impl Record for Spec {
    const KIND: u8 = b'S';
    const MAX_BYTES: u64 = MAX_SPEC_BYTES;
    const NAME: &'static str = SPEC;
    /// 2: `Resources::retries`.
    const VERSION: u16 = 2;

    /// A version 1 spec (no retries) reads as one with none.
    fn upgrade(version: u16, body: &[u8]) -> Option<Vec<u8>> {
        (version == 1).then(|| v1::upgrade(body)).flatten()
    }
}

/// The spec as version 1 wrote it.
mod v1 {
    use serde::{Deserialize, Serialize};

    use crate::{JobId, Resources, Spec, Task};

    #[derive(Deserialize, Serialize)]
    pub(super) struct ResourcesV1 {
        pub cpus: u32,
        pub mem_bytes: u64,
        pub time_limit_secs: u64,
        pub nodes: u32,
        pub gpus: u32,
    }

    #[derive(Deserialize, Serialize)]
    pub(super) struct SpecV1 {
        pub job_id: JobId,
        pub uid: u32,
        pub gid: u32,
        pub created_ms: u64,
        pub image: String,
        pub task: Task,
        pub resources: ResourcesV1,
        pub env: Vec<(String, String)>,
    }

    pub(super) fn upgrade(body: &[u8]) -> Option<Vec<u8>> {
        let o: SpecV1 = postcard::from_bytes(body).ok()?;
        let r = o.resources;
        let spec = Spec {
            job_id: o.job_id,
            uid: o.uid,
            gid: o.gid,
            created_ms: o.created_ms,
            image: o.image,
            task: o.task,
            resources: Resources {
                cpus: r.cpus,
                mem_bytes: r.mem_bytes,
                time_limit_secs: r.time_limit_secs,
                nodes: r.nodes,
                gpus: r.gpus,
                retries: 0,
            },
            env: o.env,
        };
        postcard::to_allocvec(&spec).ok()
    }
}
impl Record for Started {
    const KIND: u8 = b'T';
    const MAX_BYTES: u64 = MAX_RECORD_BYTES;
    const NAME: &'static str = STARTED;
}
impl Record for Outcome {
    const KIND: u8 = b'O';
    const MAX_BYTES: u64 = MAX_RECORD_BYTES;
    const NAME: &'static str = OUTCOME;
}

/// Header + postcard body.
pub fn encode<R: Record>(r: &R) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(MAGIC);
    out.push(R::KIND);
    out.push(0);
    out.extend_from_slice(&R::VERSION.to_le_bytes());
    let body = postcard::to_allocvec(r).map_err(|e| ProtocolError::Decode {
        path: R::NAME.into(),
        reason: format!("encoding failed: {e}"),
    })?;
    out.extend_from_slice(&body);
    if out.len() as u64 > R::MAX_BYTES {
        return Err(ProtocolError::TooLarge {
            path: R::NAME.into(),
            size: out.len() as u64,
            limit: R::MAX_BYTES,
        });
    }
    Ok(out)
}

/// Checks size, magic, kind and version, then decodes. `path` names the
/// source in errors.
pub fn decode<R: Record>(bytes: &[u8], path: &str) -> Result<R> {
    if bytes.len() as u64 > R::MAX_BYTES {
        return Err(ProtocolError::TooLarge {
            path: path.into(),
            size: bytes.len() as u64,
            limit: R::MAX_BYTES,
        });
    }
    if bytes.len() < HEADER_LEN || &bytes[..4] != MAGIC {
        return Err(ProtocolError::BadMagic { path: path.into() });
    }
    if bytes[4] != R::KIND {
        return Err(ProtocolError::WrongKind {
            path: path.into(),
            found: bytes[4] as char,
            expected: R::KIND as char,
        });
    }
    let version = u16::from_le_bytes([bytes[6], bytes[7]]);
    let upgraded;
    let body = if version == R::VERSION {
        &bytes[HEADER_LEN..]
    } else {
        upgraded = R::upgrade(version, &bytes[HEADER_LEN..]).ok_or_else(|| ProtocolError::VersionMismatch {
            path: path.into(),
            found: version,
            expected: R::VERSION,
        })?;
        &upgraded[..]
    };
    let (value, rest) = postcard::take_from_bytes::<R>(body)
        .map_err(|e| ProtocolError::Decode { path: path.into(), reason: e.to_string() })?;
    if !rest.is_empty() {
        return Err(ProtocolError::Decode {
            path: path.into(),
            reason: format!("{} trailing bytes", rest.len()),
        });
    }
    Ok(value)
}

/// Reads and decodes a record from `dir`.
pub fn read_record_at<R: Record>(dir: impl AsFd, dir_path: &Path, uid: Option<u32>) -> Result<R> {
    let bytes = read_bounded_at(dir, dir_path, R::NAME, R::MAX_BYTES, uid)?;
    decode(&bytes, &dir_path.join(R::NAME).display().to_string())
}

/// Encodes and atomically writes a record into `dir`.
pub fn write_record_at<R: Record>(dir: impl AsFd, dir_path: &Path, r: &R) -> Result<()> {
    let bytes = encode(r)?;
    atomic_write_at(dir, dir_path, R::NAME, &bytes, 0o644)
}

/// [`write_record_at`] made durable only by a later
/// [`crate::sync_filesystem`] (see [`crate::atomic_write_at_deferred`]).
pub fn write_record_at_deferred<R: Record>(dir: impl AsFd, dir_path: &Path, r: &R) -> Result<()> {
    let bytes = encode(r)?;
    crate::atomic_write_at_deferred(dir, dir_path, R::NAME, &bytes, 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::sample_spec as spec;
    use crate::{Resources, State, Task, Writer, MAX_STRING};

    #[test]
    fn round_trip() {
        let s = spec();
        let b = encode(&s).unwrap();
        assert_eq!(&b[..4], MAGIC);
        assert_eq!(decode::<Spec>(&b, "spec").unwrap(), s);
        let o = Outcome {
            state: State::TimedOut,
            exit_code: None,
            reason: "time limit of 5s reached".into(),
            refused: false,
            oom_killed: false,
            started_ms: Some(1),
            finished_ms: 2,
            host: "n1".into(),
            writer: Writer::Runner,
        };
        assert_eq!(decode::<Outcome>(&encode(&o).unwrap(), "outcome").unwrap(), o);
    }

    #[test]
    fn version_mismatch_is_named() {
        let mut b = encode(&spec()).unwrap();
        b[6] = 99;
        match decode::<Spec>(&b, "spec") {
            Err(ProtocolError::VersionMismatch { found: 99, expected: 2, .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    /// A spec written by a client of version 1 (before retries) is read
    /// as one that asks for none.
    #[test]
    fn a_version_1_spec_reads_with_no_retries() {
        let s = spec();
        let r = &s.resources;
        let old = v1::SpecV1 {
            job_id: s.job_id.clone(),
            uid: s.uid,
            gid: s.gid,
            created_ms: s.created_ms,
            image: s.image.clone(),
            task: s.task.clone(),
            resources: v1::ResourcesV1 {
                cpus: r.cpus,
                mem_bytes: r.mem_bytes,
                time_limit_secs: r.time_limit_secs,
                nodes: r.nodes,
                gpus: r.gpus,
            },
            env: s.env.clone(),
        };
        let mut b = encode(&s).unwrap()[..HEADER_LEN].to_vec();
        b[6..8].copy_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&postcard::to_allocvec(&old).unwrap());
        let back = decode::<Spec>(&b, "spec").unwrap();
        assert_eq!(back.resources.retries, 0);
        assert_eq!(
            back,
            Spec {
                resources: Resources { retries: 0, ..s.resources.clone() },
                ..s
            }
        );
    }

    #[test]
    fn wrong_kind_bad_magic_trailing_and_garbage() {
        let b = encode(&spec()).unwrap();
        assert!(matches!(decode::<Outcome>(&b, "x"), Err(ProtocolError::WrongKind { .. })));
        assert!(matches!(decode::<Spec>(b"nope", "x"), Err(ProtocolError::BadMagic { .. })));
        let mut t = b.clone();
        t.push(0);
        assert!(matches!(decode::<Spec>(&t, "x"), Err(ProtocolError::Decode { .. })));
        let mut g = b[..HEADER_LEN].to_vec();
        g.extend_from_slice(&[0xff; 40]);
        assert!(matches!(decode::<Spec>(&g, "x"), Err(ProtocolError::Decode { .. })));
    }

    #[test]
    fn size_bound() {
        let big = vec![0u8; MAX_SPEC_BYTES as usize + 1];
        assert!(matches!(decode::<Spec>(&big, "x"), Err(ProtocolError::TooLarge { .. })));
        let mut s = spec();
        s.task = Task::Command { argv: vec!["x".repeat(MAX_STRING); 9] };
        assert!(matches!(encode(&s), Err(ProtocolError::TooLarge { .. })));
    }
}

#[cfg(test)]
mod proptests;

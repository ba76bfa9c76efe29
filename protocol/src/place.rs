//! The answer of `delegate-place`: the helper, on the machine where the
//! students' clients run, that tells a student where each of their waiting
//! jobs stands in Slurm's queue. Students do not see other users' jobs
//! (`PrivateData=jobs`); the helper runs as Slurm's user, which does, and
//! answers a caller (known by the kernel: `SO_PEERCRED`) only about the
//! caller's own jobs: for each, how many waiting jobs Slurm will start
//! before it, and when it will likely start. No names, uids or counts per
//! user leave it.
//!
//! It reads nothing from the caller: connecting is the question. The
//! answer is one frame ([`crate::agent::frame`]: a 4-byte little endian
//! length, then the encoded [`PlaceAnswer`]), then the helper closes the
//! connection.

use serde::{Deserialize, Serialize};

use crate::record::Record;

/// Where the helper listens unless the client is told otherwise
/// (`DELEGATE_PLACE_SOCKET`).
pub const DEFAULT_PLACE_SOCKET: &str = "/run/delegate-place/place.sock";
/// The environment variable that names another socket.
pub const PLACE_SOCKET_ENV: &str = "DELEGATE_PLACE_SOCKET";
/// Upper bound on one answer (length prefix excluded).
pub const MAX_PLACE_BYTES: u64 = 64 * 1024;
/// Jobs of one caller an answer lists at most (the first in Slurm's order).
pub const MAX_PLACES: usize = 1000;

/// Where the caller's waiting jobs stand.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaceAnswer {
    /// When the helper last read Slurm's queue (ms since the epoch).
    pub as_of_ms: u64,
    /// Each of the caller's waiting jobs, in Slurm's order.
    pub places: Vec<Place>,
    /// Why there are no places: Slurm could not be asked (one sentence).
    pub unavailable: Option<String>,
}

/// One waiting job of the caller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    /// Its Slurm id as `squeue --array` prints it (`123`, `123_4`).
    pub job: String,
    /// How many waiting jobs (anyone's, held ones not counted) Slurm will
    /// start before it, by priority.
    pub ahead: u32,
    /// In how many seconds it will likely start: the jobs ahead taking the
    /// nodes as the running ones end, each lasting as the jobs the helper
    /// saw end lately. None: no such estimate (no job seen ending yet, no
    /// job running, or not in line).
    pub likely_in_s: Option<u32>,
}

impl Record for PlaceAnswer {
    const KIND: u8 = b'P';
    const MAX_BYTES: u64 = MAX_PLACE_BYTES;
    const NAME: &'static str = "place answer";
    /// 2: `Place::likely_in_s`.
    const VERSION: u16 = 2;

    /// A version 1 answer (places without an estimate) reads as one whose
    /// places have none.
    fn upgrade(version: u16, body: &[u8]) -> Option<Vec<u8>> {
        (version == 1).then(|| v1::upgrade(body)).flatten()
    }
}

/// The answer as version 1 wrote it.
mod v1 {
    use serde::{Deserialize, Serialize};

    #[derive(Deserialize, Serialize)]
    pub(super) struct PlaceV1 {
        pub job: String,
        pub ahead: u32,
    }

    #[derive(Deserialize, Serialize)]
    pub(super) struct PlaceAnswerV1 {
        pub as_of_ms: u64,
        pub places: Vec<PlaceV1>,
        pub unavailable: Option<String>,
    }

    pub(super) fn upgrade(body: &[u8]) -> Option<Vec<u8>> {
        let o: PlaceAnswerV1 = postcard::from_bytes(body).ok()?;
        let places = o.places.into_iter().map(|p| super::Place {
            job: p.job,
            ahead: p.ahead,
            likely_in_s: None,
        });
        let answer = super::PlaceAnswer {
            as_of_ms: o.as_of_ms,
            places: places.collect(),
            unavailable: o.unavailable,
        };
        postcard::to_allocvec(&answer).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{frame, FrameBuf};

    #[test]
    fn an_answer_goes_through_a_frame_and_a_foreign_frame_does_not() {
        let a = PlaceAnswer {
            as_of_ms: 7,
            places: vec![Place {
                job: "12_3".into(),
                ahead: 37,
                likely_in_s: Some(120),
            }],
            unavailable: None,
        };
        let mut buf = FrameBuf::default();
        buf.push(&frame(&a).expect("frame"));
        assert_eq!(buf.next_frame::<PlaceAnswer>().expect("decodes"), Some(a));
        // An agent's answer is not a place answer.
        let mut other = FrameBuf::default();
        other.push(&frame(&crate::agent::Answer::Refused("no".into())).expect("frame"));
        assert!(matches!(
            other.next_frame::<PlaceAnswer>(),
            Err(crate::ProtocolError::WrongKind { found: 'A', expected: 'P', .. })
        ));
    }

    #[test]
    fn a_version_1_answer_reads_as_places_without_an_estimate() {
        let old = v1::PlaceAnswerV1 {
            as_of_ms: 9,
            places: vec![v1::PlaceV1 { job: "5".into(), ahead: 2 }],
            unavailable: None,
        };
        let mut b = crate::record::encode(&PlaceAnswer::default()).expect("encode")[..8].to_vec();
        b[6..8].copy_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&postcard::to_allocvec(&old).expect("v1 body"));
        let back = crate::record::decode::<PlaceAnswer>(&b, "answer").expect("a v1 answer is read");
        assert_eq!(
            back.places,
            vec![Place {
                job: "5".into(),
                ahead: 2,
                likely_in_s: None
            }]
        );
        assert_eq!(back.as_of_ms, 9);
    }

    #[test]
    fn a_frame_over_the_bound_is_refused_before_it_is_read() {
        let mut buf = FrameBuf::default();
        buf.push(&((MAX_PLACE_BYTES + 1) as u32).to_le_bytes());
        assert!(matches!(
            buf.next_frame::<PlaceAnswer>(),
            Err(crate::ProtocolError::TooLarge { .. })
        ));
    }
}

//! Job ids: unique without coordination, valid as file and Slurm job names.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{now_ms, ProtocolError, Result};

/// A job id: `YYYYMMDDTHHMMSS-xxxxxxxx` (UTC time of creation and 32 random
/// bits in hex). Unique without coordination, valid as a file name and as a
/// Slurm job name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(String);

impl JobId {
    pub fn new() -> Self {
        let secs = now_ms() / 1000;
        let mut rnd = [0u8; 4];
        // getrandom only fails when the kernel has no entropy source at all;
        // fall back to the clock's nanoseconds mixed with the pid.
        if getrandom::fill(&mut rnd).is_err() {
            let n = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
                ^ std::process::id().rotate_left(16);
            rnd = n.to_le_bytes();
        }
        JobId(format_id(secs, u32::from_le_bytes(rnd)))
    }

    pub fn parse(s: &str) -> Result<Self> {
        let b = s.as_bytes();
        let ok = b.len() == 24
            && b[..8].iter().all(u8::is_ascii_digit)
            && b[8] == b'T'
            && b[9..15].iter().all(u8::is_ascii_digit)
            && b[15] == b'-'
            && b[16..].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
        if ok {
            Ok(JobId(s.to_owned()))
        } else {
            Err(ProtocolError::BadJobId(s.chars().take(64).collect()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `YYYYMMDDTHHMMSS-xxxxxxxx` for `secs` since the epoch (UTC) and `rnd`.
fn format_id(secs: u64, rnd: u32) -> String {
    // Seconds from the clock are always within jiff's range (years -9999 to
    // 9999); the epoch stands in for a clock gone wild.
    let t = i64::try_from(secs)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{}-{rnd:08x}", t.strftime("%Y%m%dT%H%M%S"))
}

impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for JobId {
    type Error = ProtocolError;
    fn try_from(s: String) -> Result<Self> {
        JobId::parse(&s)
    }
}

impl From<JobId> for String {
    fn from(j: JobId) -> String {
        j.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_id_format_and_parse() {
        let id = JobId::new();
        assert_eq!(JobId::parse(id.as_str()).unwrap(), id);
        for bad in ["../etc", "20261123T103000-ABCDEF01"] {
            let r = JobId::parse(bad);
            assert!(matches!(&r, Err(ProtocolError::BadJobId(s)) if s == bad), "{r:?}");
        }
        assert_eq!(
            JobId::parse("20261123T103000-abcdef01").unwrap().as_str(),
            "20261123T103000-abcdef01"
        );
        assert_ne!(JobId::new(), JobId::new());
    }

    #[test]
    fn civil_dates() {
        assert_eq!(format_id(0, 0), "19700101T000000-00000000");
        assert_eq!(format_id(1_795_425_059, 0xabcdef01), "20261123T091059-abcdef01");
        assert_eq!(format_id(951_782_400, 1), "20000229T000000-00000001");
        assert_eq!(
            JobId::parse(&format_id(1_795_425_059, 7)).unwrap().as_str(),
            "20261123T091059-00000007"
        );
    }
}

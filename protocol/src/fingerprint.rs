//! The machine a call ran on, as the worker's privileged side saw it
//! before and after the call (never the student's code): the `fingerprint`
//! file of a job directory. A field the node cannot tell is `None` (shown
//! as unknown), never guessed.

use serde::{Deserialize, Serialize};

use crate::record::{Record, MAX_RECORD_BYTES};

pub use crate::layout::FINGERPRINT;
/// At most this many entries in each list (names of other tasks, boot
/// parameters, cores).
pub const MAX_LIST: usize = 64;

/// What the worker's agent recorded about the machine of one call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The Slurm node.
    pub node: String,
    /// /proc/cpuinfo of the call's first core.
    pub cpu_vendor: Option<String>,
    pub cpu_model: Option<String>,
    pub cpu_family: Option<u32>,
    pub cpu_model_number: Option<u32>,
    pub cpu_stepping: Option<u32>,
    pub microcode: Option<String>,
    /// The cores the sandbox ran on (its cpuset, else the allocation's).
    pub cores: Vec<u32>,
    /// SMT siblings of those cores that are not among them.
    pub smt_siblings: Vec<u32>,
    /// CPU time (ms) spent on those siblings while the call ran: what
    /// shared the call's physical cores.
    pub siblings_busy_ms: Option<u64>,
    /// CPU time (ms) spent on the call's cores while it ran (the call's
    /// own work included).
    pub cores_busy_ms: Option<u64>,
    /// Other tasks (command names) seen last running on the call's cores,
    /// at its start or its end; not the sandbox's, not kernel threads.
    pub others_seen: Vec<String>,
    /// cpufreq of the first core.
    pub scaling_driver: Option<String>,
    pub governor: Option<String>,
    /// Turbo/boost on (true), off (false), or unknown.
    pub boost: Option<bool>,
    pub min_khz: Option<u64>,
    pub max_khz: Option<u64>,
    pub cur_khz_start: Option<u64>,
    pub cur_khz_end: Option<u64>,
    /// Thermal throttling events of the call's cores (sum), before and after.
    pub throttle_start: Option<u64>,
    pub throttle_end: Option<u64>,
    /// The kernel release and the boot parameters that bear on timing
    /// (isolcpus, nohz_full, mitigations, ...).
    pub kernel: Option<String>,
    pub boot_params: Vec<String>,
    /// The sandbox image's id (sha256:...).
    pub image_id: Option<String>,
    /// How perf counters reached the sandbox (perfmon, seccomp, off).
    pub perf_mode: String,
    /// Whether this node has hardware counters (cycles); false: software
    /// counters only (a VM without a virtual PMU).
    pub hardware_counters: Option<bool>,
    /// What the agent did to the node for the call (the policy's
    /// tune_cpus: governor, boost) and what it could not, in words.
    pub tuning: Vec<String>,
    /// When the agent took the end of it (ms since the epoch).
    pub taken_ms: u64,
}

impl Record for Fingerprint {
    const KIND: u8 = b'F';
    const MAX_BYTES: u64 = MAX_RECORD_BYTES;
    const NAME: &'static str = FINGERPRINT;
}

impl Fingerprint {
    /// The hardware class this machine belongs to: what must be equal for
    /// two results to be compared (vendor, model, stepping, microcode,
    /// boost, governor, kernel).
    pub fn class(&self) -> String {
        let u = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
        format!(
            "{}, governor {}, boost {}, kernel {}",
            self.cpu_identity(),
            u(&self.governor),
            self.boost.map_or("unknown", |b| if b { "on" } else { "off" }),
            u(&self.kernel)
        )
    }

    /// The CPU in words: `vendor model (family F model M stepping S,
    /// microcode C)`, unknown parts as `unknown` or `?`.
    pub fn cpu_identity(&self) -> String {
        let u = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
        let n = |v: Option<u32>| v.map_or("?".to_owned(), |x| x.to_string());
        format!(
            "{} {} (family {} model {} stepping {}, microcode {})",
            u(&self.cpu_vendor),
            u(&self.cpu_model),
            n(self.cpu_family),
            n(self.cpu_model_number),
            n(self.cpu_stepping),
            u(&self.microcode)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode, encode};

    #[test]
    fn a_fingerprint_round_trips_and_unknowns_stay_unknown() {
        let f = Fingerprint {
            node: "vm".into(),
            cpu_model: Some("Xeon".into()),
            cores: vec![1],
            perf_mode: "seccomp".into(),
            ..Default::default()
        };
        let back: Fingerprint = decode(&encode(&f).unwrap(), "t").unwrap();
        assert_eq!(back, f);
        assert!(
            back.class()
                .contains("unknown Xeon (family ? model ? stepping ?, microcode unknown)"),
            "{}",
            back.class()
        );
    }
}

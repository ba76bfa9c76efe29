//! The machine a call ran on, as the worker's privileged side saw it
//! before and after the call (never the student's code): the `fingerprint`
//! file of a job directory. A field the node cannot tell is `None` (shown
//! as unknown), never guessed.
//!
//! Version 2 added the GPUs given to the call ([`Gpu`]); a version 1
//! fingerprint reads as one without GPUs.

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
    /// The GPUs given to the call, in the order the sandbox numbers them
    /// (`CUDA_VISIBLE_DEVICES=0` first), as NVIDIA's driver described them
    /// when the call started. Appended last (version 2).
    pub gpus: Vec<Gpu>,
}

/// One GPU as the node's driver describes it (`nvidia-smi --query-gpu`);
/// unknown fields (no driver tool, `[N/A]`) are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// The device file given to the sandbox (`/dev/nvidia3`).
    pub device: String,
    /// The driver's index of it (the device's minor number).
    pub index: Option<u32>,
    pub model: Option<String>,
    pub driver: Option<String>,
    pub uuid: Option<String>,
    pub memory_mib: Option<u64>,
    /// Streaming-multiprocessor and memory clocks, now and at most (MHz).
    pub sm_mhz: Option<u32>,
    pub sm_max_mhz: Option<u32>,
    pub memory_mhz: Option<u32>,
    pub memory_max_mhz: Option<u32>,
    pub persistence: Option<bool>,
    /// `Default`, `Exclusive_Process`, `Prohibited`.
    pub compute_mode: Option<String>,
    /// MIG mode on (true) or off.
    pub mig: Option<bool>,
    /// ECC on (true) or off.
    pub ecc: Option<bool>,
}

impl Gpu {
    /// What must be equal for two GPUs' results to be compared: model,
    /// memory, driver, MIG and ECC mode, in words.
    pub fn identity(&self) -> String {
        let u = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
        let on = |v: Option<bool>| v.map_or("unknown", |b| if b { "on" } else { "off" });
        format!(
            "{} ({} MiB, driver {}, MIG {}, ECC {})",
            self.model.as_deref().unwrap_or("unknown GPU"),
            self.memory_mib.map_or("?".to_owned(), |m| m.to_string()),
            u(&self.driver),
            on(self.mig),
            on(self.ecc)
        )
    }
}

/// `gpus` in words, alike ones counted: `2 x NVIDIA H100 80GB HBM3 (81559
/// MiB, driver 580.159.04, MIG off, ECC on)`; `none` for no GPU.
pub fn gpus_identity(gpus: &[Gpu]) -> String {
    let groups = count_alike(gpus.iter().map(Gpu::identity));
    if groups.is_empty() {
        return "none".into();
    }
    groups.iter().map(|(g, n)| format!("{n} x {g}")).collect::<Vec<_>>().join(", ")
}

/// Each distinct item with how many times it came, in first-seen order.
pub fn count_alike(items: impl IntoIterator<Item = String>) -> Vec<(String, usize)> {
    let mut groups: Vec<(String, usize)> = Vec::new();
    for item in items {
        match groups.iter_mut().find(|(g, _)| *g == item) {
            Some((_, n)) => *n += 1,
            None => groups.push((item, 1)),
        }
    }
    groups
}

impl Record for Fingerprint {
    const KIND: u8 = b'F';
    const MAX_BYTES: u64 = MAX_RECORD_BYTES;
    const NAME: &'static str = FINGERPRINT;
    const VERSION: u16 = 2;

    /// Version 1 had no GPUs: its body and an empty list.
    fn upgrade(version: u16, body: &[u8]) -> Option<Vec<u8>> {
        (version == 1).then(|| [body, &[0]].concat())
    }
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
        ) + &if self.gpus.is_empty() {
            String::new()
        } else {
            format!(", GPUs {}", gpus_identity(&self.gpus))
        }
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
        assert!(!back.class().contains("GPU"), "{}", back.class());
    }

    fn h100(uuid: &str) -> Gpu {
        Gpu {
            device: "/dev/nvidia0".into(),
            index: Some(0),
            model: Some("NVIDIA H100 80GB HBM3".into()),
            driver: Some("580.159.04".into()),
            uuid: Some(uuid.into()),
            memory_mib: Some(81559),
            mig: Some(false),
            ecc: Some(true),
            ..Default::default()
        }
    }

    #[test]
    fn the_gpus_join_the_class_counted_and_without_their_uuids() {
        let f = Fingerprint {
            gpus: vec![
                h100("GPU-a"),
                h100("GPU-b"),
                Gpu {
                    device: "/dev/x".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let back: Fingerprint = decode(&encode(&f).unwrap(), "t").unwrap();
        assert_eq!(back, f);
        assert!(
            f.class().ends_with(
                ", GPUs 2 x NVIDIA H100 80GB HBM3 (81559 MiB, driver 580.159.04, MIG off, ECC on), \
                 1 x unknown GPU (? MiB, driver unknown, MIG unknown, ECC unknown)"
            ),
            "{}",
            f.class()
        );
        assert_eq!(gpus_identity(&[]), "none");
    }

    #[test]
    fn a_version_1_fingerprint_reads_as_one_without_gpus() {
        let f = Fingerprint {
            node: "worker1".into(),
            cpu_model: Some("Xeon".into()),
            perf_mode: "seccomp".into(),
            ..Default::default()
        };
        let mut v1 = encode(&f).unwrap();
        // Version 1 wrote the same fields without the GPU list (its last byte, 0: empty).
        assert_eq!(v1.pop(), Some(0));
        v1[6] = 1;
        let back: Fingerprint = decode(&v1, "fingerprint").unwrap();
        assert_eq!(back, f);
        v1[6] = 3;
        let r = decode::<Fingerprint>(&v1, "fingerprint");
        assert!(
            matches!(r, Err(crate::ProtocolError::VersionMismatch { found: 3, expected: 2, .. })),
            "{r:?}"
        );
    }
}

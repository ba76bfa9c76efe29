//! Hardware classes of nodes, and the report each node's agent keeps in
//! Slurm about its own.
//!
//! A node's class is what must be equal for two measurements on two nodes
//! to be compared: CPU vendor, model, family/model/stepping, microcode,
//! kernel release, the boot parameters that bear on timing, the node's
//! GPUs (model, memory, driver, MIG and ECC mode, how many), and the label
//! an operator may give nodes that the fingerprint cannot tell apart
//! (`/etc/delegate/node-class`). Its id is a short hash of those; Slurm
//! carries it as the node feature `dlgclass_<id>`, so that the calls of one
//! experiment can ask Slurm for one class (`--constraint`).
//!
//! The agent also writes a one-line report into the node's Slurm comment
//! (`delegate class=... deployed=... governor=... boost=... perf=...
//! counters=... gpus=... cpu=...`), readable by everyone with `sinfo`: the
//! instructor's `delegate admin nodes` reads it. `deployed=` is the class
//! the node had when the cluster was last deployed (the deployment clears
//! it, the agent sets it to the class it finds next): a node whose class
//! changed since (a microcode update, a new kernel, a relabelled node) is
//! named as drifted.

use crate::Fingerprint;

/// The prefix of a node feature that names a class.
pub const FEATURE_PREFIX: &str = "dlgclass_";
/// The file where an operator names a node's class by hand (a label mixed
/// into the class: nodes that differ in what the fingerprint cannot see).
pub const LABEL_FILE: &str = "/etc/delegate/node-class";
/// The first word of a node comment that is delegate's report.
pub const REPORT_TAG: &str = "delegate";
/// At most this many bytes of a label.
pub const MAX_LABEL: usize = 32;
/// At most this many characters of the CPU model in a report.
const MAX_CPU: usize = 96;
/// At most this many characters of the GPUs in a report.
const MAX_GPUS: usize = 96;

/// The node's CPU topology: what BIOS settings change (SMT, cores turned
/// off); `None` when the node cannot tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub cpus_online: Option<u32>,
    pub threads_per_core: Option<u32>,
}

/// One node's class: its id and what it is, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeClass {
    /// 10 hex digits.
    pub id: String,
    /// "AMD EPYC 7B13 (family 25 model 1 stepping 1, microcode 0x..), kernel 6.1.0-...".
    pub summary: String,
}

impl NodeClass {
    /// The class of the node `f` was taken on, of CPU topology `t`, with
    /// the operator's `label`.
    pub fn of(f: &Fingerprint, t: Topology, label: Option<&str>) -> NodeClass {
        let u = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
        let n = |v: Option<u32>| v.map_or("?".to_owned(), |x| x.to_string());
        let mut summary = format!(
            "{}, {} CPUs, {} threads per core, kernel {}",
            f.cpu_identity(),
            n(t.cpus_online),
            n(t.threads_per_core),
            u(&f.kernel)
        );
        if !f.boot_params.is_empty() {
            summary.push_str(&format!(", boot {}", f.boot_params.join(" ")));
        }
        if !f.gpus.is_empty() {
            summary.push_str(&format!(", GPUs {}", crate::fingerprint::gpus_identity(&f.gpus)));
        }
        if let Some(l) = label {
            summary.push_str(&format!(", label {l}"));
        }
        NodeClass {
            id: format!("{:010x}", fnv1a(summary.as_bytes()) >> 24),
            summary,
        }
    }

    /// The Slurm feature of this class.
    pub fn feature(&self) -> String {
        format!("{FEATURE_PREFIX}{}", self.id)
    }
}

/// The class id a Slurm feature names, if it is one of ours.
pub fn class_of_feature(feature: &str) -> Option<&str> {
    let id = feature.strip_prefix(FEATURE_PREFIX)?;
    (id.len() == 10 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// 64-bit FNV-1a: stable across builds and machines (not a defence: a
/// class id only groups nodes, and only root sets it).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// An operator's label, checked: 1 to [`MAX_LABEL`] letters, digits, `-`
/// or `_` (surrounding whitespace ignored).
pub fn check_label(text: &str) -> Result<String, String> {
    let l = text.trim();
    if l.is_empty() || l.len() > MAX_LABEL || !l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!(
            "a node class label is 1 to {MAX_LABEL} letters, digits, '-' or '_', not {:?}",
            l.chars().take(40).collect::<String>()
        ));
    }
    Ok(l.to_owned())
}

/// What a node's agent reports about it in its Slurm comment.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NodeReport {
    /// The class id now.
    pub class: String,
    /// The class id at the last deployment (None: not yet recorded).
    pub deployed: Option<String>,
    pub label: Option<String>,
    /// The governor and boost between calls (what the node is left at).
    pub governor: Option<String>,
    pub boost: Option<bool>,
    /// How perf counters reach a sandbox here (perfmon, seccomp, off).
    pub perf: String,
    /// Hardware counters (true), software only (false), unknown.
    pub hardware_counters: Option<bool>,
    /// The node's GPUs in short: `2xNVIDIA_H100_80GB_HBM3` (count and
    /// model, alike ones together), None for no GPU.
    pub gpus: Option<String>,
    /// The CPU model, in words.
    pub cpu: String,
}

/// The GPUs of a report in short: how many of each model, the model's
/// spaces as `_` (`2xNVIDIA_H100_80GB_HBM3,1xunknown`); None for none.
pub fn gpus_in_short(gpus: &[crate::Gpu]) -> Option<String> {
    let groups = crate::fingerprint::count_alike(gpus.iter().map(|g| word(&g.model)));
    let short: Vec<String> = groups.iter().map(|(m, n)| format!("{n}x{m}")).collect();
    (!short.is_empty()).then(|| short.join(",").chars().take(MAX_GPUS).collect())
}

/// `text` with only printable ASCII and no separators of the report, at
/// most `max` characters.
fn clean(text: &str, max: usize) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '|' && c != '=' {
                c
            } else {
                ' '
            }
        })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(max)
        .collect()
}

fn word(v: &Option<String>) -> String {
    v.as_deref()
        .map(|s| clean(s, 32).replace(' ', "_"))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

impl NodeReport {
    /// How many GPUs the report names (0: none, or an unreadable list).
    pub fn gpu_count(&self) -> u32 {
        let Some(short) = &self.gpus else { return 0 };
        short
            .split(',')
            .map(|g| g.split_once('x').and_then(|(n, _)| n.parse::<u32>().ok()))
            .try_fold(0u32, |sum, n| sum.checked_add(n?))
            .unwrap_or(0)
    }

    /// Whether the class changed since the last deployment.
    pub fn drifted(&self) -> bool {
        self.deployed.as_ref().is_some_and(|d| *d != self.class)
    }

    /// The node comment (one line; the CPU model last, it has spaces).
    pub fn to_comment(&self) -> String {
        let counters = match self.hardware_counters {
            Some(true) => "hardware",
            Some(false) => "software",
            None => "unknown",
        };
        let boost = match self.boost {
            Some(true) => "on",
            Some(false) => "off",
            None => "unknown",
        };
        format!(
            "{REPORT_TAG} class={} deployed={} label={} governor={} boost={boost} perf={} counters={counters} gpus={} cpu={}",
            word(&Some(self.class.clone())),
            word(&self.deployed),
            self.label.as_deref().map_or("none".to_owned(), |l| word(&Some(l.to_owned()))),
            word(&self.governor),
            word(&Some(self.perf.clone())),
            self.gpus
                .as_deref()
                .map_or("none".to_owned(), |g| clean(g, MAX_GPUS).replace(' ', "_")),
            clean(&self.cpu, MAX_CPU)
        )
    }

    /// A node comment read back; None when it is not delegate's report.
    pub fn parse(comment: &str) -> Option<NodeReport> {
        let rest = comment.trim().strip_prefix(REPORT_TAG)?.strip_prefix(' ')?;
        let (fields, cpu) = rest.split_once(" cpu=").unwrap_or((rest, ""));
        let mut r = NodeReport {
            cpu: cpu.trim().to_owned(),
            ..Default::default()
        };
        let known = |v: &str| (v != "unknown" && v != "none").then(|| v.to_owned());
        for kv in fields.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            match k {
                "class" => r.class = v.to_owned(),
                "deployed" => r.deployed = known(v),
                "label" => r.label = known(v),
                "governor" => r.governor = known(v),
                "boost" => r.boost = known(v).map(|b| b == "on"),
                "perf" => r.perf = v.to_owned(),
                "counters" => r.hardware_counters = known(v).map(|c| c == "hardware"),
                "gpus" => r.gpus = known(v),
                _ => {}
            }
        }
        (!r.class.is_empty()).then_some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epyc() -> Fingerprint {
        Fingerprint {
            node: "worker1".into(),
            cpu_vendor: Some("AuthenticAMD".into()),
            cpu_model: Some("AMD EPYC 7B13 64-Core Processor".into()),
            cpu_family: Some(25),
            cpu_model_number: Some(1),
            cpu_stepping: Some(0),
            microcode: Some("0xa0011d1".into()),
            kernel: Some("6.1.0-27-cloud-amd64".into()),
            governor: Some("performance".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_class_ignores_the_node_name_and_tuning_but_not_microcode_kernel_smt_or_label() {
        let t = Topology {
            cpus_online: Some(64),
            threads_per_core: Some(2),
        };
        let a = NodeClass::of(&epyc(), t, None);
        let mut other_node = epyc();
        other_node.node = "worker2".into();
        other_node.governor = Some("powersave".into());
        assert_eq!(NodeClass::of(&other_node, t, None), a);
        let mut microcode = epyc();
        microcode.microcode = Some("0xa0011d5".into());
        assert_ne!(NodeClass::of(&microcode, t, None).id, a.id);
        let mut kernel = epyc();
        kernel.kernel = Some("6.12.0".into());
        assert_ne!(NodeClass::of(&kernel, t, None).id, a.id);
        assert_ne!(NodeClass::of(&epyc(), t, Some("slow")).id, a.id);
        // SMT turned off in the BIOS: another class.
        let no_smt = Topology { threads_per_core: Some(1), ..t };
        assert_ne!(NodeClass::of(&epyc(), no_smt, None).id, a.id);
        assert!(a.summary.contains("64 CPUs, 2 threads per core"), "{}", a.summary);
        assert_eq!(a.id.len(), 10);
        assert_eq!(class_of_feature(&a.feature()), Some(a.id.as_str()));
        assert!(a.summary.starts_with("AuthenticAMD AMD EPYC 7B13"), "{}", a.summary);
    }

    #[test]
    fn only_our_features_name_classes() {
        assert_eq!(class_of_feature("dlgclass_0123456789"), Some("0123456789"));
        for f in [
            "avx512",
            "dlgclass_",
            "dlgclass_xyz",
            "dlgclass_01234567890",
            "class_0123456789",
        ] {
            assert_eq!(class_of_feature(f), None, "{f}");
        }
    }

    #[test]
    fn labels_are_plain_words() {
        assert_eq!(check_label(" slow\n").unwrap(), "slow");
        for bad in ["", "two words", "a,b", "x|y", &"a".repeat(33), "dlg=1"] {
            let e = check_label(bad).unwrap_err();
            assert_eq!(
                e,
                format!("a node class label is 1 to {MAX_LABEL} letters, digits, '-' or '_', not {bad:?}")
            );
        }
    }

    #[test]
    fn a_report_round_trips_through_the_comment() {
        let r = NodeReport {
            class: "0123456789".into(),
            deployed: Some("9876543210".into()),
            label: Some("slow".into()),
            governor: Some("performance".into()),
            boost: Some(false),
            perf: "seccomp".into(),
            hardware_counters: Some(false),
            gpus: Some("2xNVIDIA_H100_80GB_HBM3".into()),
            cpu: "AMD EPYC 7B13 64-Core Processor".into(),
        };
        let c = r.to_comment();
        assert_eq!(
            c,
            "delegate class=0123456789 deployed=9876543210 label=slow governor=performance boost=off perf=seccomp counters=software gpus=2xNVIDIA_H100_80GB_HBM3 cpu=AMD EPYC 7B13 64-Core Processor"
        );
        assert_eq!(NodeReport::parse(&c), Some(r.clone()));
        assert!(r.drifted());
        let fresh = NodeReport {
            deployed: None,
            governor: None,
            boost: None,
            hardware_counters: None,
            label: None,
            gpus: None,
            ..r
        };
        assert!(!fresh.drifted());
        assert_eq!(NodeReport::parse(&fresh.to_comment()), Some(fresh));
    }

    #[test]
    fn hostile_text_cannot_add_fields() {
        let r = NodeReport {
            class: "0123456789".into(),
            perf: "seccomp".into(),
            governor: Some("x deployed=0000000000".into()),
            cpu: "Evil|CPU\ncpu=1 deployed=1".into(),
            ..Default::default()
        };
        let back = NodeReport::parse(&r.to_comment()).unwrap();
        assert_eq!(back.deployed, None);
        assert_eq!(back.governor.as_deref(), Some("x_deployed_0000000000"));
        assert!(!back.cpu.contains('\n') && !back.cpu.contains('|'), "{}", back.cpu);
    }

    #[test]
    fn the_gpus_are_part_of_the_class_and_shown_in_short() {
        let t = Topology::default();
        let gpu = |model: &str, driver: &str| crate::Gpu {
            device: "/dev/nvidia0".into(),
            model: Some(model.into()),
            driver: Some(driver.into()),
            uuid: Some(format!("GPU-{model}-{driver}")),
            ..Default::default()
        };
        let with = |gpus: Vec<crate::Gpu>| Fingerprint { gpus, ..epyc() };
        let h100 = NodeClass::of(&with(vec![gpu("NVIDIA H100 80GB HBM3", "580.159.04")]), t, None);
        assert_ne!(h100.id, NodeClass::of(&epyc(), t, None).id);
        assert_ne!(
            h100.id,
            NodeClass::of(&with(vec![gpu("NVIDIA A100-SXM4-80GB", "580.159.04")]), t, None).id
        );
        assert_ne!(
            h100.id,
            NodeClass::of(&with(vec![gpu("NVIDIA H100 80GB HBM3", "570.86.15")]), t, None).id
        );
        let two = vec![gpu("NVIDIA H100 80GB HBM3", "580.159.04"); 2];
        assert_ne!(h100.id, NodeClass::of(&with(two.clone()), t, None).id);
        // Another card of the same model (another UUID) is the same class.
        let mut other = gpu("NVIDIA H100 80GB HBM3", "580.159.04");
        other.uuid = Some("GPU-other".into());
        assert_eq!(h100.id, NodeClass::of(&with(vec![other]), t, None).id);
        assert!(h100.summary.contains(", GPUs 1 x NVIDIA H100 80GB HBM3 ("), "{}", h100.summary);
        assert_eq!(gpus_in_short(&two).as_deref(), Some("2xNVIDIA_H100_80GB_HBM3"));
        assert_eq!(gpus_in_short(&[crate::Gpu::default()]).as_deref(), Some("1xunknown"));
        assert_eq!(gpus_in_short(&[]), None);
        let report = |gpus: Option<&str>| NodeReport {
            gpus: gpus.map(str::to_owned),
            ..Default::default()
        };
        assert_eq!(report(Some("2xNVIDIA_H100_80GB_HBM3,1xunknown")).gpu_count(), 3);
        assert_eq!(report(None).gpu_count(), 0);
        assert_eq!(report(Some("lots")).gpu_count(), 0);
    }

    #[test]
    fn other_comments_are_not_reports() {
        assert_eq!(NodeReport::parse("rack 4, fan replaced"), None);
        assert_eq!(NodeReport::parse("delegate"), None);
        assert_eq!(NodeReport::parse(""), None);
    }
}

//! What the node's NVIDIA driver says about its GPUs, for fingerprints and
//! the node's class: `nvidia-smi --query-gpu` (root's tool on the node's
//! own path, never anything of the student's), asked only when the node
//! has GPUs. A node without the tool (stand-in devices, a driver without
//! its utilities) still records each GPU's device file and index, the rest
//! unknown.

use std::path::{Path, PathBuf};
use std::time::Duration;

use delegate_protocol::Gpu;

use crate::ask::{AskError, BoundedRun};

/// The fields asked, in the order of [`parse`]'s columns.
pub const QUERY: &str = "index,name,driver_version,uuid,memory.total,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,persistence_mode,compute_mode,mig.mode.current,ecc.mode.current";
/// How long nvidia-smi may take (it waits for a busy driver).
const PATIENCE: Duration = Duration::from_secs(10);
/// At most this much of its answer is read.
const MAX_ANSWER: usize = 1 << 20;
/// At most this many characters of a text field.
const MAX_FIELD: usize = 96;

/// One field: None for nvidia-smi's `[N/A]`, `[Not Supported]`, `N/A` or
/// nothing.
fn field(v: &str) -> Option<String> {
    let v = v.trim();
    let unknown = v.is_empty() || v.starts_with('[') || v.eq_ignore_ascii_case("n/a");
    (!unknown).then(|| v.chars().filter(|c| !c.is_control()).take(MAX_FIELD).collect())
}

fn switch(v: &str) -> Option<bool> {
    match field(v)?.as_str() {
        "Enabled" => Some(true),
        "Disabled" => Some(false),
        _ => None,
    }
}

/// `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` read: one
/// GPU per well-formed line (others skipped), its device unset.
pub fn parse(csv: &str) -> Vec<Gpu> {
    csv.lines()
        .take(delegate_protocol::fingerprint::MAX_LIST)
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            let [index, name, driver, uuid, mem, sm, sm_max, memclk, memclk_max, persist, compute, mig, ecc] =
                f.as_slice()
            else {
                return None;
            };
            Some(Gpu {
                device: String::new(),
                index: Some(field(index)?.parse().ok()?),
                model: field(name),
                driver: field(driver),
                uuid: field(uuid),
                memory_mib: field(mem).and_then(|v| v.parse().ok()),
                sm_mhz: field(sm).and_then(|v| v.parse().ok()),
                sm_max_mhz: field(sm_max).and_then(|v| v.parse().ok()),
                memory_mhz: field(memclk).and_then(|v| v.parse().ok()),
                memory_max_mhz: field(memclk_max).and_then(|v| v.parse().ok()),
                persistence: switch(persist),
                compute_mode: field(compute),
                mig: switch(mig),
                ecc: switch(ecc),
            })
        })
        .collect()
}

/// What nvidia-smi answers now; None (logged) when it cannot be asked.
async fn ask() -> Option<String> {
    let query = format!("--query-gpu={QUERY}");
    let question = BoundedRun {
        argv: &["nvidia-smi", &query, "--format=csv,noheader,nounits"],
        deadline: PATIENCE,
        max_answer: MAX_ANSWER,
        env: &[],
        clear_env: true,
    };
    match question.ask().await {
        Ok(csv) => Some(csv),
        Err(e @ AskError::Spawn { .. }) => {
            tracing::debug!("{e}: the GPUs' details are unknown");
            None
        }
        Err(e) => {
            tracing::warn!("{e}: the GPUs' details are unknown");
            None
        }
    }
}

/// `devices` with the driver's index of each (`indexes`, the devices'
/// minor numbers) and what `known` says about that index.
pub fn describe(devices: &[PathBuf], indexes: &[u64], known: &[Gpu]) -> Vec<Gpu> {
    devices
        .iter()
        .zip(indexes)
        .map(|(d, &i)| {
            let index = u32::try_from(i).ok();
            let found = known.iter().find(|g| g.index.is_some() && g.index == index);
            Gpu {
                device: d.display().to_string(),
                index,
                ..found.cloned().unwrap_or_default()
            }
        })
        .collect()
}

/// [`describe`] with what the driver says now (nvidia-smi asked only when
/// there are devices).
pub async fn now(devices: &[PathBuf], indexes: &[u64]) -> Vec<Gpu> {
    if devices.is_empty() {
        return Vec::new();
    }
    let known = ask().await.map(|csv| parse(&csv)).unwrap_or_default();
    describe(devices, indexes, &known)
}

/// Each device file's minor number (NVIDIA's index of /dev/nvidiaN); a
/// device that cannot be read is left out (logged).
pub fn indexes(devices: &[PathBuf]) -> (Vec<PathBuf>, Vec<u64>) {
    devices
        .iter()
        .filter_map(|d| match crate::gpu::devices::char_device_minor(Path::new(d)) {
            Ok(m) => Some((d.clone(), m)),
            Err(e) => {
                tracing::warn!("{e}; left out of the node's GPUs");
                None
            }
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100's answer (driver 580) and a GPU whose driver says little.
    const ANSWER: &str = "\
0, NVIDIA H100 80GB HBM3, 580.159.04, GPU-4f1b3a2c-9d8e-7f60-a1b2-c3d4e5f60718, 81559, 345, 1980, 2619, 2619, Enabled, Default, Disabled, Enabled
1, NVIDIA H100 80GB HBM3, 580.159.04, GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9, 81559, 1980, 1980, 2619, 2619, Disabled, Exclusive_Process, Enabled, Disabled
2, Tesla T4, 535.54.03, GPU-x, [N/A], [Not Supported], [N/A], , N/A, [N/A], Default, [N/A], [N/A]
garbage line
x, NVIDIA A100, 1, 2, 3, 4, 5, 6, 7, Enabled, Default, Disabled, Enabled
";

    #[test]
    fn nvidia_smis_answer_is_read_and_its_unknowns_stay_unknown() {
        let gpus = parse(ANSWER);
        assert_eq!(gpus.len(), 3);
        let h = &gpus[0];
        assert_eq!(h.index, Some(0));
        assert_eq!(h.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(h.driver.as_deref(), Some("580.159.04"));
        assert_eq!(h.uuid.as_deref(), Some("GPU-4f1b3a2c-9d8e-7f60-a1b2-c3d4e5f60718"));
        assert_eq!((h.memory_mib, h.sm_mhz, h.sm_max_mhz), (Some(81559), Some(345), Some(1980)));
        assert_eq!((h.memory_mhz, h.memory_max_mhz), (Some(2619), Some(2619)));
        assert_eq!((h.persistence, h.mig, h.ecc), (Some(true), Some(false), Some(true)));
        assert_eq!(h.compute_mode.as_deref(), Some("Default"));
        assert_eq!(gpus[1].compute_mode.as_deref(), Some("Exclusive_Process"));
        assert_eq!((gpus[1].mig, gpus[1].ecc), (Some(true), Some(false)));
        let t4 = &gpus[2];
        assert_eq!(t4.model.as_deref(), Some("Tesla T4"));
        assert_eq!(
            (t4.memory_mib, t4.sm_mhz, t4.memory_mhz, t4.memory_max_mhz),
            (None, None, None, None)
        );
        assert_eq!((t4.persistence, t4.mig, t4.ecc), (None, None, None));
    }

    #[test]
    fn each_device_gets_what_the_driver_says_of_its_index() {
        let known = parse(ANSWER);
        let devices = [PathBuf::from("/dev/nvidia1"), PathBuf::from("/dev/nvidia7")];
        let gpus = describe(&devices, &[1, 7], &known);
        assert_eq!(gpus[0].device, "/dev/nvidia1");
        assert_eq!(gpus[0].uuid.as_deref(), Some("GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"));
        // An index the driver does not name: the device, nothing guessed.
        assert_eq!(
            gpus[1],
            Gpu {
                device: "/dev/nvidia7".into(),
                index: Some(7),
                ..Default::default()
            }
        );
        assert!(describe(&devices, &[1, 7], &[]).iter().all(|g| g.model.is_none()));
    }

    #[test]
    fn hostile_or_huge_fields_are_bounded() {
        let long = format!(
            "0, {}\u{7}x, d, u, 1, 1, 1, 1, 1, Enabled, Default, Disabled, Enabled",
            "A".repeat(500)
        );
        let g = &parse(&long)[0];
        assert_eq!(g.model.as_ref().map(String::len), Some(MAX_FIELD));
        assert!(!g.model.as_deref().unwrap_or("").contains('\u{7}'));
    }
}

//! How `delegate result` shows the machine a call ran on (its
//! fingerprint): every field the worker's agent recorded, "unknown" for
//! what the node could not tell.

use delegate_protocol::Fingerprint;

fn known<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "unknown".to_owned(), ToString::to_string)
}

fn list(v: &[u32]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    }
}

fn khz(v: Option<u64>) -> String {
    v.map_or_else(|| "unknown".to_owned(), |k| format!("{:.2} GHz", k as f64 / 1e6))
}

/// The lines `delegate result` prints about the machine.
pub fn lines(f: &Fingerprint) -> Vec<String> {
    let n = |v: Option<u32>| v.map_or("?".to_owned(), |x| x.to_string());
    let busy = |v: Option<u64>| v.map_or("unknown".to_owned(), |ms| format!("{ms} ms"));
    let boost = f.boost.map_or("unknown", |b| if b { "on" } else { "off" });
    let hw = match f.hardware_counters {
        Some(true) => "hardware and software",
        Some(false) => "software only (no hardware counters on this node)",
        None => "unknown",
    };
    vec![
        format!(
            "machine:   {} · {} ({}, family {} model {} stepping {}, microcode {})",
            f.node,
            known(&f.cpu_model),
            known(&f.cpu_vendor),
            n(f.cpu_family),
            n(f.cpu_model_number),
            n(f.cpu_stepping),
            known(&f.microcode)
        ),
        format!(
            "cores:     {} (busy {} while it ran); SMT siblings {} (busy {})",
            list(&f.cores),
            busy(f.cores_busy_ms),
            list(&f.smt_siblings),
            busy(f.siblings_busy_ms)
        ),
        format!(
            "others:    {}",
            if f.others_seen.is_empty() {
                "no other task seen on its cores".to_owned()
            } else {
                format!("seen on its cores: {}", f.others_seen.join(", "))
            }
        ),
        format!(
            "frequency: driver {}, governor {}, boost {boost}, min {} max {}, at start {} at end {}",
            known(&f.scaling_driver),
            known(&f.governor),
            khz(f.min_khz),
            khz(f.max_khz),
            khz(f.cur_khz_start),
            khz(f.cur_khz_end)
        ),
        format!(
            "throttled: {}",
            match (f.throttle_start, f.throttle_end) {
                (Some(a), Some(b)) => format!("{} times while it ran", b.saturating_sub(a)),
                _ => "unknown".into(),
            }
        ),
        format!(
            "kernel:    {} (timing boot parameters: {})",
            known(&f.kernel),
            if f.boot_params.is_empty() {
                "none".to_owned()
            } else {
                f.boot_params.join(" ")
            }
        ),
        format!("counters:  perf mode {}; {hw}", f.perf_mode),
        format!(
            "tuning:    {}",
            if f.tuning.is_empty() {
                "none recorded".to_owned()
            } else {
                f.tuning.join("; ")
            }
        ),
        format!("image:     {}", known(&f.image_id)),
    ]
    .into_iter()
    .chain(f.gpus.iter().enumerate().map(|(i, g)| gpu_line(i, g)))
    .collect()
}

/// One GPU given to the call, numbered as the sandbox saw it.
fn gpu_line(i: usize, g: &delegate_protocol::Gpu) -> String {
    let mhz = |now: Option<u32>, max: Option<u32>| format!("{} of {} MHz", known(&now), known(&max));
    let on = |v: Option<bool>| v.map_or("unknown", |b| if b { "on" } else { "off" });
    format!(
        "gpu {i}:     {} ({}, index {}) · {} · {} MiB · driver {} · SM {} · memory {} at the start · persistence {} · compute mode {} · MIG {} · ECC {}",
        known(&g.model),
        g.device,
        known(&g.index),
        known(&g.uuid),
        known(&g.memory_mib),
        known(&g.driver),
        mhz(g.sm_mhz, g.sm_max_mhz),
        mhz(g.memory_mhz, g.memory_max_mhz),
        on(g.persistence),
        known(&g.compute_mode),
        on(g.mig),
        on(g.ecc)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_say_unknown_and_known_ones_their_value() {
        let f = Fingerprint {
            node: "worker1".into(),
            cpu_model: Some("AMD EPYC".into()),
            cpu_family: Some(26),
            cores: vec![1],
            cores_busy_ms: Some(900),
            perf_mode: "seccomp".into(),
            hardware_counters: Some(false),
            max_khz: Some(3_500_000),
            ..Default::default()
        };
        let text = lines(&f).join("\n");
        assert!(
            text.contains("machine:   worker1 · AMD EPYC (unknown, family 26 model ? stepping ?, microcode unknown)"),
            "{text}"
        );
        assert!(
            text.contains("cores:     1 (busy 900 ms while it ran); SMT siblings none (busy unknown)"),
            "{text}"
        );
        assert!(
            text.contains("governor unknown, boost unknown, min unknown max 3.50 GHz"),
            "{text}"
        );
        assert!(text.contains("software only"), "{text}");
        assert!(!text.contains("gpu "), "{text}");
    }

    #[test]
    fn each_gpu_given_has_a_line_of_its_own() {
        let f = Fingerprint {
            gpus: vec![
                delegate_protocol::Gpu {
                    device: "/dev/nvidia3".into(),
                    index: Some(3),
                    model: Some("NVIDIA H100 80GB HBM3".into()),
                    driver: Some("580.159.04".into()),
                    uuid: Some("GPU-4f1b".into()),
                    memory_mib: Some(81559),
                    sm_mhz: Some(345),
                    sm_max_mhz: Some(1980),
                    persistence: Some(true),
                    compute_mode: Some("Default".into()),
                    mig: Some(false),
                    ecc: Some(true),
                    ..Default::default()
                },
                delegate_protocol::Gpu {
                    device: "/dev/delegate-gpu1".into(),
                    index: Some(5),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let text = lines(&f);
        assert_eq!(
            text[text.len() - 2],
            "gpu 0:     NVIDIA H100 80GB HBM3 (/dev/nvidia3, index 3) · GPU-4f1b · 81559 MiB · driver 580.159.04 · SM 345 of 1980 MHz · memory unknown of unknown MHz at the start · persistence on · compute mode Default · MIG off · ECC on"
        );
        assert!(text[text.len() - 1].starts_with("gpu 1:     unknown (/dev/delegate-gpu1, index 5) · unknown"));
    }
}

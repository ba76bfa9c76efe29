//! The single machine's GPUs: what DELEGATE_LOCAL_GPUS asks for, decided
//! once here from the machine's facts (its `/dev/nvidia<N>` minors), as
//! the device files Slurm's gres.conf names (`File=`), their number, and
//! the stand-in devices to make. build_cluster.sh's `--local` only makes
//! those devices and renders with the result.

use crate::RenderError;

/// Where the stand-in GPUs are made: `/dev/delegate-gpu0`, ...
pub const STANDIN_PREFIX: &str = "/dev/delegate-gpu";
/// The minors of major 1 the stand-ins copy: null, zero, full, urandom.
pub const STANDIN_MINORS: [u32; 4] = [3, 5, 7, 9];

/// A character device to make (or find made) for a stand-in GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

/// The machine's GPUs as Slurm will know them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// gres.conf's `File=` expression (empty: no GPUs).
    pub files: String,
    /// How many devices `files` names.
    pub count: u64,
    /// Whether they are real GPUs (jobs may use them all: a new policy's
    /// `max_gpus`); stand-ins are for tests, which set it themselves.
    pub real: bool,
    /// Stand-in devices to make first.
    pub make: Vec<Device>,
}

impl Plan {
    /// Lines build_cluster.sh reads: `files EXPR`, `count N`, `max_gpus N`,
    /// then `device PATH MAJOR MINOR` per stand-in.
    pub fn lines(&self) -> String {
        let mut out = format!(
            "files {}\ncount {}\nmax_gpus {}\n",
            self.files,
            self.count,
            if self.real { self.count } else { 0 }
        );
        for d in &self.make {
            out.push_str(&format!("device {} {} {}\n", d.path, d.major, d.minor));
        }
        out
    }
}

fn invalid(spec: &str, why: &str) -> RenderError {
    RenderError::Invalid(format!("DELEGATE_LOCAL_GPUS={spec}: {why}"))
}

/// How many devices a `File=` expression names: `/dev/x[0-1,3]` is three,
/// `/dev/a,/dev/b` two.
pub fn count(files: &str) -> u64 {
    if files.is_empty() {
        return 0;
    }
    let Some(inner) = files.split_once('[').and_then(|(_, r)| r.split_once(']')).map(|(i, _)| i) else {
        return files.split(',').filter(|f| !f.is_empty()).count() as u64;
    };
    inner
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 0,
            },
            None => u64::from(r.parse::<u64>().is_ok()),
        })
        .sum()
}

fn standin(spec: &str, n: &str) -> Result<Plan, RenderError> {
    let n: usize = match n.parse() {
        Ok(n) if (1..=STANDIN_MINORS.len()).contains(&n) => n,
        _ => return Err(invalid(spec, "standin:N takes N from 1 to 4")),
    };
    let make = STANDIN_MINORS[..n]
        .iter()
        .enumerate()
        .map(|(i, &minor)| Device {
            path: format!("{STANDIN_PREFIX}{i}"),
            major: 1,
            minor,
        })
        .collect();
    Ok(Plan {
        files: format!("{STANDIN_PREFIX}[0-{}]", n - 1),
        count: n as u64,
        real: false,
        make,
    })
}

fn nvidia(spec: &str, minors: &[u32]) -> Result<Plan, RenderError> {
    if minors.is_empty() {
        return Err(invalid(
            spec,
            "no /dev/nvidia<N> on this machine (is the NVIDIA driver loaded? nvidia-smi)",
        ));
    }
    let mut m = minors.to_vec();
    m.sort_unstable();
    m.dedup();
    let list: Vec<String> = m.iter().map(u32::to_string).collect();
    Ok(Plan {
        files: format!("/dev/nvidia[{}]", list.join(",")),
        count: m.len() as u64,
        real: true,
        make: vec![],
    })
}

/// The plan for `spec` (auto, none, standin:N, nvidia, or a `File=`
/// expression of absolute paths) on a machine whose `/dev/nvidia<N>`
/// devices have these minors.
pub fn plan(spec: &str, nvidia_minors: &[u32]) -> Result<Plan, RenderError> {
    match spec {
        "auto" if nvidia_minors.is_empty() => Ok(Plan::default()),
        "auto" | "nvidia" => nvidia(spec, nvidia_minors),
        "" | "none" => Ok(Plan::default()),
        s if s.starts_with("standin:") => standin(s, &s["standin:".len()..]),
        s if s.starts_with('/') => {
            let ok = s.len() <= 4096 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-[],".contains(&b));
            if !ok || count(s) == 0 {
                return Err(invalid(s, "not a device file expression of absolute paths"));
            }
            Ok(Plan {
                files: s.into(),
                count: count(s),
                real: true,
                make: vec![],
            })
        }
        s => Err(invalid(s, "expected auto, standin:N, nvidia, a device file expression or none")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_expressions_are_counted() {
        assert_eq!(count(""), 0);
        assert_eq!(count("/dev/x[0-1]"), 2);
        assert_eq!(count("/dev/nvidia[0,2,5-7]"), 5);
        assert_eq!(count("/dev/a,/dev/b"), 2);
        assert_eq!(count("/dev/a"), 1);
        assert_eq!(count("/dev/x[3-1]"), 0);
    }

    #[test]
    fn standins_are_made_with_the_minors_of_major_one() {
        let p = plan("standin:2", &[]).expect("standin:2");
        assert_eq!(p.files, "/dev/delegate-gpu[0-1]");
        assert_eq!(p.count, 2);
        assert_eq!(
            p.lines(),
            "files /dev/delegate-gpu[0-1]\ncount 2\nmax_gpus 0\n\
             device /dev/delegate-gpu0 1 3\ndevice /dev/delegate-gpu1 1 5\n"
        );
        for bad in ["standin:0", "standin:5", "standin:x", "standin:"] {
            let e = plan(bad, &[]).expect_err(bad).to_string();
            assert!(e.contains("standin:N takes N from 1 to 4"), "{e}");
        }
    }

    #[test]
    fn auto_and_nvidia_take_the_machines_devices() {
        assert_eq!(plan("auto", &[]).expect("auto"), Plan::default());
        let p = plan("auto", &[1, 0, 1]).expect("auto with GPUs");
        assert_eq!((p.files.as_str(), p.count, p.real), ("/dev/nvidia[0,1]", 2, true));
        assert_eq!(
            plan("nvidia", &[3]).expect("nvidia").lines(),
            "files /dev/nvidia[3]\ncount 1\nmax_gpus 1\n"
        );
        let e = plan("nvidia", &[]).expect_err("no devices").to_string();
        assert!(e.contains("no /dev/nvidia<N> on this machine"), "{e}");
    }

    #[test]
    fn named_files_none_and_nonsense() {
        let p = plan("/dev/x[0-1]", &[]).expect("files");
        assert_eq!((p.count, p.real), (2, true));
        assert_eq!(plan("none", &[0]).expect("none").lines(), "files \ncount 0\nmax_gpus 0\n");
        for bad in ["/dev/x; rm -rf /", "/dev/x[a-b]", "gpus", "/dev/x\n[0]"] {
            assert!(matches!(plan(bad, &[]), Err(RenderError::Invalid(_))), "{bad}");
        }
    }
}

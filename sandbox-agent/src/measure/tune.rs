//! Tuning a call's cores for measurement (the policy's tune_cpus): the
//! `performance` governor on each of them and turbo/boost off, where the
//! node's cpufreq allows it; everything changed is put back when the
//! [`Tuned`] guard is dropped (the call ended, or the agent's task
//! unwound). Nodes without cpufreq (most VMs) or with a read-only /sys (a
//! container) are left as they are, and the notes say so.

use std::path::{Path, PathBuf};

/// What was changed (file, old content), restored on drop; and what the
/// call's fingerprint says about it.
pub struct Tuned {
    restore: Vec<(PathBuf, String)>,
    pub notes: Vec<String>,
}

impl Drop for Tuned {
    fn drop(&mut self) {
        for (path, old) in self.restore.drain(..).rev() {
            if let Err(e) = std::fs::write(&path, &old) {
                tracing::error!("cannot restore {} to {old:?}: {e}", path.display());
            }
        }
    }
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Why a tunable was left as it is.
#[derive(Debug, thiserror::Error)]
enum SetError {
    #[error("{} is missing", .0.display())]
    Missing(PathBuf),
    #[error("{} cannot be written ({source})", path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

/// Writes `value` into `path` when it holds something else; remembers the
/// old value for the restore. Err: why not.
fn set(restore: &mut Vec<(PathBuf, String)>, path: PathBuf, value: &str) -> Result<bool, SetError> {
    let old = read(&path).ok_or_else(|| SetError::Missing(path.clone()))?;
    if old == value {
        return Ok(false);
    }
    std::fs::write(&path, value).map_err(|source| SetError::Write { path: path.clone(), source })?;
    restore.push((path, old));
    Ok(true)
}

fn governors(root: &Path, cores: &[u32], restore: &mut Vec<(PathBuf, String)>, notes: &mut Vec<String>) {
    let cpu = |c: u32, f: &str| root.join(format!("sys/devices/system/cpu/cpu{c}/cpufreq/{f}"));
    let Some(first) = cores.first() else { return };
    if !cpu(*first, "scaling_governor").exists() {
        notes.push("governor left as it is: this node has no cpufreq (a VM, or a kernel without it)".into());
        return;
    }
    let mut changed = Vec::new();
    for &c in cores {
        let available = read(&cpu(c, "scaling_available_governors")).unwrap_or_default();
        if !available.split_whitespace().any(|g| g == "performance") {
            notes.push(format!("core {c}: no performance governor (available: {available})"));
            continue;
        }
        match set(restore, cpu(c, "scaling_governor"), "performance") {
            Ok(true) => changed.push(c),
            Ok(false) => {}
            Err(why) => notes.push(format!("core {c}: governor left as it is: {why}")),
        }
    }
    if !changed.is_empty() {
        let list: Vec<String> = changed.iter().map(u32::to_string).collect();
        notes.push(format!("governor set to performance on cores {} for the call", list.join(",")));
    }
}

fn boost(root: &Path, restore: &mut Vec<(PathBuf, String)>, notes: &mut Vec<String>) {
    let generic = root.join("sys/devices/system/cpu/cpufreq/boost");
    let intel = root.join("sys/devices/system/cpu/intel_pstate/no_turbo");
    let (path, off) = if generic.exists() {
        (generic, "0")
    } else if intel.exists() {
        (intel, "1")
    } else {
        notes.push("boost left as it is: this node has no boost switch".into());
        return;
    };
    match set(restore, path, off) {
        Ok(true) => notes.push("boost turned off for the call".into()),
        Ok(false) => notes.push("boost already off".into()),
        Err(why) => notes.push(format!("boost left as it is: {why}")),
    }
}

/// Tunes `cores` under `root` (the node's /, or a test's directory).
pub fn tune(root: &Path, cores: &[u32]) -> Tuned {
    let (mut restore, mut notes) = (Vec::new(), Vec::new());
    governors(root, cores, &mut restore, &mut notes);
    boost(root, &mut restore, &mut notes);
    Tuned { restore, notes }
}

/// Nothing tuned (the policy says so).
pub fn untouched() -> Tuned {
    Tuned {
        restore: Vec::new(),
        notes: vec!["not tuned (the site policy's tune_cpus is false)".into()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpufreq(root: &Path, core: u32, gov: &str, available: &str) {
        let d = root.join(format!("sys/devices/system/cpu/cpu{core}/cpufreq"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("scaling_governor"), gov).unwrap();
        std::fs::write(d.join("scaling_available_governors"), available).unwrap();
    }

    /// The sysfs layout of a node with cpufreq and a boost switch (this VM
    /// has neither): set for the call, restored after.
    #[test]
    fn governor_and_boost_are_set_and_restored() {
        let root = tempfile::tempdir().unwrap();
        cpufreq(root.path(), 1, "powersave\n", "performance powersave\n");
        cpufreq(root.path(), 2, "performance\n", "performance powersave\n");
        let boost = root.path().join("sys/devices/system/cpu/cpufreq/boost");
        std::fs::create_dir_all(boost.parent().unwrap()).unwrap();
        std::fs::write(&boost, "1\n").unwrap();
        let gov1 = root.path().join("sys/devices/system/cpu/cpu1/cpufreq/scaling_governor");
        {
            let t = tune(root.path(), &[1, 2]);
            assert_eq!(read(&gov1).as_deref(), Some("performance"));
            assert_eq!(read(&boost).as_deref(), Some("0"));
            assert!(
                t.notes
                    .contains(&"governor set to performance on cores 1 for the call".to_owned()),
                "{:?}",
                t.notes
            );
            assert!(t.notes.contains(&"boost turned off for the call".to_owned()), "{:?}", t.notes);
        }
        assert_eq!(read(&gov1).as_deref(), Some("powersave"), "restored after the call");
        assert_eq!(read(&boost).as_deref(), Some("1"));
    }

    #[test]
    fn a_node_without_cpufreq_is_left_alone_and_says_so() {
        let root = tempfile::tempdir().unwrap();
        let t = tune(root.path(), &[0]);
        assert_eq!(
            t.notes,
            [
                "governor left as it is: this node has no cpufreq (a VM, or a kernel without it)",
                "boost left as it is: this node has no boost switch"
            ]
        );
    }
}

//! cgroup.conf: Slurm's cgroup side, chosen from the node's facts (its
//! cgroup version, whether systemd runs it, its Slurm version), so that
//! slurmd starts on cgroup v1, on cgroup v2 under systemd, and on cgroup v2
//! without systemd (a container, a bare GPU server), where Slurm 22.05's
//! default asks D-Bus for a scope and fails.

use serde::Serialize;

use crate::{templates, RenderError, Shape, MARKER};

/// Where slurmd makes its own scope when it ignores systemd.
pub const SLICE: &str = "/sys/fs/cgroup/system.slice";

/// The node's cgroup hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Hierarchy {
    V1,
    V2,
}

/// How slurmd's cgroup side is configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// cgroup v1: Slurm's v1 plugin.
    V1,
    /// cgroup v2 under systemd: slurmd's scope from systemd.
    Systemd,
    /// cgroup v2 without systemd, Slurm 23.11 or later: no plugin.
    Disabled,
    /// cgroup v2 without systemd, older Slurm: slurmd makes its scope under
    /// [`SLICE`] itself (`IgnoreSystemd`), which must exist beforehand.
    OwnScope,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::V1 => "v1",
            Mode::Systemd => "systemd",
            Mode::Disabled => "disabled",
            Mode::OwnScope => "own-scope",
        }
    }

    /// Whether the slice must be made (with its controllers) before slurmd
    /// starts.
    pub fn needs_slice(self) -> bool {
        self == Mode::OwnScope
    }
}

/// A Slurm version `major.minor[.patch...]` as (major, minor).
pub fn slurm_version(text: &str) -> Result<(u32, u32), RenderError> {
    let bad = || RenderError::Invalid(format!("'{text}' is not a Slurm version such as 22.05.8"));
    let v = text.trim().trim_start_matches("slurm ").trim_start_matches("slurm-wlm ");
    let mut parts = v.split(['.', '-']);
    let major = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let minor = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    Ok((major, minor))
}

/// The mode for a node of `hierarchy`, run by systemd or not, with Slurm
/// `version`.
pub fn mode(hierarchy: Hierarchy, systemd: bool, version: (u32, u32)) -> Mode {
    match (hierarchy, systemd) {
        (Hierarchy::V1, _) => Mode::V1,
        (Hierarchy::V2, true) => Mode::Systemd,
        // CgroupPlugin=disabled is Slurm 23.11's.
        (Hierarchy::V2, false) if version >= (23, 11) => Mode::Disabled,
        (Hierarchy::V2, false) => Mode::OwnScope,
    }
}

#[derive(Serialize)]
struct Context {
    marker: &'static str,
    shape: &'static str,
    facts: String,
    mode: &'static str,
    slice: &'static str,
}

/// cgroup.conf for a node of these facts.
pub fn render(shape: Shape, hierarchy: Hierarchy, systemd: bool, version: &str) -> Result<String, RenderError> {
    let v = slurm_version(version)?;
    let m = mode(hierarchy, systemd, v);
    let ctx = Context {
        marker: MARKER,
        shape: if shape == Shape::Local { "local" } else { "stack" },
        facts: format!(
            "cgroup {}, {}, Slurm {}.{:02}",
            if hierarchy == Hierarchy::V1 { "v1" } else { "v2" },
            if systemd { "systemd" } else { "no systemd" },
            v.0,
            v.1
        ),
        mode: m.as_str(),
        slice: SLICE,
    };
    templates::render("cgroup.conf", &ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect()
    }

    #[test]
    fn each_kind_of_node_gets_the_settings_its_slurmd_starts_with() {
        let conf = |h, systemd, v| render(Shape::Local, h, systemd, v).unwrap();
        // This project's VM: cgroup v1, Debian 12's Slurm.
        assert_eq!(lines(&conf(Hierarchy::V1, false, "22.05.8")), ["CgroupPlugin=cgroup/v1"]);
        // A real server: cgroup v2 under systemd.
        assert_eq!(lines(&conf(Hierarchy::V2, true, "22.05.8")), ["CgroupPlugin=cgroup/v2"]);
        assert_eq!(lines(&conf(Hierarchy::V2, true, "24.11.5")), ["CgroupPlugin=cgroup/v2"]);
        // The bare GPU machine of issue 43: cgroup v2, no systemd, 22.05
        // (slurmd failed: "cannot connect to dbus system daemon").
        assert_eq!(
            lines(&conf(Hierarchy::V2, false, "22.05.8")),
            ["CgroupPlugin=cgroup/v2", "IgnoreSystemd=yes", "CgroupAutomount=yes"]
        );
        // Debian 13's Slurm in a container: no plugin at all.
        assert_eq!(lines(&conf(Hierarchy::V2, false, "24.11.5")), ["CgroupPlugin=disabled"]);
        assert!(conf(Hierarchy::V2, false, "22.05.8").contains("(cgroup v2, no systemd, Slurm 22.05)"));
    }

    #[test]
    fn only_the_own_scope_mode_needs_the_slice_made() {
        assert!(mode(Hierarchy::V2, false, (22, 5)).needs_slice());
        assert!(mode(Hierarchy::V2, false, (23, 2)).needs_slice());
        assert!(!mode(Hierarchy::V2, false, (23, 11)).needs_slice());
        assert!(!mode(Hierarchy::V2, true, (22, 5)).needs_slice());
        assert!(!mode(Hierarchy::V1, false, (22, 5)).needs_slice());
    }

    #[test]
    fn versions_are_read_as_slurmd_prints_them() {
        assert_eq!(slurm_version("slurm 22.05.8").unwrap(), (22, 5));
        assert_eq!(slurm_version("slurm-wlm 24.11.5\n").unwrap(), (24, 11));
        assert_eq!(slurm_version("23.11").unwrap(), (23, 11));
        for bad in ["", "slurm", "x.y", "22"] {
            let e = slurm_version(bad).unwrap_err().to_string();
            assert_eq!(e, format!("'{bad}' is not a Slurm version such as 22.05.8"));
        }
    }
}

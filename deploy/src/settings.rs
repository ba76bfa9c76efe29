//! The deployment's settings: `DELEGATE_*` names and their values, as
//! build_cluster.sh exports them to this tool, read with their types.
//!
//! Every getter checks the value and fails with the setting's name, what it
//! must be and what it was ("DELEGATE_STACK_WORKERS must be a number from 1
//! to 999, not 'two'").

use std::collections::BTreeMap;

use delegate_protocol::units;

/// A setting that is missing or does not hold what it must.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("{name} is not set (build_cluster.sh sets it; docs/configuration.md)")]
    Missing { name: String },
    #[error("{name} must be {want}, not '{value}'")]
    Invalid { name: String, want: String, value: String },
}

/// The settings, by name.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    values: BTreeMap<String, String>,
}

impl Settings {
    /// The `DELEGATE_*` variables of this process's environment (values
    /// that are not UTF-8 are left out: no setting needs one).
    pub fn from_env() -> Self {
        Self::from_pairs(std::env::vars_os().filter_map(|(k, v)| {
            let (k, v) = (k.into_string().ok()?, v.into_string().ok()?);
            k.starts_with("DELEGATE_").then_some((k, v))
        }))
    }

    pub fn from_pairs<K: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        Settings {
            values: pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        }
    }

    /// These settings with `name` set to `value`.
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.values.insert(name.into(), value.into());
        self
    }

    /// The value as written; missing is an error.
    pub fn raw(&self, name: &str) -> Result<&str, SettingError> {
        self.values
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| SettingError::Missing { name: name.into() })
    }

    /// The value, or `default` when the setting is missing or empty.
    pub fn raw_or<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        self.values
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .unwrap_or(default)
    }

    fn invalid(name: &str, want: &str, value: &str) -> SettingError {
        let shown: String = value.chars().take(80).map(|c| if c.is_control() { '?' } else { c }).collect();
        SettingError::Invalid {
            name: name.into(),
            want: want.into(),
            value: shown,
        }
    }

    /// A whole number in `min..=max`.
    pub fn count(&self, name: &str, min: u64, max: u64) -> Result<u64, SettingError> {
        let v = self.raw(name)?;
        let want = format!("a number from {min} to {max}");
        match v.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) && v.len() <= 20 => Ok(n),
            _ => Err(Self::invalid(name, &want, v)),
        }
    }

    /// `0` or `1`.
    pub fn flag(&self, name: &str) -> Result<bool, SettingError> {
        match self.raw(name)? {
            "0" => Ok(false),
            "1" => Ok(true),
            v => Err(Self::invalid(name, "0 or 1", v)),
        }
    }

    /// A size as the site policy writes it (512M, 4G), returned as written.
    pub fn size(&self, name: &str) -> Result<String, SettingError> {
        let v = self.raw(name)?;
        match units::parse_size(v) {
            Ok(b) if b > 0 && v.bytes().all(|c| c.is_ascii_alphanumeric()) => Ok(v.to_owned()),
            _ => Err(Self::invalid(name, "a size such as 512M or 4G", v)),
        }
    }

    /// A size setting in bytes (`0` where the setting allows none).
    pub fn bytes(&self, name: &str) -> Result<u64, SettingError> {
        if self.raw(name)? == "0" {
            return Ok(0);
        }
        let v = self.size(name)?;
        units::parse_size(&v).map_err(|_| Self::invalid(name, "a size such as 512M or 4G", &v))
    }

    /// A number of CPUs (2, 0.5) as a CFS quota: microseconds of CPU per
    /// `period_us` (rounded down, at least 1000: the kernel's minimum).
    pub fn cpu_quota_us(&self, name: &str, period_us: u64) -> Result<u64, SettingError> {
        let v = self.raw(name)?;
        let cpus: f64 = v
            .parse()
            .ok()
            .filter(|c: &f64| c.is_finite() && *c > 0.0 && v.len() <= 12 && !v.starts_with(['+', '-']))
            .ok_or_else(|| Self::invalid(name, "a number of CPUs such as 2 or 0.5", v))?;
        Ok(((cpus * period_us as f64) as u64).max(1000))
    }

    /// A duration as the site policy writes it (90s, 10m, 1h30m).
    pub fn duration(&self, name: &str) -> Result<String, SettingError> {
        let v = self.raw(name)?;
        match units::parse_duration(v) {
            Ok(s) if s > 0 && v.bytes().all(|c| c.is_ascii_alphanumeric()) => Ok(v.to_owned()),
            _ => Err(Self::invalid(name, "a duration such as 90s, 10m or 1h", v)),
        }
    }

    /// A Slurm time limit: `[D-]HH:MM:SS`, `HH:MM:SS`, `MM:SS` or minutes.
    pub fn slurm_time(&self, name: &str) -> Result<String, SettingError> {
        let v = self.raw(name)?;
        if is_slurm_time(v) {
            Ok(v.to_owned())
        } else {
            Err(Self::invalid(name, "a Slurm time such as 02:00:00 or 1-00:00:00", v))
        }
    }

    /// A value that passes `check` (one of the `is_*` functions below),
    /// described by `want` in the error.
    pub fn checked(&self, name: &str, want: &str, check: fn(&str) -> bool) -> Result<String, SettingError> {
        let v = self.raw(name)?;
        if check(v) {
            Ok(v.to_owned())
        } else {
            Err(Self::invalid(name, want, v))
        }
    }
}

/// An absolute path of the bytes the job gate and the SPANK plugin accept
/// (A-Z a-z 0-9 . _ / + @ = , : -), without `..`.
pub fn is_safe_path(s: &str) -> bool {
    s.starts_with('/')
        && s.len() <= 4096
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/+@=,:-".contains(&b))
        && !s.split('/').any(|c| c == "..")
}

/// A Unix user or group name (as useradd accepts by default).
pub fn is_unix_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_lowercase() || c == b'_')
        && s.len() <= 32
        && b.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
}

/// A short host or node name (letters, digits, '-', '_').
pub fn is_node_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !s.starts_with('-')
}

/// A Docker image reference (name[:tag][@digest]) without spaces or quotes.
pub fn is_image(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/:@-".contains(&b))
}

/// Slurm's time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
pub fn is_slurm_time(s: &str) -> bool {
    let nums = |p: &str| !p.is_empty() && p.len() <= 6 && p.bytes().all(|b| b.is_ascii_digit());
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (Some(d), r),
        None => (None, s),
    };
    if days.is_some_and(|d| !nums(d)) {
        return false;
    }
    let parts: Vec<&str> = rest.split(':').collect();
    parts.len() <= 3 && parts.iter().all(|p| nums(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(pairs: &[(&str, &str)]) -> Settings {
        Settings::from_pairs(pairs.iter().copied())
    }

    #[test]
    fn counts_flags_and_their_errors() {
        let st = s(&[
            ("DELEGATE_A", "3"),
            ("DELEGATE_B", "two"),
            ("DELEGATE_F", "1"),
            ("DELEGATE_G", "yes"),
        ]);
        assert_eq!(st.count("DELEGATE_A", 1, 9), Ok(3));
        assert_eq!(
            st.count("DELEGATE_B", 1, 9).unwrap_err().to_string(),
            "DELEGATE_B must be a number from 1 to 9, not 'two'"
        );
        assert_eq!(
            st.count("DELEGATE_A", 4, 9).unwrap_err().to_string(),
            "DELEGATE_A must be a number from 4 to 9, not '3'"
        );
        assert_eq!(st.flag("DELEGATE_F"), Ok(true));
        assert_eq!(
            st.flag("DELEGATE_G").unwrap_err().to_string(),
            "DELEGATE_G must be 0 or 1, not 'yes'"
        );
        assert!(matches!(st.raw("DELEGATE_NONE"), Err(SettingError::Missing { .. })));
    }

    #[test]
    fn sizes_in_bytes_and_cpus_as_a_cfs_quota() {
        let st = s(&[
            ("M", "512M"),
            ("Z", "0"),
            ("X", "5 G"),
            ("C", "1.5"),
            ("D", "0.0001"),
            ("E", "-1"),
        ]);
        assert_eq!(st.bytes("M"), Ok(512 << 20));
        assert_eq!(st.bytes("Z"), Ok(0));
        assert_eq!(
            st.bytes("X").unwrap_err().to_string(),
            "X must be a size such as 512M or 4G, not '5 G'"
        );
        assert_eq!(st.cpu_quota_us("C", 100_000), Ok(150_000));
        assert_eq!(st.cpu_quota_us("D", 100_000), Ok(1000));
        assert_eq!(
            st.cpu_quota_us("E", 100_000).unwrap_err().to_string(),
            "E must be a number of CPUs such as 2 or 0.5, not '-1'"
        );
    }

    #[test]
    fn sizes_durations_and_slurm_times() {
        let st = s(&[
            ("M", "512M"),
            ("T", "1h30m"),
            ("X", "lots"),
            ("P", "02:00:00"),
            ("Q", "1-00:00:00"),
        ]);
        assert_eq!(st.size("M").unwrap(), "512M");
        assert_eq!(
            st.size("X").unwrap_err().to_string(),
            "X must be a size such as 512M or 4G, not 'lots'"
        );
        assert_eq!(
            s(&[("S", " 2G")]).size("S").unwrap_err().to_string(),
            "S must be a size such as 512M or 4G, not ' 2G'"
        );
        assert_eq!(
            s(&[("S", "2G\"")]).size("S").unwrap_err().to_string(),
            "S must be a size such as 512M or 4G, not '2G\"'"
        );
        assert_eq!(st.duration("T").unwrap(), "1h30m");
        assert_eq!(
            st.duration("X").unwrap_err().to_string(),
            "X must be a duration such as 90s, 10m or 1h, not 'lots'"
        );
        assert_eq!(st.slurm_time("P").unwrap(), "02:00:00");
        assert_eq!(st.slurm_time("Q").unwrap(), "1-00:00:00");
        for bad in ["", "1h", "1:2:3:4", "-1", "a-01:00:00", "1-"] {
            assert!(!is_slurm_time(bad), "{bad}");
        }
    }

    #[test]
    fn names_paths_and_images() {
        assert!(is_safe_path("/usr/local/bin/sandbox-runner"));
        for bad in ["rel", "/a b", "/a\"b", "/a/../b", "/a\nb", "/$(x)"] {
            assert!(!is_safe_path(bad), "{bad}");
        }
        assert!(is_unix_name("delegate-admin") && !is_unix_name("Admin") && !is_unix_name("1x"));
        assert!(is_node_name("vm-1") && !is_node_name("a b") && !is_node_name(""));
        assert!(is_image("delegate-sandbox:latest") && !is_image("x\"y") && !is_image(""));
    }

    #[test]
    fn a_shown_value_is_bounded_and_has_no_controls() {
        let long = format!("{}\n", "x".repeat(200));
        let st = s(&[("N", long.as_str())]);
        let msg = st.count("N", 0, 1).unwrap_err().to_string();
        assert!(msg.len() < 160 && !msg.contains('\n'), "{msg}");
    }
}

//! The lockdown's two files: slurmctld's job gate (job_submit.lua: the
//! site's settings, then the gate's body) and slurmstepd's SPANK stack.

use std::path::Path;

use delegate_protocol::policy::Policy;
use delegate_protocol::units;
use serde::Serialize;

use crate::settings::{is_safe_path, is_unix_name};
use crate::{templates, RenderError, MARKER};

#[derive(Serialize)]
struct GateContext {
    marker: &'static str,
    runner: String,
    job_roots: Vec<String>,
    admin_group: String,
    slurm_uid: u32,
    max_map_minutes: u64,
    partitions: Vec<String>,
    as_module: bool,
}

/// How slurmctld meets the gate: as its whole job_submit.lua (a cluster
/// delegate owns), or as a module the site's own job_submit.lua loads
/// with `dofile` and calls (`job_submit`, `job_modify`), defining no global.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateForm {
    Whole,
    Module,
}

/// The site policy the gate follows: the file when it exists, else the
/// policy's defaults (the local setup installs the gate before the policy)
/// unless `required` (a site's cluster: the defaults would lock down every
/// partition).
fn read_policy(path: &Path, required: bool) -> Result<Policy, RenderError> {
    let fail = |reason: String| RenderError::Policy { path: path.display().to_string(), reason };
    match std::fs::read_to_string(path) {
        Ok(text) => Policy::parse(&text, &path.display().to_string()).map_err(|e| fail(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && required => Err(fail(
            "no such file: the gate of a site's cluster follows its policy (its partitions, its runner)".into(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Policy::default()),
        Err(e) => Err(fail(e.to_string())),
    }
}

fn checked_path(what: &str, p: &str) -> Result<String, RenderError> {
    if is_safe_path(p) {
        Ok(p.to_owned())
    } else {
        Err(RenderError::Invalid(format!(
            "{what} '{p}' must be an absolute path of the bytes A-Z a-z 0-9 . _ / + @ = , : - (what the gate and the SPANK plugin accept)"
        )))
    }
}

/// The gate's Slurm time limit for a map's allocation: the policy's
/// max_allocation_time (after which it claims no call) plus its max_time
/// (the call in progress) and the allowance for that call
/// ([`delegate_protocol::policy::MAP_CALL_ALLOWANCE_SECS`]), in minutes, rounded up,
/// plus the minute the client adds (delegate-client `time_limit_minutes`).
pub fn map_minutes(max_allocation_time: &str, max_time: &str) -> Result<u64, RenderError> {
    let secs = |what: &str, d: &str| match units::parse_duration(d) {
        Ok(secs) if secs > 0 => Ok(secs),
        _ => Err(RenderError::Invalid(format!("{what} '{d}' is not a duration above 0"))),
    };
    let longest = secs("max_allocation_time", max_allocation_time)?
        .saturating_add(secs("max_time", max_time)?)
        .saturating_add(delegate_protocol::policy::MAP_CALL_ALLOWANCE_SECS);
    Ok(longest.saturating_add(60).div_ceil(60))
}

/// The gate for `runner` (None: the policy's), the policy at `policy`, the admin group and
/// SlurmUser's uid, in the form slurmctld meets it.
pub fn gate(
    runner: Option<&str>,
    policy: &Path,
    admin_group: &str,
    slurm_uid: u32,
    form: GateForm,
) -> Result<String, RenderError> {
    let p = read_policy(policy, form == GateForm::Module)?;
    if !is_unix_name(admin_group) {
        return Err(RenderError::Invalid(format!(
            "the admin group '{admin_group}' is not a group name"
        )));
    }
    let job_roots = p
        .job_roots
        .iter()
        .map(|r| checked_path("job_roots entry", &r.to_string_lossy()))
        .collect::<Result<Vec<_>, _>>()?;
    if job_roots.is_empty() {
        return Err(RenderError::Invalid(
            "the policy's job_roots is empty: the gate would refuse every job".into(),
        ));
    }
    let ctx = GateContext {
        marker: MARKER,
        runner: match runner {
            Some(r) => checked_path("the runner path", r)?,
            None => checked_path("the policy's runner", &p.runner.to_string_lossy())?,
        },
        job_roots,
        admin_group: admin_group.into(),
        slurm_uid,
        max_map_minutes: map_minutes(&p.max_allocation_time, &p.max_time)?,
        // (checked by the policy's parser: partition names only)
        partitions: p.partitions.clone(),
        as_module: form == GateForm::Module,
    };
    Ok(templates::render("job_submit.settings.lua", &ctx)? + templates::GATE_BODY)
}

#[derive(Serialize)]
struct PlugstackContext {
    marker: &'static str,
    plugin: String,
    admin_gid: u32,
    runner: String,
    /// delegate's nodes on a shared cluster ("" : every node).
    nodes: String,
}

/// The SPANK stack: the lockdown plugin with the admin gid and the
/// runner; on a cluster shared with plain Slurm jobs, `nodes` (delegate's,
/// host names) limits it to them (empty: every node).
pub fn plugstack(plugin: &str, admin_gid: u32, runner: &str, nodes: &[String]) -> Result<String, RenderError> {
    if let Some(bad) = nodes.iter().find(|n| !crate::settings::is_node_name(n)) {
        return Err(RenderError::Invalid(format!("{bad:?} is not a node name")));
    }
    let ctx = PlugstackContext {
        marker: MARKER,
        plugin: checked_path("the SPANK plugin path", plugin)?,
        admin_gid,
        runner: checked_path("the runner path", runner)?,
        nodes: nodes.join(","),
    };
    templates::render("plugstack.conf", &ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_minutes_match_the_clients_time_limit() {
        // 10 min + 5 min + 30 s, plus the client's minute: 17 (rounded up).
        assert_eq!(map_minutes("10m", "5m").unwrap(), 17);
        assert_eq!(map_minutes("90s", "60s").unwrap(), 4);
        let e = map_minutes("0", "1m").unwrap_err().to_string();
        assert_eq!(e, "max_allocation_time '0' is not a duration above 0");
        let e = map_minutes("1m", "0").unwrap_err().to_string();
        assert_eq!(e, "max_time '0' is not a duration above 0");
    }

    #[test]
    fn unsafe_values_are_refused_with_their_name() {
        let err = plugstack("/lib/x.so", 3990, "/bin/run ner", &[]).unwrap_err().to_string();
        assert!(err.starts_with("the runner path '/bin/run ner'"), "{err}");
        let err = gate(
            Some("/r"),
            Path::new("/nonexistent/policy.toml"),
            "Bad Group",
            64030,
            GateForm::Whole,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("admin group"), "{err}");
    }

    #[test]
    fn the_module_gate_needs_the_sites_policy() {
        let err = gate(
            None,
            Path::new("/nonexistent/policy.toml"),
            "delegate-admin",
            1,
            GateForm::Module,
        )
        .expect_err("a module gate without a policy");
        assert!(err.to_string().contains("/nonexistent/policy.toml"), "{err}");
        gate(
            None,
            Path::new("/nonexistent/policy.toml"),
            "delegate-admin",
            1,
            GateForm::Whole,
        )
        .expect("a whole gate does without the site's policy");
    }

    #[test]
    fn a_policy_that_does_not_parse_stops_the_gate() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("policy.toml");
        std::fs::write(&p, "job_roots = \"/home\"\n").unwrap();
        let err = gate(Some("/usr/local/bin/sandbox-runner"), &p, "delegate-admin", 1, GateForm::Whole)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("cannot read the site policy {}", p.display())),
            "{err}"
        );
    }
}

//! The site policy a stack worker runs with: the deployed policy.toml with
//! what only the worker's container knows set in it (where the host's
//! engine sees the agent's staging directory, and the host's /proc), and
//! the one value of it the entrypoint needs (the sandbox image). The text
//! is read by the protocol's own parser before and after: the entrypoint
//! (docker/cluster-entrypoint.sh) installs what this prints, and edits
//! nothing itself.

use std::fmt::Write as _;

use delegate_protocol::policy::Policy;

use crate::settings::is_safe_path;
use crate::RenderError;

/// What the worker's container knows.
pub struct WorkerFacts<'a> {
    /// The agent's staging directory as the host's engine sees it.
    pub staging_host_dir: &'a str,
    /// The host's /proc, mounted in the container (None: not mounted).
    pub host_proc: Option<&'a str>,
}

fn parsed(text: &str, what: &str) -> Result<Policy, RenderError> {
    Policy::parse(text, what).map_err(|e| RenderError::Invalid(e.to_string()))
}

/// Whether `line` sets `key` (`key = ...`, spaces allowed).
fn sets(line: &str, key: &str) -> bool {
    line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('='))
}

/// `text` with `key` set to the string `value`: its line replaced, or one
/// added with `why` as its comment when there is none. With `keep`, a line
/// already there is left as it is.
fn set(text: &str, key: &str, value: &str, why: &str, keep: bool) -> String {
    let line = format!("{key} = \"{value}\"");
    let mut found = false;
    let mut out = String::with_capacity(text.len() + line.len() + why.len() + 8);
    for l in text.lines() {
        if sets(l, key) {
            found = true;
            out.push_str(if keep { l } else { &line });
        } else {
            out.push_str(l);
        }
        out.push('\n');
    }
    if !found {
        let _ = writeln!(out, "# {why}\n{line}");
    }
    out
}

/// The worker's policy.toml: `deployed` with `facts` set in it.
pub fn worker_policy(deployed: &str, facts: &WorkerFacts) -> Result<String, RenderError> {
    parsed(deployed, "policy.toml as deployed")?;
    let mut paths = vec![facts.staging_host_dir];
    paths.extend(facts.host_proc);
    if let Some(bad) = paths.into_iter().find(|p| !is_safe_path(p)) {
        return Err(RenderError::Invalid(format!(
            "{bad:?} is not an absolute path of A-Z a-z 0-9 . _ / + @ = , : -"
        )));
    }
    let mut text = set(
        deployed,
        "staging_host_dir",
        facts.staging_host_dir,
        "Set by the entrypoint: this worker's staging directory as the host's engine sees it.",
        false,
    );
    if let Some(proc) = facts.host_proc {
        text = set(
            &text,
            "host_proc",
            proc,
            "Set by the entrypoint: the host's /proc, where the sandboxes' processes are.",
            true,
        );
    }
    parsed(&text, "policy.toml with the worker's facts")?;
    Ok(text)
}

/// The policy's sandbox image (`default_image`), as the protocol reads it.
pub fn default_image(policy: &str) -> Result<String, RenderError> {
    Ok(parsed(policy, "policy.toml")?.default_image)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPLOYED: &str = "default_image = \"delegate-sandbox:latest\"\njob_roots = [\"/home\"]\n";

    #[test]
    fn the_workers_facts_are_set_once_and_the_rest_kept() {
        let facts = WorkerFacts {
            staging_host_dir: "/var/lib/delegate/stage-w1",
            host_proc: Some("/run/e/proc"),
        };
        let once = worker_policy(DEPLOYED, &facts).expect("valid");
        assert!(once.starts_with(DEPLOYED), "{once}");
        assert!(once.contains("\nstaging_host_dir = \"/var/lib/delegate/stage-w1\"\n"), "{once}");
        assert!(once.contains("\nhost_proc = \"/run/e/proc\"\n"), "{once}");
        // A restarted worker: the staging directory replaced, not added
        // again; a host_proc already there (the instructor's) kept.
        let moved = WorkerFacts {
            staging_host_dir: "/srv/stage",
            host_proc: Some("/elsewhere"),
        };
        let again = worker_policy(&once, &moved).expect("valid");
        assert_eq!(again.matches("staging_host_dir =").count(), 1, "{again}");
        assert!(again.contains("staging_host_dir = \"/srv/stage\""), "{again}");
        assert!(
            again.contains("host_proc = \"/run/e/proc\"") && !again.contains("/elsewhere"),
            "{again}"
        );
        let p = Policy::parse(&again, "t").expect("parses");
        assert_eq!(p.staging_host_dir, std::path::PathBuf::from("/srv/stage"));
    }

    #[test]
    fn a_bad_path_or_a_bad_policy_is_refused_in_one_sentence() {
        let quote = WorkerFacts {
            staging_host_dir: "/x\"\nmax_cpus = 999",
            host_proc: None,
        };
        let e = worker_policy(DEPLOYED, &quote).expect_err("a quote in the path");
        assert!(e.to_string().contains("is not an absolute path"), "{e}");
        let relative = WorkerFacts {
            staging_host_dir: "stage",
            host_proc: None,
        };
        assert!(worker_policy(DEPLOYED, &relative)
            .expect_err("relative")
            .to_string()
            .contains("absolute"));
        let ok = WorkerFacts { staging_host_dir: "/s", host_proc: None };
        let e = worker_policy("max_cpus = \"many\"\n", &ok).expect_err("not a policy");
        assert!(e.to_string().contains("policy.toml as deployed is invalid"), "{e}");
    }

    #[test]
    fn the_sandbox_image_is_the_parsers() {
        assert_eq!(default_image(DEPLOYED).expect("valid"), "delegate-sandbox:latest");
        assert_eq!(default_image("").expect("empty is the defaults"), "delegate-sandbox:latest");
        assert!(default_image("default_image = 7\n").is_err());
    }
}

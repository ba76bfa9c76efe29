//! The settings file (`cluster.toml`) and the environment, resolved
//! against the schema into one value per setting; and what is printed from
//! the schema: the shell assignments build_cluster.sh evaluates, the
//! commented example file, the docs' table.

use std::collections::BTreeMap;

use crate::schema::{DefaultValue, Kind, Setting, SETTINGS};

/// A settings file or value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{origin}: {reason}")]
    File { origin: String, reason: String },
    #[error("{env} ({key} in the settings file) must be {want}, not '{value}' (from {from})")]
    Invalid {
        env: &'static str,
        key: &'static str,
        want: String,
        value: String,
        from: &'static str,
    },
    #[error("{0}")]
    Conflict(String),
}

/// Facts of this machine some defaults are made of.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    pub nproc: u64,
}

impl Machine {
    pub fn this() -> Self {
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        }
    }
}

/// The file's values by key ("stack.workers" -> "2"); booleans become 1/0,
/// arrays of strings one space-separated string.
pub fn read_file(text: &str, origin: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let fail = |reason: String| ConfigError::File { origin: origin.into(), reason };
    let table: toml::Table = toml::from_str(text).map_err(|e| fail(e.message().to_owned()))?;
    let mut out = BTreeMap::new();
    for (section, body) in &table {
        let toml::Value::Table(body) = body else {
            return Err(fail(format!("'{section}' is not a section ([{section}])")));
        };
        for (name, value) in body {
            let key = format!("{section}.{name}");
            if !SETTINGS.iter().any(|s| s.key == key) {
                return Err(fail(format!(
                    "unknown setting {name} in [{section}] (docs/configuration.md lists them)"
                )));
            }
            out.insert(
                key.clone(),
                scalar(value).ok_or_else(|| {
                    fail(format!("{key} must be a number, a string, true/false or a list of strings"))
                })?,
            );
        }
    }
    Ok(out)
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) if *i >= 0 => Some(i.to_string()),
        toml::Value::Boolean(b) => Some(if *b { "1" } else { "0" }.into()),
        toml::Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(|v| v.join(" ")),
        _ => None,
    }
}

fn default_of(s: &Setting, resolved: &BTreeMap<&'static str, String>, m: Machine) -> String {
    match s.default {
        DefaultValue::Lit(v) => v.to_owned(),
        DefaultValue::Nproc => m.nproc.to_string(),
        DefaultValue::NprocTimes(k) => (m.nproc * k).to_string(),
        DefaultValue::Ref(other, suffix) => format!("{}{suffix}", resolved.get(other).map_or("", String::as_str)),
    }
}

/// Every setting's value: the environment's (when not empty) over the
/// file's over the default, each checked against its kind.
pub fn resolve(
    file: &BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
    m: Machine,
) -> Result<Vec<(&'static str, String)>, ConfigError> {
    let mut resolved: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut out = Vec::with_capacity(SETTINGS.len());
    for s in SETTINGS {
        let (value, from) = match (env.get(s.env).filter(|v| !v.is_empty()), file.get(s.key)) {
            (Some(v), _) => (v.clone(), "the environment"),
            (None, Some(v)) => (v.clone(), "the settings file"),
            (None, None) => (default_of(s, &resolved, m), "the default"),
        };
        s.kind.check(&value).map_err(|want| ConfigError::Invalid {
            env: s.env,
            key: s.key,
            want: want_of(s.kind, &want),
            value: value.chars().take(80).map(|c| if c.is_control() { '?' } else { c }).collect(),
            from,
        })?;
        resolved.insert(s.env, value.clone());
        out.push((s.env, value));
    }
    check_together(&resolved)?;
    Ok(out)
}

/// What no setting decides alone: the elastic minimum at most its maximum.
fn check_together(v: &BTreeMap<&'static str, String>) -> Result<(), ConfigError> {
    let n = |k: &str| v.get(k).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    let (min, max) = (n("DELEGATE_ELASTIC_MIN"), n("DELEGATE_ELASTIC_MAX"));
    if min > max {
        return Err(ConfigError::Conflict(format!(
            "DELEGATE_ELASTIC_MIN ({min}, elastic.min) is above DELEGATE_ELASTIC_MAX ({max}, elastic.max)"
        )));
    }
    Ok(())
}

fn want_of(kind: Kind, want: &str) -> String {
    match kind {
        Kind::Count(min, max) => format!("a whole number from {min} to {max}"),
        _ => want.to_owned(),
    }
}

/// `NAME='value'` lines for bash's eval.
pub fn shell(values: &[(&'static str, String)]) -> String {
    values
        .iter()
        .map(|(k, v)| format!("{k}='{}'\n", v.replace('\'', r"'\''")))
        .collect()
}

fn wrap(text: &str, prefix: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && prefix.len() + line.len() + 1 + word.len() > width {
            out.push_str(&format!("{prefix}{line}\n"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&format!("{prefix}{line}\n"));
    }
    out
}

/// The default as a TOML value, or how it is computed.
fn default_shown(s: &Setting) -> Result<String, String> {
    match s.default {
        DefaultValue::Lit(v) => Ok(match s.kind {
            Kind::Count(..) => v.to_owned(),
            Kind::Flag => (if v == "1" { "true" } else { "false" }).to_owned(),
            _ => format!("\"{v}\""),
        }),
        DefaultValue::Nproc => Err("this machine's cores".into()),
        DefaultValue::NprocTimes(k) => Err(format!("this machine's cores x {k}")),
        DefaultValue::Ref(other, suffix) => {
            let key = SETTINGS.iter().find(|x| x.env == other).map_or(other, |x| x.key);
            Err(if suffix.is_empty() {
                format!("{key}'s value")
            } else {
                format!("{key}'s value followed by {suffix}")
            })
        }
    }
}

const EXAMPLE_HEAD: &str = "\
# cluster.toml -- the settings of a delegate cluster (both shapes:
# `./build_cluster.sh --local` and the stack of `./build_cluster.sh deploy`).
#
# Every setting is shown commented out with its default; uncomment and edit
# to change it. The environment wins over this file (DELEGATE_STACK_WORKERS=4
# ./build_cluster.sh deploy); another file can be named with
# DELEGATE_CLUSTER_CONF=/path/to/cluster.toml. Unknown keys and bad values
# stop build_cluster.sh with the setting's name.
#
# slurm.conf, gres.conf, the site policy, the job gate, the SPANK stack and
# the stack file are rendered from these settings (delegate-deploy).
#
# This file is printed by `delegate-deploy settings --example`; a unit test
# keeps the two equal, so a setting changes in deploy/src/schema.rs.
";

/// The commented example settings file (the repository's cluster.toml).
pub fn example() -> String {
    let mut out = EXAMPLE_HEAD.to_owned();
    let mut section = "";
    for s in SETTINGS {
        let (sect, name) = s.key.split_once('.').unwrap_or(("", s.key));
        if sect != section {
            out.push_str(&format!("\n[{sect}]\n"));
            section = sect;
        }
        out.push_str(&wrap(&format!("{} ({})", s.doc, s.env), "# ", 78));
        match default_shown(s) {
            Ok(v) => out.push_str(&format!("#{name} = {v}\n")),
            Err(how) => out.push_str(&format!("# {name}: default {how}\n")),
        }
    }
    out
}

/// The settings as a Markdown table (docs/configuration.md).
pub fn markdown() -> String {
    let mut out = String::from("| key | environment | default | what |\n|---|---|---|---|\n");
    for s in SETTINGS {
        let default = match default_shown(s) {
            Ok(v) if v == "\"\"" => "empty".to_owned(),
            Ok(v) => format!("`{}`", v.trim_matches('"')),
            Err(how) => how,
        };
        out.push_str(&format!(
            "| `{}` | `{}` | {default} | {} |\n",
            s.key,
            s.env,
            s.doc.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: Machine = Machine { nproc: 4 };

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn value(values: &[(&'static str, String)], name: &str) -> String {
        values
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    #[test]
    fn environment_over_file_over_default() {
        let file = read_file("[stack]\nworkers = 3\ndir = \"/srv/x\"\n[elastic]\nenabled = true\n", "t").unwrap();
        let v = resolve(&file, &env(&[("DELEGATE_STACK_DIR", "/srv/y"), ("DELEGATE_STACK_NAME", "")]), M).unwrap();
        assert_eq!(value(&v, "DELEGATE_STACK_WORKERS"), "3");
        assert_eq!(value(&v, "DELEGATE_STACK_DIR"), "/srv/y");
        assert_eq!(
            value(&v, "DELEGATE_STACK_HOME"),
            "/srv/y/home",
            "a default made of another setting"
        );
        assert_eq!(
            value(&v, "DELEGATE_STACK_NAME"),
            "delegate",
            "an empty environment value is no value"
        );
        assert_eq!(value(&v, "DELEGATE_ELASTIC"), "1");
        assert_eq!(value(&v, "DELEGATE_STACK_WORKER_CPUS"), "4");
        assert_eq!(value(&v, "DELEGATE_STACK_MAX_MEM"), "1024M");
        assert_eq!(value(&v, "DELEGATE_QOS_MAX_CPU_RUN_MINS"), "5760");
    }

    #[test]
    fn the_stacks_name_and_mount_paths_are_checked_here() {
        // (issue 57: build_cluster.sh re-checked these with its own rules)
        for (k, bad) in [
            ("DELEGATE_STACK_NAME", "Delegate"),
            ("DELEGATE_STACK_NAME", "my_stack"),
            ("DELEGATE_STACK_NAME", "1stack"),
            ("DELEGATE_STACK_STAGING", "/run/a:b"),
            ("DELEGATE_STACK_STAGING", "/run/x/"),
            ("DELEGATE_STACK_HOME", "/srv/../etc"),
            ("DELEGATE_STACK_DIR", "relative"),
        ] {
            let err = resolve(&BTreeMap::new(), &env(&[(k, bad)]), M).unwrap_err().to_string();
            assert!(err.starts_with(k) && err.contains(&format!("not '{bad}'")), "{k}={bad}: {err}");
        }
        let ok = resolve(&BTreeMap::new(), &env(&[("DELEGATE_STACK_NAME", "delegate-rush")]), M).unwrap();
        assert_eq!(value(&ok, "DELEGATE_STACK_NAME"), "delegate-rush");
    }

    #[test]
    fn an_elastic_minimum_above_its_maximum_is_refused_with_the_settings() {
        let e = env(&[("DELEGATE_ELASTIC_MIN", "3"), ("DELEGATE_ELASTIC_MAX", "2")]);
        let err = resolve(&BTreeMap::new(), &e, M).unwrap_err().to_string();
        assert_eq!(
            err,
            "DELEGATE_ELASTIC_MIN (3, elastic.min) is above DELEGATE_ELASTIC_MAX (2, elastic.max)"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let err = read_file("[stack]\nwokers = 3\n", "cluster.toml").unwrap_err().to_string();
        assert_eq!(
            err,
            "cluster.toml: unknown setting wokers in [stack] (docs/configuration.md lists them)"
        );
        let err = read_file("workers = 3\n", "cluster.toml").unwrap_err().to_string();
        assert!(err.contains("'workers' is not a section"), "{err}");
        let file = read_file("[stack]\nworkers = 0\n", "t").unwrap();
        let err = resolve(&file, &BTreeMap::new(), M).unwrap_err().to_string();
        assert_eq!(
            err,
            "DELEGATE_STACK_WORKERS (stack.workers in the settings file) must be a whole number from 1 to 999, not '0' (from the settings file)"
        );
        let err = resolve(&BTreeMap::new(), &env(&[("DELEGATE_HUB_STUDENT_CPUS", "1; rm")]), M).unwrap_err();
        assert!(err.to_string().contains("from the environment"), "{err}");
    }

    #[test]
    fn shell_lines_quote_everything() {
        let out = shell(&[("DELEGATE_X", "it's $(x)".into())]);
        assert_eq!(out, "DELEGATE_X='it'\\''s $(x)'\n");
    }

    #[test]
    fn the_repositorys_cluster_toml_is_the_example_and_parses_to_the_defaults() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../cluster.toml");
        let shipped = std::fs::read_to_string(path).unwrap();
        assert!(
            shipped == example(),
            "cluster.toml differs from `delegate-deploy settings --example` (regenerate it)"
        );
        let file = read_file(&shipped, "cluster.toml").unwrap();
        assert!(file.is_empty(), "the example sets nothing: {file:?}");
        resolve(&file, &BTreeMap::new(), M).unwrap();
    }

    #[test]
    fn docs_configuration_holds_the_settings_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
        let docs = std::fs::read_to_string(path).unwrap();
        let start = "<!-- settings table: delegate-deploy settings --markdown -->\n";
        let end = "<!-- end of settings table -->";
        let body = docs
            .split_once(start)
            .and_then(|(_, rest)| rest.split_once(end))
            .map(|(b, _)| b);
        assert!(
            body == Some(markdown().as_str()),
            "docs/configuration.md's settings table differs from `delegate-deploy settings --markdown`"
        );
    }
}

//! What a jobs file means: its YAML tree ([`super::yaml`]) read into
//! entries of [`SubmitRequest`]s, every problem collected with its line.
//!
//! ```yaml
//! defaults:                 # optional; applies to every job
//!   image: delegate-sandbox:latest
//!   time: 10m
//! jobs:
//!   - name: lr-0.1          # optional (job1, job2, ... otherwise); unique
//!     python: train:main    # train.py beside the jobs file, function main
//!     args: [0.1]
//!     kwargs: {epochs: 3}
//!     cpus: 2
//!     mem: 2G
//!     count: 2              # copies; copy i gets DELEGATE_INDEX=i
//!     env: {SEED: "7"}
//!     files: [data, helpers.py]   # beside the jobs file; /job/data, /job/helpers.py
//!   - command: [sh, -c, "echo hello > /job/hello"]   # or one string, run by sh -c
//! ```
//! The top level may also be the list of jobs alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use delegate_protocol::units::{parse_duration, parse_size};
use delegate_protocol::Resources;

use super::yaml::{Node, Value};
use super::LineError;
use crate::SubmitRequest;

/// The most calls one jobs file may submit (counts summed), as `--count`.
pub const MAX_CALLS: u32 = 1000;
/// The bound of a Python job's module source (it travels as the payload).
pub const MAX_MODULE_BYTES: u64 = 1024 * 1024;

const JOB_KEYS: &[&str] = &[
    "name", "command", "python", "args", "kwargs", "image", "cpus", "gpus", "nodes", "mem", "time", "count", "env",
    "files",
];
const DEFAULT_KEYS: &[&str] = &["image", "cpus", "gpus", "nodes", "mem", "time", "env", "files"];

/// The program a Python job runs in the sandbox: loads the module from the
/// payload (`/job/payload`), calls the function with the JSON arguments and
/// prints its return value as one JSON line.
pub const PYTHON_BOOTSTRAP: &str = "\
import json, sys, types
name, function, args, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
module = types.ModuleType(name)
module.__file__ = name.replace('.', '/') + '.py'
sys.modules[name] = module
with open('/job/payload', 'rb') as f:
    exec(compile(f.read(), module.__file__, 'exec'), module.__dict__)
value = getattr(module, function)(*args, **kwargs)
if value is not None:
    print(json.dumps(value, default=repr))
";

/// One job of the file: its name, the line it starts on, and its calls
/// (`count` of them).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub name: String,
    pub line: usize,
    pub requests: Vec<SubmitRequest>,
}

/// Reads the tree into entries; `base` is the directory Python modules are
/// looked up in (the jobs file's own). All problems, not only the first.
pub fn entries(root: &Node, base: &Path) -> Result<Vec<Entry>, Vec<LineError>> {
    let mut errs = Errors::default();
    let (defaults, jobs) = match &root.value {
        Value::Seq(_) => (None, root),
        Value::Map(map) => {
            let mut jobs = None;
            let mut defaults = None;
            for (k, v) in map {
                match key(k) {
                    "jobs" => jobs = Some(v),
                    "defaults" => defaults = Some(v),
                    other => errs.at(
                        k,
                        format!("unknown key `{other}` at the top level (expected `jobs` and optionally `defaults`)"),
                    ),
                }
            }
            match jobs {
                Some(j) => (defaults, j),
                None => {
                    errs.at(root, "no `jobs` list".into());
                    return Err(errs.0);
                }
            }
        }
        Value::Scalar(_) => {
            errs.at(
                root,
                "a jobs file is a list of jobs, or a mapping with `jobs` (and `defaults`)".into(),
            );
            return Err(errs.0);
        }
    };
    let base_job = match defaults {
        Some(d) => read_fields(d, DEFAULT_KEYS, &Fields::default(), base, &mut errs),
        None => Fields::default(),
    };
    let Value::Seq(items) = &jobs.value else {
        errs.at(jobs, format!("`jobs` must be a list, not {}", jobs.kind()));
        return Err(errs.0);
    };
    if items.is_empty() {
        errs.at(jobs, "`jobs` is empty".into());
    }
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    let mut calls: u64 = 0;
    for (i, item) in items.iter().enumerate() {
        let f = read_fields(item, JOB_KEYS, &base_job, base, &mut errs);
        let name = f.name.clone().unwrap_or_else(|| format!("job{}", i + 1));
        if let Some(first) = names.insert(name.clone(), item.line) {
            errs.at(item, format!("a second job named `{name}` (the first is on line {first})"));
        }
        calls += u64::from(f.count);
        let Some(req) = f.request(item, &mut errs) else {
            continue;
        };
        let requests = req.copies(f.count);
        out.push(Entry { name, line: item.line, requests });
    }
    if calls > u64::from(MAX_CALLS) {
        errs.at(
            jobs,
            format!("{calls} calls in all (counts summed), more than the limit of {MAX_CALLS}"),
        );
    }
    if errs.0.is_empty() {
        Ok(out)
    } else {
        errs.0.sort_by_key(|e| e.line);
        Err(errs.0)
    }
}

#[derive(Default)]
struct Errors(Vec<LineError>);

impl Errors {
    fn at(&mut self, node: &Node, message: String) {
        self.0.push(LineError { line: node.line, message });
    }
}

fn key(k: &Node) -> &str {
    k.scalar().map_or("", |s| s.text.as_str())
}

/// The fields of a job (or of `defaults`) as read so far.
#[derive(Clone, Debug)]
struct Fields {
    name: Option<String>,
    task: Option<(usize, Task)>,
    args: Option<(usize, serde_json::Value)>,
    kwargs: Option<(usize, serde_json::Value)>,
    image: Option<String>,
    cpus: u32,
    gpus: u32,
    nodes: u32,
    mem_bytes: u64,
    time_limit_secs: u64,
    count: u32,
    env: Vec<(String, String)>,
    /// Shipped with each call (relative paths: beside the jobs file).
    files: Vec<PathBuf>,
    /// `command` or `python` was given but is wrong (already reported).
    task_error: bool,
}

#[derive(Clone, Debug)]
enum Task {
    Command(Vec<String>),
    Python {
        module: String,
        function: String,
        source: Vec<u8>,
    },
}

impl Default for Fields {
    fn default() -> Self {
        let r = Resources::default();
        Fields {
            name: None,
            task: None,
            args: None,
            kwargs: None,
            image: None,
            cpus: r.cpus,
            gpus: r.gpus,
            nodes: r.nodes,
            mem_bytes: r.mem_bytes,
            time_limit_secs: r.time_limit_secs,
            count: 1,
            env: Vec::new(),
            files: Vec::new(),
            task_error: false,
        }
    }
}

impl Fields {
    /// The request of one call, or None after recording why not.
    fn request(&self, item: &Node, errs: &mut Errors) -> Option<SubmitRequest> {
        let Some((_, task)) = &self.task else {
            if !self.task_error {
                errs.at(item, "the job has neither `command` nor `python`".into());
            }
            return None;
        };
        let mut req = match task {
            Task::Command(argv) => {
                for (what, v) in [("args", &self.args), ("kwargs", &self.kwargs)] {
                    if let Some((line, _)) = v {
                        errs.0.push(LineError {
                            line: *line,
                            message: format!(
                                "`{what}` is for `python` jobs; a command takes its arguments in `command`"
                            ),
                        });
                    }
                }
                SubmitRequest::command(argv.clone())
            }
            Task::Python { module, function, source } => {
                let args = self.args.as_ref().map_or(serde_json::json!([]), |a| a.1.clone());
                let kwargs = self.kwargs.as_ref().map_or(serde_json::json!({}), |a| a.1.clone());
                let mut r = SubmitRequest::command(vec![
                    "python3".into(),
                    "-c".into(),
                    PYTHON_BOOTSTRAP.into(),
                    module.clone(),
                    function.clone(),
                    args.to_string(),
                    kwargs.to_string(),
                ]);
                r.payload = Some(source.clone());
                r
            }
        };
        req.image = self.image.clone();
        req.resources = Resources {
            cpus: self.cpus,
            gpus: self.gpus,
            nodes: self.nodes,
            mem_bytes: self.mem_bytes,
            time_limit_secs: self.time_limit_secs,
            retries: 0,
        };
        req.env = self.env.clone();
        req.files = self.files.clone();
        Some(req)
    }
}

fn read_fields(node: &Node, allowed: &[&str], base_fields: &Fields, base: &Path, errs: &mut Errors) -> Fields {
    let mut f = base_fields.clone();
    let Value::Map(map) = &node.value else {
        errs.at(
            node,
            format!("a job must be a mapping (name:, command:, ...), not {}", node.kind()),
        );
        return f;
    };
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (k, v) in map {
        let name = key(k);
        if !allowed.contains(&name) {
            errs.at(k, format!("unknown key `{name}` (known: {})", allowed.join(", ")));
            continue;
        }
        if let Some(first) = seen.insert(name, k.line) {
            errs.at(k, format!("`{name}` given twice (first on line {first})"));
            continue;
        }
        let read = match name {
            "command" | "python" => read_task(&mut f, name, v, base, &seen),
            "name" | "args" | "kwargs" | "image" | "env" | "files" => read_call(&mut f, name, v, base),
            _ => read_resource(&mut f, name, v),
        };
        if let Err(what) = read {
            errs.at(v, format!("`{name}`: {what}"));
        }
    }
    f
}

/// `command` or `python`: what the job runs (one of them).
fn read_task(f: &mut Fields, name: &str, v: &Node, base: &Path, seen: &BTreeMap<&str, usize>) -> Result<(), String> {
    let other = if name == "command" { "python" } else { "command" };
    if f.task.is_some() && seen.contains_key(other) {
        return Err("a job has `command` or `python`, not both".into());
    }
    let task = if name == "command" {
        command(v).map(Task::Command)
    } else {
        python(v, base)
    };
    match task {
        Ok(t) => {
            f.task = Some((v.line, t));
            Ok(())
        }
        Err(m) => {
            f.task_error = true;
            Err(m)
        }
    }
}

/// The call's name, arguments, image, environment and shipped files.
fn read_call(f: &mut Fields, name: &str, v: &Node, base: &Path) -> Result<(), String> {
    match name {
        "name" => match plain_text(v) {
            Some(s) if valid_name(&s) => f.name = Some(s),
            _ => return Err("a name of 1 to 64 letters, digits, `.`, `_` or `-`".into()),
        },
        "args" => match json(v)? {
            j @ serde_json::Value::Array(_) => f.args = Some((v.line, j)),
            _ => return Err("a list of arguments".into()),
        },
        "kwargs" => match json(v)? {
            j @ serde_json::Value::Object(_) => f.kwargs = Some((v.line, j)),
            _ => return Err("a mapping of keyword arguments".into()),
        },
        "image" => match plain_text(v) {
            Some(s) if !s.is_empty() && s.len() <= 256 => f.image = Some(s),
            _ => return Err("an image name (1 to 256 characters)".into()),
        },
        "env" => {
            // A job's env adds to (and overrides) the defaults'.
            for (k, val) in env(v)? {
                f.env.retain(|(n, _)| n != &k);
                f.env.push((k, val));
            }
        }
        "files" => {
            // A job's files add to the defaults'.
            for p in files(v, base)? {
                if !f.files.contains(&p) {
                    f.files.push(p);
                }
            }
            crate::ship::shipped_names(&f.files).map_err(|e| e.to_string())?;
        }
        _ => {}
    }
    Ok(())
}

/// The call's resources: cpus, gpus, nodes, count, mem, time.
fn read_resource(f: &mut Fields, name: &str, v: &Node) -> Result<(), String> {
    let whole = |min: u64, max: u64| number(v, min, max).ok_or_else(|| format!("a whole number from {min} to {max}"));
    match name {
        "cpus" => f.cpus = whole(1, 1024)? as u32,
        "gpus" => f.gpus = whole(0, 64)? as u32,
        "nodes" => f.nodes = whole(1, u64::from(delegate_protocol::MAX_RANKS))? as u32,
        "count" => f.count = whole(1, u64::from(MAX_CALLS))? as u32,
        "mem" => match plain_text(v).map(|s| parse_size(&s)) {
            Some(Ok(b)) if b > 0 => f.mem_bytes = b,
            Some(Err(e)) => return Err(e.to_string()),
            _ => return Err("a size such as 512M or 2G".into()),
        },
        "time" => match plain_text(v).map(|s| parse_duration(&s)) {
            Some(Ok(s)) if s > 0 => f.time_limit_secs = s,
            Some(Err(e)) => return Err(e.to_string()),
            _ => return Err("a duration such as 30s, 10m or 1h".into()),
        },
        _ => {}
    }
    Ok(())
}

/// `files`: a list of paths (relative ones beside the jobs file), each of
/// which exists.
fn files(v: &Node, base: &Path) -> Result<Vec<PathBuf>, String> {
    let Value::Seq(items) = &v.value else {
        return Err("a list of files or directories to ship (beside the jobs file)".into());
    };
    items
        .iter()
        .map(|i| {
            let text = i.scalar().map(|s| s.text.as_str()).filter(|t| !t.is_empty());
            let text = text.ok_or_else(|| "each element is a path".to_owned())?;
            let path = base.join(text);
            std::fs::metadata(&path)
                .map(|_| path.clone())
                .map_err(|e| format!("cannot ship {}: {e}", path.display()))
        })
        .collect()
}

fn valid_name(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A scalar's text (numbers included, as written).
fn plain_text(v: &Node) -> Option<String> {
    v.scalar().map(|s| s.text.clone())
}

fn number(v: &Node, min: u64, max: u64) -> Option<u64> {
    let s = v.scalar()?;
    let n: u64 = s.text.parse().ok()?;
    (min..=max).contains(&n).then_some(n)
}

/// `command`: a list of strings (argv, no shell) or one string (run by `sh -c`).
fn command(v: &Node) -> Result<Vec<String>, String> {
    match &v.value {
        Value::Scalar(s) if !s.text.trim().is_empty() => Ok(vec!["sh".into(), "-c".into(), s.text.clone()]),
        Value::Seq(items) if !items.is_empty() => items
            .iter()
            .map(|i| i.scalar().map(|s| s.text.clone()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| "each element of the command must be a single value".into()),
        _ => Err("a list (program and arguments) or one string (run by sh -c), not empty".into()),
    }
}

/// `python: module:function`: the module's source, from `<module path>.py`
/// beside the jobs file.
fn python(v: &Node, base: &Path) -> Result<Task, String> {
    let text = v.scalar().map(|s| s.text.as_str()).unwrap_or("");
    let Some((module, function)) = text.split_once(':') else {
        return Err(format!("`{text}` is not `module:function`"));
    };
    let ident = |s: &str| {
        !s.is_empty()
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if !module.split('.').all(ident) || !ident(function) {
        return Err(format!(
            "`{text}` is not `module:function` (Python names, module parts joined by `.`)"
        ));
    }
    let path: PathBuf = base.join(module.replace('.', "/") + ".py");
    let source = read_module(&path)?;
    Ok(Task::Python {
        module: module.into(),
        function: function.into(),
        source,
    })
}

fn read_module(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mut source = Vec::new();
    file.take(MAX_MODULE_BYTES + 1)
        .read_to_end(&mut source)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if source.len() as u64 > MAX_MODULE_BYTES {
        return Err(format!("{} is larger than {MAX_MODULE_BYTES} bytes", path.display()));
    }
    Ok(source)
}

fn env(v: &Node) -> Result<Vec<(String, String)>, String> {
    let Value::Map(map) = &v.value else {
        return Err("a mapping of NAME: value".into());
    };
    let mut out = Vec::new();
    for (k, val) in map {
        let name = key(k);
        let ok = name.starts_with(|c: char| c.is_ascii_uppercase() || c == '_')
            && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !ok {
            return Err(format!("`{name}` (line {}) is not a variable name [A-Z_][A-Z0-9_]*", k.line));
        }
        match val.scalar() {
            Some(s) => out.push((name.to_owned(), s.text.clone())),
            None => return Err(format!("the value of `{name}` (line {}) must be a single value", val.line)),
        }
    }
    Ok(out)
}

/// A YAML value as JSON: plain scalars follow YAML's core schema (null,
/// booleans, integers, floats), quoted ones are strings.
fn json(v: &Node) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    Ok(match &v.value {
        Value::Scalar(s) if !s.plain => J::String(s.text.clone()),
        Value::Scalar(_) if v.is_null() => J::Null,
        Value::Scalar(s) => match s.text.as_str() {
            "true" | "True" | "TRUE" => J::Bool(true),
            "false" | "False" | "FALSE" => J::Bool(false),
            t => {
                if let Ok(i) = t.parse::<i64>() {
                    J::from(i)
                } else if let Some(f) = t.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
                    J::Number(f)
                } else {
                    J::String(t.to_owned())
                }
            }
        },
        Value::Seq(items) => J::Array(items.iter().map(json).collect::<Result<_, _>>()?),
        Value::Map(map) => {
            let mut o = serde_json::Map::new();
            for (k, val) in map {
                o.insert(key(k).to_owned(), json(val)?);
            }
            J::Object(o)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::yaml::parse;
    use super::*;

    fn read(doc: &str, base: &Path) -> Result<Vec<Entry>, Vec<LineError>> {
        entries(&parse(doc).unwrap().unwrap(), base)
    }

    #[test]
    fn a_full_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train.py"), "def main(lr, epochs=1):\n    return lr * epochs\n").unwrap();
        let doc = "\
defaults:
  time: 5m
  env: {A: one}
jobs:
  - name: py
    python: train:main
    args: [0.5]
    kwargs: {epochs: 3, tag: \"7\"}
    count: 2
    env: {B: two}
  - command: echo hi > /job/out
    cpus: 2
    mem: 512M
  - command: [true]
";
        let e = read(doc, dir.path()).unwrap();
        assert_eq!(
            e.iter().map(|e| (e.name.as_str(), e.line)).collect::<Vec<_>>(),
            vec![("py", 5), ("job2", 11), ("job3", 14)]
        );
        let py = &e[0].requests;
        assert_eq!(py.len(), 2);
        let delegate_protocol::Task::Command { argv } = &py[1].task else {
            panic!()
        };
        assert_eq!(&argv[3..], ["train", "main", "[0.5]", r#"{"epochs":3,"tag":"7"}"#]);
        assert_eq!(
            py[1].payload.as_deref(),
            Some(&b"def main(lr, epochs=1):\n    return lr * epochs\n"[..])
        );
        assert_eq!(py[1].resources.time_limit_secs, 300);
        assert_eq!(
            py[1].env,
            vec![
                ("A".into(), "one".into()),
                ("B".into(), "two".into()),
                ("DELEGATE_INDEX".into(), "1".into())
            ]
        );
        let sh = &e[1].requests[0];
        assert_eq!((sh.resources.cpus, sh.resources.mem_bytes), (2, 512 << 20));
        let delegate_protocol::Task::Command { argv } = &sh.task else {
            panic!()
        };
        assert_eq!(argv, &["sh", "-c", "echo hi > /job/out"]);
    }

    #[test]
    fn files_beside_the_jobs_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train.py"), "print(1)\n").unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let doc = "defaults:\n  files: [data]\njobs:\n  - command: [python3, /job/train.py]\n    files: [train.py]\n";
        let e = read(doc, dir.path()).unwrap();
        assert_eq!(
            e[0].requests[0].files,
            vec![dir.path().join("data"), dir.path().join("train.py")]
        );
        let errs = read("jobs:\n  - command: [true]\n    files: [nothere]\n", dir.path()).unwrap_err();
        assert!(errs[0].line == 3 && errs[0].message.contains("cannot ship"), "{errs:?}");
        std::fs::write(dir.path().join("spec"), "").unwrap();
        let errs = read("jobs:\n  - command: [true]\n    files: [spec]\n", dir.path()).unwrap_err();
        assert!(errs[0].message.contains("delegate's own files"), "{errs:?}");
    }

    #[test]
    fn every_error_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let doc = "\
jobs:
  - name: a
    command: [true]
    cpus: 0
  - name: a
    python: missing:main
  - command: x
    colour: red
    mem: lots
  - args: [1]
  - python: not a name
  - command: [true]
    args: [1]
";
        let errs = read(doc, dir.path()).unwrap_err();
        let lines: Vec<usize> = errs.iter().map(|e| e.line).collect();
        let text = errs
            .iter()
            .map(|e| format!("{}: {}", e.line, e.message))
            .collect::<Vec<_>>()
            .join("\n");
        for want in [4, 5, 6, 8, 9, 10, 11, 13] {
            assert!(lines.contains(&want), "no error on line {want}:\n{text}");
        }
        assert!(text.contains("cpus"), "{text}");
        assert!(text.contains("second job named `a`"), "{text}");
        assert!(text.contains("missing.py"), "{text}");
        assert!(text.contains("unknown key `colour`"), "{text}");
        assert!(text.contains("neither `command` nor `python`"), "{text}");
    }

    #[test]
    fn nodes_key() {
        let dir = tempfile::tempdir().unwrap();
        let e = read(
            "defaults: {nodes: 2}\njobs:\n  - command: [true]\n  - command: [true]\n    nodes: 1\n",
            dir.path(),
        )
        .unwrap();
        assert_eq!(e[0].requests[0].resources.nodes, 2);
        assert_eq!(e[1].requests[0].resources.nodes, 1);
        let errs = read("- command: [true]\n  nodes: 0\n", dir.path()).unwrap_err();
        assert!(errs[0].message.contains("from 1 to 256"), "{errs:?}");
    }

    #[test]
    fn bare_list_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read("- command: [true]\n", dir.path()).unwrap().len(), 1);
        let errs = read("- command: [true]\n  count: 600\n- command: [true]\n  count: 600\n", dir.path()).unwrap_err();
        assert!(errs[0].message.contains("1200 calls"), "{errs:?}");
        let errs = read("jobs: []\n", dir.path()).unwrap_err();
        assert!(errs[0].message.contains("empty"), "{errs:?}");
        let errs = read("- command: [true]\n  env: {lower: x}\n", dir.path()).unwrap_err();
        assert!(errs[0].message.contains("not a variable name"), "{errs:?}");
    }

    #[test]
    fn json_follows_the_core_schema() {
        let n = parse("[1, -2, 0.5, true, null, \"3\", abc, {k: [x]}]").unwrap().unwrap();
        assert_eq!(
            json(&n).unwrap(),
            serde_json::json!([1, -2, 0.5, true, null, "3", "abc", {"k": ["x"]}])
        );
    }

    #[test]
    fn module_size_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.py"), vec![b'#'; MAX_MODULE_BYTES as usize + 1]).unwrap();
        let errs = read("- python: big:main\n", dir.path()).unwrap_err();
        assert!(errs[0].message.contains("larger than"), "{errs:?}");
    }
}

//! `delegate status`, `delegate result` and `delegate tensorboard`: what
//! is known about jobs, and where to see their event files.

use std::path::Path;

use delegate_client::{Client, JobStatus};
use delegate_protocol::State;

use super::{client, parse_id, parse_ids};
use crate::cli::Cli;
use crate::fail::{CliResult, Fail};
use crate::output::{print_json, print_named_statuses, print_result, print_statuses};

/// `delegate status [IDS]`: the given jobs, or all of them; `-f FILE`: the
/// calls of a jobs file's last submission, with the jobs' names.
pub fn status(cli: &Cli, ids: &[String], file: Option<&Path>) -> CliResult {
    let c = client(&cli.root)?;
    if let Some(f) = file {
        let rec = c.jobs_file_record(f)?;
        let st = in_words(&c, c.status(&rec.ids())?);
        print_named_statuses(&rec, &st, cli.json)?;
        return Ok(0);
    }
    let st = in_words(
        &c,
        if ids.is_empty() {
            c.list()?
        } else {
            c.status(&parse_ids(ids)?)?
        },
    );
    print_statuses(&st, cli.json)?;
    Ok(0)
}

/// A Python call that completed by raising says so in its reason (`the
/// call raised ZeroDivisionError`): its job completed, the call did not.
fn in_words(c: &Client, mut st: Vec<JobStatus>) -> Vec<JobStatus> {
    for s in st.iter_mut().filter(|s| s.state == State::Completed) {
        let words = c.outcome_words(s);
        if words.starts_with("raised ") {
            s.reason = format!("the call {words}");
        }
    }
    st
}

/// `delegate result ID`: how a job ended.
pub fn result(cli: &Cli, id: &str) -> CliResult {
    let c = client(&cli.root)?;
    let id = parse_id(id)?;
    let st = in_words(&c, c.status(std::slice::from_ref(&id))?);
    let Some(s) = st.first() else {
        return Err(Fail::new(format!("no status for job {id}"), 1));
    };
    // A fingerprint that does not decode (written by another version, or
    // by the call itself) does not hide the result.
    let fingerprint = c.fingerprint(&id).unwrap_or_else(|e| {
        eprintln!("delegate: the machine's fingerprint cannot be read: {e}");
        None
    });
    // The --repeat figures: the call's own file, JSON (shown only when it
    // parses; its summary line without control characters).
    let repeats: Option<serde_json::Value> =
        c.read_repeats(&id).ok().flatten().and_then(|b| serde_json::from_slice(&b).ok());
    if cli.json {
        let mut v = serde_json::to_value(s)?;
        if let Some(obj) = v.as_object_mut() {
            obj.insert("fingerprint".into(), serde_json::to_value(&fingerprint)?);
            obj.insert("repeats".into(), repeats.unwrap_or(serde_json::Value::Null));
        }
        print_json(&v)?;
    } else {
        print_result(s);
        if let Some(line) = repeats.as_ref().and_then(|r| r["summary"].as_str()) {
            let clean: String = line.chars().filter(|c| !c.is_control()).take(400).collect();
            println!("repeats:   {}", clean.trim_start_matches("delegate: "));
        }
        for line in fingerprint.iter().flat_map(crate::machine::lines) {
            println!("{line}");
        }
    }
    Ok(0)
}

/// `delegate tensorboard ID`: the address of the job's board on the hub.
pub fn tensorboard(cli: &Cli, id: &str) -> CliResult {
    use delegate_client::tensorboard::{url, SERVICE_PREFIX_ENV};
    let id = parse_id(id)?;
    // The board reads the job's directory as its server's student: one of
    // the caller's own, as the board itself checks it.
    client(&cli.root)?.own_job_dir(&id)?;
    let Some(prefix) = std::env::var(SERVICE_PREFIX_ENV).ok().filter(|p| p.starts_with('/')) else {
        return Err(Fail::new(
            format!(
                "a job's TensorBoard is served by your JupyterHub server, and this shell is not one of its \
                 terminals ({SERVICE_PREFIX_ENV} is not set): run `delegate tensorboard {id}` in JupyterHub"
            ),
            1,
        ));
    };
    if cli.json {
        print_json(&serde_json::json!({ "id": id.to_string(), "url": url(&prefix, &id) }))?;
    } else {
        println!(
            "TensorBoard of job {id}: {} (below your JupyterHub's address)",
            url(&prefix, &id)
        );
    }
    Ok(0)
}

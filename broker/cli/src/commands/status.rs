//! `delegate status` and `delegate result`: what is known
//! about jobs.

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
    if cli.json {
        print_json(s)?;
    } else {
        print_result(s);
    }
    Ok(0)
}

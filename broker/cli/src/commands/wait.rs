//! `delegate wait`: wait until jobs are over; exit with the job's exit code.

use std::path::Path;
use std::time::Duration;

use delegate_client::{exit_status_for, JobStatus};
use delegate_protocol::units::format_duration;
use delegate_protocol::State;

use super::{client, parse_ids};
use crate::cli::Cli;
use crate::fail::{CliResult, Fail};
use crate::output::print_json;

/// `delegate wait IDS [--timeout T]`, or `-f FILE`: every call of a jobs
/// file's last submission.
pub fn wait(cli: &Cli, ids: &[String], file: Option<&Path>, timeout: Option<u64>) -> CliResult {
    let c = client(&cli.root)?;
    let ids = match file {
        Some(f) => c.jobs_file_record(f)?.ids(),
        None => parse_ids(ids)?,
    };
    let st = c.wait(&ids, timeout.map(Duration::from_secs))?;
    if cli.json {
        print_json(&st)?;
    }
    finish_wait(&st, timeout)
}

/// The exit code after waiting; explains jobs that did not run to an exit.
pub fn finish_wait(st: &[JobStatus], timeout: Option<u64>) -> CliResult {
    let open: Vec<String> = st.iter().filter(|s| !s.is_terminal()).map(|s| s.id.to_string()).collect();
    if !open.is_empty() {
        return Err(Fail::new(
            format!(
                "timed out after {} waiting for {}",
                format_duration(timeout.unwrap_or(0)),
                open.join(", ")
            ),
            124,
        ));
    }
    let mut code = 0u8;
    for s in st {
        let c = exit_status_for(s).unwrap_or(1).clamp(0, 255) as u8;
        // A job that ran to an exit speaks through its exit code; explain the rest.
        let ran_to_exit = s.exit_code.is_some() && !s.refused && matches!(s.state, State::Completed | State::Failed);
        if !ran_to_exit {
            eprintln!("delegate: job {} {}: {}", s.id, s.state, s.reason);
        }
        if code == 0 {
            code = c;
        }
    }
    Ok(code)
}

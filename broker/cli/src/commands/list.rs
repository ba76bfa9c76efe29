//! `delegate list`: the user's jobs, one line each: id, what it runs (the
//! command or the Python function), state, node, elapsed time, when it was
//! submitted, and the reason of a job that did not complete.

use std::io::{self, IsTerminal, Write};

use delegate_client::JobSummary;
use delegate_protocol::{now_ms, State};

use super::client;
use crate::cli::Cli;
use crate::fail::CliResult;
use crate::output::{print_json, secs};

/// `delegate list`: all jobs, oldest first.
pub fn list(cli: &Cli) -> CliResult {
    let c = client(&cli.root)?;
    let jobs = c.list_summaries(None, false)?;
    if cli.json {
        print_json(&jobs)?;
        return Ok(0);
    }
    let colour = io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let mut out = io::stdout().lock();
    let now = now_ms();
    let what_width = jobs.iter().map(|j| j.what.chars().count()).max().unwrap_or(0).clamp(8, 40);
    let state_width = jobs
        .iter()
        .map(|j| state_words(j).chars().count())
        .max()
        .unwrap_or(0)
        .clamp(9, 40);
    let _ = writeln!(
        out,
        "{:<24}  {:<w$}  {:<s$}  {:<12}  {:>8}  {:>9}  REASON",
        "ID",
        "FUNCTION/COMMAND",
        "STATE",
        "NODE",
        "ELAPSED",
        "SUBMITTED",
        w = what_width,
        s = state_width
    );
    for j in &jobs {
        let _ = writeln!(out, "{}", row(j, now, (what_width, state_width), colour).trim_end());
    }
    Ok(0)
}

/// The STATE column: the state in the user's words (`raised
/// ZeroDivisionError`), `cancelled` when the reason column says why.
fn state_words(j: &JobSummary) -> &str {
    if j.outcome.starts_with("raised ") {
        &j.outcome
    } else {
        j.status.state.as_str()
    }
}

/// One line of the table.
fn row(j: &JobSummary, now: u64, (what_width, state_width): (usize, usize), colour: bool) -> String {
    let s = &j.status;
    let what: String = if j.what.chars().count() > what_width {
        let mut w: String = j.what.chars().take(what_width.saturating_sub(1)).collect();
        w.push('…');
        w
    } else {
        j.what.clone()
    };
    let words = state_words(j);
    let state = format!("{words:<state_width$}");
    let state = if colour {
        let c = if words.starts_with("raised ") {
            ansi_colour(State::Failed)
        } else {
            ansi_colour(s.state)
        };
        format!("\x1b[{c}m{state}\x1b[0m")
    } else {
        state
    };
    let reason = if s.state == State::Completed {
        ""
    } else {
        s.reason.as_str()
    };
    format!(
        "{:<24}  {:<w$}  {}  {:<12}  {:>8}  {:>9}  {}",
        s.id,
        what,
        state,
        s.host.as_deref().filter(|h| !h.is_empty()).unwrap_or("-"),
        s.elapsed_secs.map_or("-".to_owned(), secs),
        s.submitted_ms.map_or("-".to_owned(), |t| ago(now, t)),
        reason,
        w = what_width
    )
}

/// The ANSI colour of a state (the same as `delegate.jobs()`'s table).
fn ansi_colour(s: State) -> &'static str {
    match s {
        State::Pending => "2",
        State::Running => "36",
        State::Completed => "32",
        State::Cancelled => "33",
        State::Failed | State::TimedOut | State::Lost => "31",
    }
}

/// How long ago, e.g. `12s ago`, `3m ago`, `2h ago`, `4d ago`.
fn ago(now: u64, then_ms: u64) -> String {
    let s = now.saturating_sub(then_ms) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3_599 => format!("{}m ago", s / 60),
        3_600..=86_399 => format!("{}h ago", s / 3_600),
        _ => format!("{}d ago", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delegate_client::JobStatus;
    use delegate_protocol::JobId;

    fn job(state: State, what: &str) -> JobSummary {
        JobSummary {
            status: JobStatus {
                id: JobId::new(),
                slurm_id: Some("12".into()),
                state,
                reason: "the function raised".into(),
                exit_code: Some(0),
                refused: false,
                oom_killed: false,
                host: Some("node1".into()),
                submitted_ms: Some(1_000_000),
                started_ms: Some(1_001_000),
                finished_ms: Some(1_003_000),
                elapsed_secs: Some(2.0),
            },
            what: what.into(),
            outcome: state.as_str().into(),
            cpu: None,
            machine: None,
        }
    }

    #[test]
    fn a_row_has_every_column() {
        let r = row(&job(State::Failed, "square()"), 1_000_000 + 125_000, (10, 9), false);
        for part in ["square()", "failed", "node1", "2.0s", "2m ago", "the function raised"] {
            assert!(r.contains(part), "{part:?} missing from {r:?}");
        }
        let r = row(
            &job(State::Completed, "echo 'a very long command line'"),
            1_000_000,
            (10, 9),
            true,
        );
        assert!(r.contains("echo 'a v…"), "{r}");
        assert!(r.contains("\x1b[32mcompleted"), "{r}");
        assert!(!r.contains("the function raised"), "no reason for a completed job: {r}");
        // A call that completed by raising: its words, in the failure colour.
        let mut raised = job(State::Completed, "divide()");
        raised.outcome = "raised ZeroDivisionError".into();
        let r = row(&raised, 1_000_000, (10, 24), true);
        assert!(r.contains("\x1b[31mraised ZeroDivisionError"), "{r}");
    }

    #[test]
    fn ago_units() {
        assert_eq!(ago(61_000, 0), "1m ago");
        assert_eq!(ago(5_000, 0), "5s ago");
        assert_eq!(ago(0, 5_000), "0s ago");
        assert_eq!(ago(7_200_000, 0), "2h ago");
        assert_eq!(ago(200_000_000, 0), "2d ago");
    }
}

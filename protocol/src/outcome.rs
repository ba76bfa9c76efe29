//! What the runner (or, for a job that never ran, the client) writes: the
//! [`Started`] record, the job's [`State`] and its [`Outcome`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::now_ms;

/// Written by the runner when the container has started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub host: String,
    pub started_ms: u64,
    pub container_id: String,
    /// How perf counters are reachable: "perfmon", "seccomp" or "off".
    pub perf_mode: String,
}

/// Lifecycle of a job. Terminal states carry a reason in the [`Outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum State {
    Pending,
    Running,
    Completed,
    Failed,
    TimedOut,
    Cancelled,
    /// Slurm says the job is gone and no outcome exists.
    Lost,
}

impl State {
    /// Every state, in the order of a job's life.
    pub const ALL: [State; 7] = [
        State::Pending,
        State::Running,
        State::Completed,
        State::Failed,
        State::TimedOut,
        State::Cancelled,
        State::Lost,
    ];

    /// The terminal states, in the order of [`State::ALL`].
    pub fn terminal() -> impl Iterator<Item = State> {
        State::ALL.into_iter().filter(|s| s.is_terminal())
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, State::Pending | State::Running)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Completed => "completed",
            State::Failed => "failed",
            State::TimedOut => "timed-out",
            State::Cancelled => "cancelled",
            State::Lost => "lost",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who wrote an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Writer {
    Runner,
    Client,
}

/// The end of a job, written once, atomically.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Always terminal.
    pub state: State,
    /// The main process's exit code, when it ran to an exit.
    pub exit_code: Option<i32>,
    /// Human-readable, one sentence.
    pub reason: String,
    /// The runner refused the job before creating any container.
    pub refused: bool,
    pub oom_killed: bool,
    pub started_ms: Option<u64>,
    pub finished_ms: u64,
    pub host: String,
    pub writer: Writer,
}

impl Outcome {
    /// An outcome of a job that did not run to an exit (no exit code, no
    /// start time), finished now.
    pub fn ended(state: State, reason: impl Into<String>, host: impl Into<String>, writer: Writer) -> Outcome {
        Outcome {
            state,
            exit_code: None,
            reason: reason.into(),
            refused: false,
            oom_killed: false,
            started_ms: None,
            finished_ms: now_ms(),
            host: host.into(),
            writer,
        }
    }
}

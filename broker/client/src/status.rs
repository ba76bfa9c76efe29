//! What is known about a job ([`JobStatus`]), which of its output streams
//! ([`Stream`]), and the exit status a command-line tool reports for it.

use delegate_protocol::{self as protocol, JobId, State};
use serde::Serialize;

fn serialize_state<S: serde::Serializer>(s: &State, ser: S) -> std::result::Result<S::Ok, S::Error> {
    ser.serialize_str(s.as_str())
}

/// What is known about a job, for humans and for `--json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobStatus {
    pub id: JobId,
    pub slurm_id: Option<String>,
    /// `pending`, `running`, `completed`, `failed`, `timed-out`, `cancelled`, `lost`.
    #[serde(serialize_with = "serialize_state")]
    pub state: State,
    /// One human-readable sentence.
    pub reason: String,
    pub exit_code: Option<i32>,
    pub refused: bool,
    pub oom_killed: bool,
    pub host: Option<String>,
    pub submitted_ms: Option<u64>,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    pub elapsed_secs: Option<f64>,
}

impl JobStatus {
    pub fn is_terminal(&self) -> bool {
        self.state.is_terminal()
    }
}

/// Which output stream of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn file_name(self) -> &'static str {
        match self {
            Stream::Stdout => protocol::STDOUT,
            Stream::Stderr => protocol::STDERR,
        }
    }
}

/// The exit status a CLI reports for a job: the job's own exit code when it
/// ran to an exit, 124 timed out, 130 cancelled, 125 any other failure, and
/// `None` while it is not over.
pub fn exit_status_for(s: &JobStatus) -> Option<i32> {
    let clamp = |c: i32| if (0..=255).contains(&c) { c } else { 125 };
    match s.state {
        State::Pending | State::Running => None,
        State::Completed => Some(s.exit_code.map(clamp).unwrap_or(0)),
        State::Failed => Some(match s.exit_code {
            Some(c) if c != 0 && !s.refused => clamp(c),
            _ => 125,
        }),
        State::TimedOut => Some(124),
        State::Cancelled => Some(130),
        State::Lost => Some(125),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(state: State, exit: Option<i32>, refused: bool) -> JobStatus {
        JobStatus {
            id: JobId::new(),
            slurm_id: None,
            state,
            reason: String::new(),
            exit_code: exit,
            refused,
            oom_killed: false,
            host: None,
            submitted_ms: None,
            started_ms: None,
            finished_ms: None,
            elapsed_secs: None,
        }
    }

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status_for(&st(State::Running, None, false)), None);
        assert_eq!(exit_status_for(&st(State::Completed, Some(0), false)), Some(0));
        assert_eq!(exit_status_for(&st(State::Completed, Some(3), false)), Some(3));
        assert_eq!(exit_status_for(&st(State::Failed, Some(3), false)), Some(3));
        assert_eq!(exit_status_for(&st(State::Failed, None, true)), Some(125));
        assert_eq!(exit_status_for(&st(State::Failed, Some(-1), false)), Some(125));
        assert_eq!(exit_status_for(&st(State::TimedOut, None, false)), Some(124));
        assert_eq!(exit_status_for(&st(State::Cancelled, Some(143), false)), Some(130));
        assert_eq!(exit_status_for(&st(State::Lost, None, false)), Some(125));
    }

    #[test]
    fn json_state_is_kebab_case() {
        let j = serde_json::to_value(st(State::TimedOut, None, false)).unwrap();
        assert_eq!(j["state"], "timed-out");
    }
}

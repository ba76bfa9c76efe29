//! The lines the runner leaves in Slurm's log of a job, the only channel it
//! has when it cannot (or may not) write an outcome: the client reads the
//! tail of that log for a job without an outcome and takes its refusal
//! reason from the last line that starts with [`REFUSED_PREFIX`].
//!
//! When a job did not complete, the runner's last stderr line is one of
//! `delegate: refused: <reason>`, `delegate: <state>: <reason>` or
//! `delegate: error: <reason>`.

use crate::State;

/// The prefix of every line the runner writes about a job's end.
pub const LINE_PREFIX: &str = "delegate: ";
/// The line prefix with which the runner explains a refusal in Slurm's log.
pub const REFUSED_PREFIX: &str = "delegate: refused: ";

/// `s` on one line (line breaks become spaces), so that a reason stays one
/// log line.
pub fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// `delegate: refused: <reason>`.
pub fn refused_line(reason: &str) -> String {
    format!("{REFUSED_PREFIX}{}", one_line(reason))
}

/// `delegate: <state>: <reason>`, for a job that ended other than completed.
pub fn state_line(state: State, reason: &str) -> String {
    format!("{LINE_PREFIX}{state}: {}", one_line(reason))
}

/// `delegate: error: <message>`.
pub fn error_line(message: &str) -> String {
    format!("{LINE_PREFIX}error: {}", one_line(message))
}

/// The reason of a `delegate: lost: <reason>` line ([`state_line`]), if it
/// is one: the runner's own verdict (its retries spent), whose outcome
/// record a reader over a network home may not see yet.
pub fn parse_lost_line(line: &str) -> Option<&str> {
    line.strip_prefix(LINE_PREFIX)?.strip_prefix("lost: ")
}

/// The refusal reason of a line written by [`refused_line`], if it is one.
pub fn parse_refused_line(line: &str) -> Option<&str> {
    line.strip_prefix(REFUSED_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let l = refused_line("image \"x\"\nis not allowed");
        assert_eq!(l, "delegate: refused: image \"x\" is not allowed");
        assert_eq!(parse_refused_line(&l), Some("image \"x\" is not allowed"));
        assert_eq!(parse_refused_line("delegate: failed: x"), None);
        assert_eq!(state_line(State::TimedOut, "time limit"), "delegate: timed-out: time limit");
        assert_eq!(error_line("boom"), "delegate: error: boom");
        let lost = state_line(State::Lost, "its node was lost on every attempt");
        assert_eq!(parse_lost_line(&lost), Some("its node was lost on every attempt"));
        assert_eq!(parse_lost_line("delegate: failed: x"), None);
    }
}

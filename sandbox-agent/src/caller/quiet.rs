//! Log lines a user's actions cause, at most one a minute per user and
//! kind: a student who connects in a loop must not grow the agent's log
//! (security round 4, item 3). The line that is written says how many
//! were left out since the last one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often one user's line of one kind is written.
pub const EVERY: Duration = Duration::from_secs(60);
/// Users remembered at once (more: the table starts afresh).
const MAX_TRACKED: usize = 4096;

/// A user and a kind of line.
type Key = (u32, &'static str);

/// When each (user, kind) was last written, and how many were left out.
#[derive(Default)]
pub struct PerUserLogLimit {
    last: Mutex<HashMap<Key, (Instant, u64)>>,
}

impl PerUserLogLimit {
    /// `Some(left_out)` when a line of `kind` for `uid` may be written at
    /// `now` (and how many were left out before it), else `None`.
    pub fn due(&self, uid: u32, kind: &'static str, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.len() >= MAX_TRACKED {
            last.clear();
        }
        match last.get_mut(&(uid, kind)) {
            Some((at, skipped)) if now.duration_since(*at) < EVERY => {
                *skipped += 1;
                None
            }
            Some((at, skipped)) => {
                let n = *skipped;
                (*at, *skipped) = (now, 0);
                Some(n)
            }
            None => {
                last.insert((uid, kind), (now, 0));
                Some(0)
            }
        }
    }

    /// Writes `line` as a warning when due (see [`PerUserLogLimit::due`]).
    pub fn warn(&self, uid: u32, kind: &'static str, line: &str) {
        if let Some(n) = self.due(uid, kind, Instant::now()) {
            if n == 0 {
                tracing::warn!("{line} (logged once a minute per user)");
            } else {
                tracing::warn!("{line} (and {n} more like it in the last minute; logged once a minute per user)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_minute_per_user_and_kind_with_the_count_left_out() {
        let q = PerUserLogLimit::default();
        let t0 = Instant::now();
        assert_eq!(q.due(1000, "refused", t0), Some(0));
        for s in 1..30 {
            assert_eq!(q.due(1000, "refused", t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(q.due(1001, "refused", t0), Some(0), "another user");
        assert_eq!(q.due(1000, "closed", t0), Some(0), "another kind");
        assert_eq!(q.due(1000, "refused", t0 + EVERY), Some(29));
        assert_eq!(q.due(1000, "refused", t0 + EVERY), None);
    }
}

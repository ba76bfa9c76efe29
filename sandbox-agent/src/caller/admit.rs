//! Admission of connections to the agent's socket (0666: every local user
//! may connect, the checks decide). Each connection holds a descriptor of
//! the agent's, so one user holding thousands of idle connections would
//! leave none for anybody's job (security round 3, item 3): every user but
//! root gets at most [`PER_UID`] connections at once and all users
//! together [`TOTAL`]; a connection over the bound is closed at once, and
//! one that sends no request within [`IDLE`] is closed too. A user also
//! opens at most [`RATE_PER_SEC`] connections a second on average (a burst
//! of [`BURST`]): connecting, being served and closing in a loop costs the
//! agent work and log lines whatever the bound on open ones (security
//! round 4).
//!
//! A [`Ticket`] is held by the connection's socket itself
//! (crate::caller::conn::Socket): the place is given back when the descriptor is
//! closed, never earlier (round 4, item 1: it was given back when serving
//! ended while the reader task kept the socket open).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections one user may hold at once. A job needs one per call running
/// on this node (its node is exclusive), `delegate doctor` one more.
pub const PER_UID: usize = 16;
/// Connections of all users but root at once.
pub const TOTAL: usize = 1024;
/// How long a connection may wait before its next request while no call
/// of it runs (a shared allocation's runner sends the next call at once).
pub const IDLE: Duration = Duration::from_secs(delegate_protocol::agent::IDLE_SECS);
/// New connections one user may open per second, on average.
pub const RATE_PER_SEC: f64 = 5.0;
/// New connections one user may open at once before the rate applies.
pub const BURST: f64 = 32.0;
/// Users whose rate is remembered at once (a forgotten one starts afresh).
const MAX_TRACKED: usize = 4096;

/// Why a connection was not admitted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("uid {0} already holds {PER_UID} connections to the agent")]
    PerUid(u32),
    #[error("the agent already holds {TOTAL} connections")]
    Total,
    #[error("uid {0} opens connections to the agent faster than {RATE_PER_SEC} a second")]
    Rate(u32),
}

/// Open connections per uid (root not counted).
#[derive(Default)]
pub struct Admission {
    open: Mutex<HashMap<u32, usize>>,
    /// Per uid: the tokens left and when they were counted.
    rate: Mutex<HashMap<u32, (f64, Instant)>>,
}

/// One admitted connection; its place is given back when dropped.
pub struct Ticket {
    admission: Arc<Admission>,
    uid: u32,
}

impl Admission {
    /// Admits a connection of `uid`, or says why not.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Ticket, Refusal> {
        self.admit_at(uid, Instant::now())
    }

    /// [`Admission::admit`] at `now`. Every attempt counts against the
    /// user's rate, refused ones too.
    pub fn admit_at(self: &Arc<Self>, uid: u32, now: Instant) -> Result<Ticket, Refusal> {
        if uid != 0 && !self.take_token(uid, now) {
            return Err(Refusal::Rate(uid));
        }
        if uid != 0 {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            if open.values().sum::<usize>() >= TOTAL {
                return Err(Refusal::Total);
            }
            let n = open.entry(uid).or_default();
            if *n >= PER_UID {
                return Err(Refusal::PerUid(uid));
            }
            *n += 1;
        }
        Ok(Ticket { admission: self.clone(), uid })
    }

    /// One token of `uid`'s bucket, if it has one.
    fn take_token(&self, uid: u32, now: Instant) -> bool {
        let mut rate = self.rate.lock().unwrap_or_else(|p| p.into_inner());
        if rate.len() >= MAX_TRACKED && !rate.contains_key(&uid) {
            // Forget the users whose bucket is full again.
            rate.retain(|_, (tokens, at)| *tokens + now.duration_since(*at).as_secs_f64() * RATE_PER_SEC < BURST);
        }
        let (tokens, at) = rate.entry(uid).or_insert((BURST, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * RATE_PER_SEC).min(BURST);
        *at = now;
        if *tokens < 1.0 {
            return false;
        }
        *tokens -= 1.0;
        true
    }

    /// Connections `uid` holds now.
    #[cfg(test)]
    pub fn held(&self, uid: u32) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&uid).copied().unwrap_or(0)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.uid == 0 {
            return;
        }
        let mut open = self.admission.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_gets_at_most_per_uid_connections_and_gets_them_back() {
        let a = Arc::new(Admission::default());
        let held: Vec<Ticket> = (0..PER_UID).map(|_| a.admit(1000).expect("admitted")).collect();
        assert_eq!(a.admit(1000).err(), Some(Refusal::PerUid(1000)));
        a.admit(1001).expect("another user is not affected");
        assert_eq!(a.held(1000), PER_UID);
        drop(held);
        assert_eq!(a.held(1000), 0);
        a.admit(1000).expect("the places are given back");
    }

    #[test]
    fn all_users_together_get_at_most_total_and_root_is_not_counted() {
        let a = Arc::new(Admission::default());
        let held: Vec<Ticket> = (0..TOTAL)
            .map(|i| a.admit(2000 + (i / PER_UID) as u32).expect("admitted"))
            .collect();
        assert_eq!(a.admit(99_999).err(), Some(Refusal::Total));
        a.admit(0).expect("root is not counted");
        drop(held);
        a.admit(99_999).expect("the places are given back");
    }

    #[test]
    fn a_user_opens_at_most_the_burst_then_the_rate() {
        let a = Arc::new(Admission::default());
        let t0 = Instant::now();
        for i in 0..BURST as usize {
            a.admit_at(1000, t0)
                .unwrap_or_else(|e| panic!("connection {i} of the burst: {e}"));
        }
        assert_eq!(a.admit_at(1000, t0).err(), Some(Refusal::Rate(1000)));
        a.admit_at(1001, t0).expect("another user is not affected");
        a.admit_at(0, t0).expect("root is not counted");
        // A second later: RATE_PER_SEC more, not one more.
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..RATE_PER_SEC as usize {
            a.admit_at(1000, t1).expect("a second later: RATE_PER_SEC more");
        }
        assert_eq!(a.admit_at(1000, t1).err(), Some(Refusal::Rate(1000)));
        // A fifth of a second later: one more.
        let t2 = t1 + Duration::from_millis(200);
        a.admit_at(1000, t2).expect("a fifth of a second later: one more");
        assert_eq!(a.admit_at(1000, t2).err(), Some(Refusal::Rate(1000)));
        assert_eq!(a.held(1000), 0, "every ticket was dropped at once");
    }
}

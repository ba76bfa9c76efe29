//! Admission of connections to the agent's socket (0666: every local user
//! may connect, the checks decide). Each connection holds a descriptor of
//! the agent's, so one user holding thousands of idle connections would
//! leave none for anybody's job (security round 3, item 3): every user but
//! root gets at most [`PER_UID`] connections at once and all users
//! together [`TOTAL`]; a connection over the bound is closed at once, and
//! one that sends no request within [`IDLE`] is closed too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Connections one user may hold at once. A job needs one per call running
/// on this node (its node is exclusive), `delegate doctor` one more.
pub const PER_UID: usize = 16;
/// Connections of all users but root at once.
pub const TOTAL: usize = 1024;
/// How long a connection may wait before its next request while no call
/// of it runs (a shared allocation's runner sends the next call at once).
pub const IDLE: Duration = Duration::from_secs(delegate_protocol::agent::IDLE_SECS);

/// Why a connection was not admitted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("uid {0} already holds {PER_UID} connections to the agent")]
    PerUid(u32),
    #[error("the agent already holds {TOTAL} connections")]
    Total,
}

/// Open connections per uid (root not counted).
#[derive(Default)]
pub struct Admission {
    open: Mutex<HashMap<u32, usize>>,
}

/// One admitted connection; its place is given back when dropped.
pub struct Ticket {
    admission: Arc<Admission>,
    uid: u32,
}

impl Admission {
    /// Admits a connection of `uid`, or says why not.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Ticket, Refusal> {
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
        assert!(a.admit(1001).is_ok(), "another user is not affected");
        assert_eq!(a.held(1000), PER_UID);
        drop(held);
        assert_eq!(a.held(1000), 0);
        assert!(a.admit(1000).is_ok());
    }

    #[test]
    fn all_users_together_get_at_most_total_and_root_is_not_counted() {
        let a = Arc::new(Admission::default());
        let held: Vec<Ticket> = (0..TOTAL)
            .map(|i| a.admit(2000 + (i / PER_UID) as u32).expect("admitted"))
            .collect();
        assert_eq!(a.admit(99_999).err(), Some(Refusal::Total));
        assert!(a.admit(0).is_ok());
        drop(held);
        assert!(a.admit(99_999).is_ok());
    }
}

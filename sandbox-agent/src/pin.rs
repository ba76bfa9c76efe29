//! The agent's own threads moved off the sandbox's cores while a call
//! runs, back when it ends (the placement rule: `delegate_protocol::cpus`).

pub use delegate_protocol::cpus::allowed;
use delegate_protocol::cpus::set_all_threads;

/// The agent kept off the sandbox's cores until dropped.
pub struct OffCores {
    restore: Vec<usize>,
}

impl OffCores {
    /// Moves the agent's threads to `others` (nothing when empty).
    pub fn new(others: &[usize]) -> Option<OffCores> {
        if others.is_empty() {
            return None;
        }
        let restore = match allowed(0) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("cannot read the agent's CPU affinity ({e}); not moving it");
                return None;
            }
        };
        match set_all_threads(others) {
            Ok(()) => Some(OffCores { restore }),
            Err(e) => {
                tracing::warn!("cannot move the agent off the sandbox's cores: {e}");
                let _ = set_all_threads(&restore);
                None
            }
        }
    }
}

impl Drop for OffCores {
    fn drop(&mut self) {
        if let Err(e) = set_all_threads(&self.restore) {
            tracing::warn!("cannot restore the agent's CPU affinity: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_and_restores_every_thread() {
        let before = allowed(0).unwrap();
        assert!(!before.is_empty());
        let helper = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(300)));
        {
            let first = [before[0]];
            let off = OffCores::new(&first);
            if before.len() > 1 {
                assert!(off.is_some());
                assert_eq!(allowed(0).unwrap(), first.to_vec());
            }
        }
        assert_eq!(allowed(0).unwrap(), before);
        helper.join().unwrap();
        assert!(OffCores::new(&[]).is_none());
    }
}

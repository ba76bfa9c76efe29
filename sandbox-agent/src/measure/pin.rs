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

    /// A second thread of the process, alive until told: it reports its
    /// own affinity each time it is asked.
    fn helper_thread() -> (
        std::sync::mpsc::Sender<bool>,
        std::sync::mpsc::Receiver<Vec<usize>>,
        std::thread::JoinHandle<()>,
    ) {
        let (ask, asked) = std::sync::mpsc::channel::<bool>();
        let (tell, told) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            while let Ok(true) = asked.recv() {
                let _ = tell.send(allowed(0).expect("the helper's affinity"));
            }
        });
        (ask, told, handle)
    }

    #[test]
    fn moves_and_restores_every_thread() {
        let before = allowed(0).expect("this thread's affinity");
        assert!(!before.is_empty());
        let (ask, told, helper) = helper_thread();
        let helpers = |ask: &std::sync::mpsc::Sender<bool>| {
            ask.send(true).expect("the helper listens");
            told.recv().expect("the helper answers")
        };
        {
            let first = [before[0]];
            let off = OffCores::new(&first);
            if before.len() > 1 {
                assert!(off.is_some());
                assert_eq!(allowed(0).expect("affinity"), first.to_vec());
                assert_eq!(helpers(&ask), first.to_vec(), "the other thread was not moved");
            }
        }
        assert_eq!(allowed(0).expect("affinity"), before);
        assert_eq!(helpers(&ask), before, "the other thread was not restored");
        ask.send(false).expect("the helper listens");
        helper.join().expect("the helper ends");
        assert!(OffCores::new(&[]).is_none());
    }
}

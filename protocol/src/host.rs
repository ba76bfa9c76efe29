//! What both sides of a node say the same way: the machine's host name in
//! outcomes, and the sentence of a job directory replaced under a runner.

/// The host name as outcomes record it (`unknown` when it cannot be read).
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// The reason of a call whose job directory was swapped for another while
/// it was starting (the runner and the agent both check it).
pub const REPLACED: &str = "the job directory was replaced while the job was starting";

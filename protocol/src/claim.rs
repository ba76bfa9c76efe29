//! The claim of a call by the allocation that runs it.
//!
//! The calls of a map are not planned into allocations: each allocation of
//! the map (an element of one job array) goes through the map's calls in
//! order and runs the next one it can claim. A claim is the file
//! [`CLAIM`] in the call's directory, created with `O_CREAT | O_EXCL`:
//! exactly one creator succeeds, whichever machine it runs on. The kernel
//! NFS client (v3 and v4) and FUSE pass an exclusive create to the server,
//! which decides it; the client's attribute, entry and negative-lookup
//! caches play no part in it. A claim is never removed, so a claimer that
//! reads a stale directory (a claim not seen yet) only tries a create that
//! fails with `EEXIST` and goes on to the next call.
//!
//! The file says who claimed the call ([`Claim`]): the allocation's Slurm
//! id, its node and how many times Slurm had started it again when it
//! claimed (`SLURM_RESTART_COUNT`), one line, bounded. An allocation that
//! starts again after its node was lost finds the calls it claimed in an
//! earlier start without an outcome: those it runs again, each as a new
//! attempt in a fresh directory with a new claim
//! ([`crate::attempt`]).

use std::io::Write;
use std::os::fd::AsFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;

use crate::layout::CLAIM;
use crate::{ProtocolError, Result};

/// The bound of a claim file.
pub const MAX_CLAIM_BYTES: u64 = 256;

/// Who claimed a call: the Slurm id of the allocation (`123` or `123_4`),
/// the node it runs on, and its restart count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub allocation: String,
    pub node: String,
    /// How many times Slurm had queued the allocation again when it
    /// claimed the call (0 in a claim written before this field).
    pub restart: u32,
}

impl Claim {
    /// The file's text: `<allocation> <node> <restart>\n`.
    pub fn to_text(&self) -> String {
        format!("{} {} {}\n", self.allocation, self.node, self.restart)
    }

    /// Whether `self` (an allocation now) made `earlier` in an earlier
    /// start: a call it claimed then and was lost with it.
    pub fn made_before(&self, earlier: &Claim) -> bool {
        self.allocation == earlier.allocation && earlier.restart < self.restart
    }

    /// Parses a claim file; `None` for anything else (a claim is only
    /// shown, never trusted for a decision).
    pub fn parse(text: &str) -> Option<Claim> {
        let mut words = text.trim_end_matches('\n').split(' ');
        let (allocation, node) = (words.next()?, words.next()?);
        let restart = match words.next() {
            None => 0,
            Some(r) if r.len() <= 10 && !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()) => r.parse().ok()?,
            Some(_) => return None,
        };
        let id_ok = allocation.bytes().next().is_some_and(|b| b.is_ascii_digit())
            && allocation.bytes().all(|b| b.is_ascii_digit() || b == b'_')
            && allocation.len() <= 32;
        let node_ok = !node.is_empty()
            && node.len() <= 64
            && node.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        (words.next().is_none() && id_ok && node_ok).then(|| Claim {
            allocation: allocation.to_owned(),
            node: node.to_owned(),
            restart,
        })
    }
}

/// Claims the call whose directory is `dir` for `claim`: `Ok(true)` when
/// this caller made the claim, `Ok(false)` when the call was claimed
/// before (by anyone, this caller included).
pub fn claim_at(dir: impl AsFd, dir_path: &Path, claim: &Claim) -> Result<bool> {
    let path = dir_path.join(CLAIM).display().to_string();
    let fd = match openat(
        dir.as_fd(),
        CLAIM,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    ) {
        Ok(fd) => fd,
        Err(Errno::EEXIST) => return Ok(false),
        Err(e) => return Err(ProtocolError::io(path, e)),
    };
    // The claim is made whatever follows; what it says is for people
    // (an empty claim, its text not written, is a claim all the same).
    let _ = std::fs::File::from(fd).write_all(claim.to_text().as_bytes());
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsio::open_dir_nofollow;
    use proptest::prelude::*;
    use std::sync::{Arc, Barrier};

    fn claim(a: &str) -> Claim {
        Claim {
            allocation: a.into(),
            node: "worker1".into(),
            restart: 0,
        }
    }

    #[test]
    fn claim_files() {
        let c = Claim {
            allocation: "123_4".into(),
            node: "node-1.lab".into(),
            restart: 3,
        };
        assert_eq!(Claim::parse(&c.to_text()), Some(c.clone()));
        assert_eq!(
            Claim::parse("123_4 node-1.lab\n").map(|c| c.restart),
            Some(0),
            "a claim of before"
        );
        let now = Claim { restart: 4, ..c.clone() };
        assert!(now.made_before(&c) && !c.made_before(&now) && !c.made_before(&c));
        assert!(!Claim { allocation: "123_5".into(), ..now }.made_before(&c));
        for junk in [
            "",
            "\n",
            "123",
            "x worker1",
            "1 a b",
            "1 a/b",
            "1 ",
            " a",
            "1 a 2 3",
            "1 a -1",
        ] {
            assert_eq!(Claim::parse(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn a_call_is_claimed_once() {
        let t = tempfile::tempdir().unwrap();
        let fd = open_dir_nofollow(t.path()).unwrap();
        assert!(claim_at(&fd, t.path(), &claim("1")).unwrap());
        assert!(!claim_at(&fd, t.path(), &claim("2")).unwrap());
        let text = std::fs::read_to_string(t.path().join(CLAIM)).unwrap();
        assert_eq!(Claim::parse(&text), Some(claim("1")));
    }

    #[test]
    fn a_symlink_is_no_claim_and_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(t.path().join("elsewhere"), t.path().join(CLAIM)).unwrap();
        let fd = open_dir_nofollow(t.path()).unwrap();
        assert!(!claim_at(&fd, t.path(), &claim("1")).unwrap());
        assert!(!t.path().join("elsewhere").exists());
    }

    /// Claimers going through the same calls in order, each running what
    /// it claims (as the allocations of one map do).
    fn claimers(calls: usize, claimers: usize) -> Vec<Vec<usize>> {
        let t = tempfile::tempdir().unwrap();
        for i in 0..calls {
            std::fs::create_dir(t.path().join(i.to_string())).unwrap();
        }
        let root = Arc::new(t.path().to_path_buf());
        let start = Arc::new(Barrier::new(claimers));
        let threads: Vec<_> = (0..claimers)
            .map(|k| {
                let (root, start) = (root.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut won = Vec::new();
                    for i in 0..calls {
                        let dir = root.join(i.to_string());
                        let fd = open_dir_nofollow(&dir).unwrap();
                        if claim_at(&fd, &dir, &claim(&format!("9_{k}"))).unwrap() {
                            won.push(i);
                        }
                    }
                    won
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// However many claimers race, every call is claimed by exactly
        /// one of them, and each claimer's calls are in map order.
        #[test]
        fn concurrent_claimers_claim_every_call_once(calls in 1usize..60, n in 1usize..8) {
            let won = claimers(calls, n);
            let mut all: Vec<usize> = won.iter().flatten().copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..calls).collect::<Vec<_>>());
            for w in &won {
                prop_assert!(w.windows(2).all(|p| p[0] < p[1]));
            }
        }
    }
}

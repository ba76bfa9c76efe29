//! Where a call runs on its node's CPUs (issue 18, fidelity): on an
//! exclusive node the sandbox gets its own cores as a cpuset, instead of a
//! CFS quota that lets it wander over every core and be throttled in
//! periods, and the delegate processes that stay awake beside it (the
//! runner, the agent) keep to the other cores while it runs.
//!
//! Both sides apply the same rule to the CPUs the batch task may use (its
//! affinity, which Slurm sets from the allocation): the sandbox takes the
//! highest `cpus` of them, the rest is for everything else. With no core
//! left over (the call asks for every core) the sandbox takes them all and
//! nothing is moved; asking for more cores than allowed gets no placement
//! (the CFS quota of before).

/// The sandbox's cores and the others' (both sorted, disjoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub sandbox: Vec<usize>,
    pub others: Vec<usize>,
}

/// The placement of a call asking for `want` cores among `allowed`, or
/// `None` when it cannot have cores of its own.
pub fn place(allowed: &[usize], want: u32) -> Option<Placement> {
    let mut cpus = allowed.to_vec();
    cpus.sort_unstable();
    cpus.dedup();
    let want = usize::try_from(want).ok()?;
    if want == 0 || want > cpus.len() {
        return None;
    }
    let sandbox = cpus.split_off(cpus.len() - want);
    Some(Placement { sandbox, others: cpus })
}

/// The engine's cpuset syntax: `"1"`, `"2,3"`.
pub fn cpuset_list(cpus: &[usize]) -> String {
    cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// The CPUs `pid` may run on (its affinity; 0 = the calling thread).
pub fn allowed(pid: i32) -> Result<Vec<usize>, String> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let set =
        sched_getaffinity(nix::unistd::Pid::from_raw(pid)).map_err(|e| format!("sched_getaffinity({pid}): {e}"))?;
    Ok((0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect())
}

/// Sets the affinity of every thread of this process (threads started
/// later inherit it from the one that starts them).
pub fn set_all_threads(cpus: &[usize]) -> Result<(), String> {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| format!("cpu {c}: {e}"))?;
    }
    let tasks = std::fs::read_dir("/proc/self/task").map_err(|e| format!("/proc/self/task: {e}"))?;
    for t in tasks.flatten() {
        if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
            // A thread that ended meanwhile (ESRCH) is fine.
            let _ = sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_cores_for_the_sandbox() {
        let p = place(&[0, 1], 1).unwrap();
        assert_eq!((p.sandbox, p.others), (vec![1], vec![0]));
        let p = place(&[3, 0, 2, 1], 2).unwrap();
        assert_eq!((p.sandbox, p.others), (vec![2, 3], vec![0, 1]));
        // Every core: the sandbox has them all, nothing moves.
        let p = place(&[0, 1], 2).unwrap();
        assert_eq!((p.sandbox, p.others), (vec![0, 1], vec![]));
    }

    #[test]
    fn no_placement_beyond_the_allowed() {
        assert_eq!(place(&[0, 1], 3), None);
        assert_eq!(place(&[], 1), None);
        assert_eq!(place(&[0, 1], 0), None);
        assert_eq!(place(&[5, 5, 5], 2), None);
    }

    #[test]
    fn lists() {
        assert_eq!(cpuset_list(&[1]), "1");
        assert_eq!(cpuset_list(&[2, 3, 7]), "2,3,7");
    }
}

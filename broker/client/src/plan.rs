//! How the calls of one submission share exclusive allocations.

use crate::slurm::PartitionInfo;

/// Upper bound of one job array (Slurm's default MaxArraySize is 1001).
pub const MAX_ARRAY: usize = 1000;
/// Slurm time allowed per call of a shared allocation on top of the call's
/// own limit (container create, start, removal; output draining).
pub const SHARED_CALL_ALLOWANCE_SECS: u64 = 30;
/// The policy's default `max_allocation_time` (used when the site policy
/// cannot be read; the gate refuses longer shared allocations anyway).
pub const DEFAULT_MAX_ALLOCATION_SECS: u64 = 600;

/// How the calls of one submission share exclusive allocations: `None` for
/// one Slurm job per call, else the calls (indices) of each allocation, in
/// the order each runs them. Calls are dealt round-robin so a map's results
/// arrive roughly in order; there are at least as many allocations as the
/// partition has usable nodes (up to one per call), none holds more than
/// `per_allocation` calls, and each fits the partition's time limit with
/// [`SHARED_CALL_ALLOWANCE_SECS`] per call, and in the site's
/// `max_allocation_secs` (so that another user's call waits at most one
/// such allocation). Sharing only pays off when some allocation runs at
/// least two calls.
pub fn plan_allocations(
    calls: usize,
    per_allocation: u32,
    time_limit_secs: u64,
    partition: &PartitionInfo,
    max_allocation_secs: u64,
) -> Option<Vec<Vec<usize>>> {
    if calls < 2 || per_allocation < 2 {
        return None;
    }
    let per_call = time_limit_secs.saturating_add(SHARED_CALL_ALLOWANCE_SECS).max(1);
    // Slurm's limit is rounded up to minutes with one minute of slack.
    let partition_secs = partition.max_time_secs.map_or(u64::MAX, |max| max.saturating_sub(120));
    let fit_by_time = (partition_secs.min(max_allocation_secs) / per_call) as usize;
    let per = (per_allocation as usize).min(fit_by_time);
    if per < 2 {
        return None;
    }
    let k = calls
        .min(partition.nodes.max(1) as usize)
        .max(calls.div_ceil(per))
        .min(MAX_ARRAY);
    if k >= calls || calls.div_ceil(k) > per {
        return None;
    }
    let mut groups = vec![Vec::with_capacity(calls.div_ceil(k)); k];
    for i in 0..calls {
        groups[i % k].push(i);
    }
    Some(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_plans() {
        let part = |nodes, max: Option<u64>| PartitionInfo {
            name: "p".into(),
            nodes,
            max_time_secs: max,
        };
        const U: u64 = u64::MAX;
        // One node: everything in one allocation, in order.
        assert_eq!(plan_allocations(3, 100, 60, &part(1, Some(7200)), U), Some(vec![vec![0, 1, 2]]));
        // Two nodes: dealt round-robin.
        assert_eq!(
            plan_allocations(5, 100, 60, &part(2, None), U),
            Some(vec![vec![0, 2, 4], vec![1, 3]])
        );
        // At most per_allocation calls each.
        let g = plan_allocations(200, 64, 60, &part(1, None), U).unwrap();
        assert_eq!(g.len(), 4);
        assert!(g.iter().all(|g| g.len() <= 64));
        assert_eq!(g.iter().map(Vec::len).sum::<usize>(), 200);
        // The partition's time limit bounds the calls per allocation:
        // (2 h - 2 min) / (10 min + 30 s) = 11.
        let g = plan_allocations(30, 100, 600, &part(1, Some(7200)), U).unwrap();
        assert_eq!(g.len(), 3);
        assert!(g.iter().all(|g| g.len() <= 11));
        // Nothing to share: one call, one call per node, sharing off, or
        // calls too long for two to fit.
        assert_eq!(plan_allocations(1, 100, 60, &part(1, None), U), None);
        assert_eq!(plan_allocations(4, 100, 60, &part(4, None), U), None);
        assert_eq!(plan_allocations(4, 1, 60, &part(1, None), U), None);
        assert_eq!(plan_allocations(4, 100, 3600, &part(1, Some(7200)), U), None);
        // The site's bound on an allocation (security round 3, item 6):
        // 60 calls of 3 s with the default minute limit, 10 minutes each:
        // 600 / (60 + 30) = 6 calls per allocation, 10 allocations.
        let g = plan_allocations(60, 100, 60, &part(1, Some(7200)), 600).unwrap();
        assert_eq!(g.len(), 10);
        assert!(g.iter().all(|g| g.len() == 6));
        // Calls longer than half the bound: one allocation each.
        assert_eq!(plan_allocations(4, 100, 600, &part(1, None), 600), None);
    }
}

//! How the calls of one submission share exclusive allocations.

use crate::slurm::PartitionInfo;

/// Upper bound of one job array (Slurm's default MaxArraySize is 1001).
pub const MAX_ARRAY: usize = 1000;
/// Slurm time allowed per call of a shared allocation on top of the call's
/// own limit (container create, start, removal; output draining).
pub const SHARED_CALL_ALLOWANCE_SECS: u64 = 30;

/// How the calls of one submission share exclusive allocations: `None` for
/// one Slurm job per call, else the calls (indices) of each allocation, in
/// the order each runs them. Calls are dealt round-robin so a map's results
/// arrive roughly in order; there are at least as many allocations as the
/// partition has usable nodes (up to one per call), none holds more than
/// `per_allocation` calls, and each fits the partition's time limit with
/// [`SHARED_CALL_ALLOWANCE_SECS`] per call. Sharing only pays off when some
/// allocation runs at least two calls.
pub fn plan_allocations(
    calls: usize,
    per_allocation: u32,
    time_limit_secs: u64,
    partition: &PartitionInfo,
) -> Option<Vec<Vec<usize>>> {
    if calls < 2 || per_allocation < 2 {
        return None;
    }
    let per_call = time_limit_secs.saturating_add(SHARED_CALL_ALLOWANCE_SECS);
    // Slurm's limit is rounded up to minutes with one minute of slack.
    let fit_by_time = match partition.max_time_secs {
        Some(max) => (max.saturating_sub(120) / per_call.max(1)) as usize,
        None => usize::MAX,
    };
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
        // One node: everything in one allocation, in order.
        assert_eq!(plan_allocations(3, 100, 60, &part(1, Some(7200))), Some(vec![vec![0, 1, 2]]));
        // Two nodes: dealt round-robin.
        assert_eq!(
            plan_allocations(5, 100, 60, &part(2, None)),
            Some(vec![vec![0, 2, 4], vec![1, 3]])
        );
        // At most per_allocation calls each.
        let g = plan_allocations(200, 64, 60, &part(1, None)).unwrap();
        assert_eq!(g.len(), 4);
        assert!(g.iter().all(|g| g.len() <= 64));
        assert_eq!(g.iter().map(Vec::len).sum::<usize>(), 200);
        // The partition's time limit bounds the calls per allocation:
        // (2 h - 2 min) / (10 min + 30 s) = 11.
        let g = plan_allocations(30, 100, 600, &part(1, Some(7200))).unwrap();
        assert_eq!(g.len(), 3);
        assert!(g.iter().all(|g| g.len() <= 11));
        // Nothing to share: one call, one call per node, sharing off, or
        // calls too long for two to fit.
        assert_eq!(plan_allocations(1, 100, 60, &part(1, None)), None);
        assert_eq!(plan_allocations(4, 100, 60, &part(4, None)), None);
        assert_eq!(plan_allocations(4, 1, 60, &part(1, None)), None);
        assert_eq!(plan_allocations(4, 100, 3600, &part(1, Some(7200))), None);
    }
}

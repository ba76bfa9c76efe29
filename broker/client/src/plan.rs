//! How many allocations a map gets, and for how long.
//!
//! Calls are not planned into allocations: each allocation of a map claims
//! the next unclaimed call when it is free (`sandbox-runner pull`), so the
//! plan is only how many allocations the map's job array has and what
//! Slurm time limit each asks for.

use crate::slurm::PartitionInfo;

/// Upper bound of one job array (Slurm's default MaxArraySize is 1001).
pub const MAX_ARRAY: usize = 1000;
/// Slurm time allowed on top of a call's own limit for the call in
/// progress when an allocation reaches its bound (container create, start,
/// removal; output draining).
pub const SHARED_CALL_ALLOWANCE_SECS: u64 = delegate_protocol::policy::MAP_CALL_ALLOWANCE_SECS;
/// The policy's default `max_allocation_time` (used when the site policy
/// cannot be read; the agent refuses calls past the site's own anyway).
pub const DEFAULT_MAX_ALLOCATION_SECS: u64 = 600;

/// The allocations of a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapPlan {
    /// How many (the elements of one job array; 1: one job).
    pub allocations: usize,
    /// Slurm's limit of each: the site's bound on an allocation's age,
    /// after which it claims no call, plus one call's limit and
    /// [`SHARED_CALL_ALLOWANCE_SECS`] for the call in progress.
    pub time_limit_secs: u64,
}

/// The allocations of a map of `calls` calls of `time_limit_secs` each, or
/// `None` for one Slurm job per call: one allocation per usable node of the
/// partition (up to one per call: more could not run at once on exclusive
/// nodes; each runs calls until none is left, until it is as old as
/// `max_allocation_secs`, or until another user waits, then requeues
/// itself). `None` when sharing is off (`per_allocation` below 2), for a
/// single call, or when the partition's time limit is shorter than an
/// allocation's (the bound plus one call: a call started just before the
/// bound must not meet Slurm's limit).
pub fn plan_map(
    calls: usize,
    per_allocation: u32,
    time_limit_secs: u64,
    partition: &PartitionInfo,
    max_allocation_secs: u64,
) -> Option<MapPlan> {
    if calls < 2 || per_allocation < 2 {
        return None;
    }
    let per_call = time_limit_secs.saturating_add(SHARED_CALL_ALLOWANCE_SECS).max(1);
    // Slurm's limit is rounded up to minutes with one minute of slack.
    let partition_secs = partition.max_time_secs.map_or(u64::MAX, |max| max.saturating_sub(120));
    let limit = max_allocation_secs.saturating_add(per_call);
    if limit > partition_secs {
        return None;
    }
    let allocations = calls.min(partition.nodes.max(1) as usize).min(MAX_ARRAY);
    Some(MapPlan { allocations, time_limit_secs: limit })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_plans() {
        let part = |nodes, max: Option<u64>| PartitionInfo {
            name: "p".into(),
            nodes,
            max_time_secs: max,
        };
        const U: u64 = u64::MAX;
        // One allocation per node, up to one per call; whatever the calls'
        // limits, as long as two fit (issue 42: 5 minutes as 1).
        let plan = |calls, limit, p: &PartitionInfo| plan_map(calls, 100, limit, p, 600);
        assert_eq!(plan(200, 60, &part(2, None)).map(|p| p.allocations), Some(2));
        assert_eq!(plan(200, 300, &part(2, None)).map(|p| p.allocations), Some(2));
        assert_eq!(plan(3, 60, &part(12, None)).map(|p| p.allocations), Some(3));
        assert_eq!(plan(1000, 60, &part(0, None)).map(|p| p.allocations), Some(1));
        // The bound, plus the call in progress.
        assert_eq!(plan(200, 300, &part(2, None)).map(|p| p.time_limit_secs), Some(600 + 330));
        // The default limit (10 minutes) under the default bound: pulled.
        assert_eq!(plan(200, 600, &part(1, Some(7200))).map(|p| p.time_limit_secs), Some(1230));
        // Calls of an hour: the first may end past the bound, then the
        // allocation requeues itself; it still fits a 2-hour partition.
        assert_eq!(plan(4, 3600, &part(1, Some(7200))).map(|p| p.time_limit_secs), Some(4230));
        // A partition shorter than the bound plus a call: one job per call.
        assert_eq!(plan(200, 300, &part(2, Some(1000))), None);
        // Nothing to share: one call, or sharing off.
        assert_eq!(plan_map(1, 100, 60, &part(1, None), U), None);
        assert_eq!(plan_map(4, 1, 60, &part(1, None), U), None);
    }
}

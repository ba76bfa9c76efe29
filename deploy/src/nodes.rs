//! The stack's workers as Slurm names them: `worker1`, `worker[1-3]`, and
//! which of them elastic power saving may stop.

/// Slurm's name of workers `first..=last` ("" when `last < first`).
pub fn range(first: u64, last: u64) -> String {
    match last.cmp(&first) {
        std::cmp::Ordering::Less => String::new(),
        std::cmp::Ordering::Equal => format!("worker{first}"),
        std::cmp::Ordering::Greater => format!("worker[{first}-{last}]"),
    }
}

/// Elastic power saving: workers `1..=min` always run, the others up to
/// `max` are Slurm CLOUD nodes started when a job needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Elastic {
    pub min: u64,
    pub max: u64,
    /// Seconds without a job before a worker is stopped (SuspendTime).
    pub idle: u64,
    /// Seconds a started worker has to register (ResumeTimeout).
    pub resume_timeout: u64,
}

/// The workers of a stack: how many, and whether some are elastic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workers {
    pub count: u64,
    pub elastic: Option<Elastic>,
    /// On worker machines (placement): Slurm knows this many workers
    /// (at least `count`), each FUTURE until the slurmd of a machine
    /// `machine add` gave its number registers, so that adding a machine
    /// to a running course changes no configuration.
    pub slots: Option<u64>,
}

impl Workers {
    /// How many workers Slurm knows (and the stack has services for).
    pub fn declared(&self) -> u64 {
        self.slots.map_or(self.count, |s| s.max(self.count))
    }

    /// The partition's node list (every worker).
    pub fn all(&self) -> String {
        range(1, self.declared())
    }

    /// The always-running workers of an elastic stack ("" when none).
    pub fn always_on(&self) -> String {
        self.elastic.map(|e| range(1, e.min)).unwrap_or_default()
    }

    /// slurm.conf's NodeName lines, each with `hardware` (CPUs=, RealMemory=, Gres=).
    pub fn node_lines(&self, hardware: &str) -> Vec<String> {
        let Some(e) = self.elastic else {
            let state = if self.slots.is_some() { "FUTURE" } else { "UNKNOWN" };
            return vec![format!("NodeName={} {hardware} State={state}", self.all())];
        };
        let on = range(1, e.min);
        let off = range(e.min + 1, e.max);
        let mut lines = Vec::new();
        if !on.is_empty() {
            lines.push(format!("NodeName={on} {hardware} State=UNKNOWN"));
        }
        if !off.is_empty() {
            lines.push(format!("NodeName={off} {hardware} State=CLOUD"));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(range(1, 1), "worker1");
        assert_eq!(range(1, 3), "worker[1-3]");
        assert_eq!(range(2, 1), "");
    }

    #[test]
    fn elastic_workers_split_into_always_on_and_cloud() {
        let e = Elastic {
            min: 1,
            max: 3,
            idle: 600,
            resume_timeout: 180,
        };
        let w = Workers { count: 3, elastic: Some(e), slots: None };
        assert_eq!(
            w.node_lines("CPUs=2"),
            [
                "NodeName=worker1 CPUs=2 State=UNKNOWN",
                "NodeName=worker[2-3] CPUs=2 State=CLOUD"
            ]
        );
        assert_eq!(w.always_on(), "worker1");
        let none_on = Workers {
            count: 2,
            elastic: Some(Elastic { min: 0, ..e }),
            slots: None,
        };
        assert_eq!(none_on.node_lines("H"), ["NodeName=worker[1-3] H State=CLOUD"]);
        assert_eq!(none_on.always_on(), "");
        let fixed = Workers { count: 2, elastic: None, slots: None };
        assert_eq!(fixed.node_lines("H"), ["NodeName=worker[1-2] H State=UNKNOWN"]);
    }

    #[test]
    fn workers_on_machines_are_future_slots() {
        let w = Workers { count: 2, elastic: None, slots: Some(8) };
        assert_eq!(w.declared(), 8);
        assert_eq!(w.all(), "worker[1-8]");
        assert_eq!(w.node_lines("H"), ["NodeName=worker[1-8] H State=FUTURE"]);
        let more = Workers { slots: Some(1), ..w };
        assert_eq!(more.declared(), 2, "never fewer slots than workers");
    }
}

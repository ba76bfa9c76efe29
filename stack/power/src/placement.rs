//! Whether a swarm node can take a worker's task: the placement
//! constraints of the worker's service (`node.labels.K == V`,
//! `node.role != manager`, ...) read against a node, as swarm's own
//! scheduler would, for the forms the stack file writes and Docker
//! documents. A constraint of another form is not assumed met.

use std::collections::HashMap;

/// What the constraints are read against: one swarm node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub id: String,
    pub hostname: String,
    /// `manager` or `worker`.
    pub role: String,
    pub labels: HashMap<String, String>,
    /// Ready, and its availability `active`.
    pub usable: bool,
}

/// Whether `node` is usable and meets every one of `constraints`.
pub fn can_take(node: &NodeFacts, constraints: &[String]) -> bool {
    node.usable && constraints.iter().all(|c| meets(node, c) == Some(true))
}

/// Whether `node` meets one constraint; None for a form not understood.
fn meets(node: &NodeFacts, constraint: &str) -> Option<bool> {
    let (key, want, equal) = match (constraint.split_once("!="), constraint.split_once("==")) {
        (Some((k, v)), _) => (k.trim(), v.trim(), false),
        (None, Some((k, v))) => (k.trim(), v.trim(), true),
        (None, None) => return None,
    };
    let want = want.trim_matches('"');
    let have = match key {
        "node.id" => Some(node.id.as_str()),
        "node.hostname" => Some(node.hostname.as_str()),
        "node.role" => Some(node.role.as_str()),
        _ => match key.strip_prefix("node.labels.") {
            Some(label) => node.labels.get(label).map(String::as_str),
            None => return None,
        },
    };
    // (swarm: a missing label is unequal to every value)
    Some((have == Some(want)) == equal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)], usable: bool) -> NodeFacts {
        NodeFacts {
            id: "abc".into(),
            hostname: "m2".into(),
            role: "worker".into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            usable,
        }
    }

    #[test]
    fn the_stack_files_constraints_are_read_as_swarm_reads_them() {
        let n = node(&[("delegate.worker", "2")], true);
        let c = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(can_take(&n, &c(&["node.labels.delegate.worker == 2"])));
        assert!(can_take(&n, &c(&["node.labels.delegate.worker==2", "node.role != manager"])));
        assert!(can_take(&n, &c(&["node.hostname == \"m2\""])));
        assert!(can_take(&n, &[]));
        assert!(!can_take(&n, &c(&["node.labels.delegate.worker == 1"])));
        assert!(!can_take(&n, &c(&["node.labels.other == 2"])));
        assert!(can_take(&n, &c(&["node.labels.other != 2"])));
        assert!(!can_take(&n, &c(&["node.role == manager"])));
        // A form it does not know, or a node that is down or drained: no.
        assert!(!can_take(&n, &c(&["engine.labels.x == y"])));
        assert!(!can_take(&n, &c(&["node.platform.os ~ linux"])));
        assert!(!can_take(&node(&[("delegate.worker", "2")], false), &[]));
    }
}

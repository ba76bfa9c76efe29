//! The nodes as `sinfo` shows them to anyone, the one parser of its node
//! lines: state and power state, features (the hardware class each node's
//! agent publishes as `dlgclass_<id>`), the reason it is out, and the
//! agent's report in the node comment (see
//! [`delegate_protocol::node_class`]); and the choice of one class for the
//! calls of one experiment.

use std::collections::BTreeMap;

use delegate_protocol::node_class::{class_of_feature, NodeReport, FEATURE_PREFIX};
use serde::Serialize;

/// `sinfo --Node --noheader --Format=` of [`parse_nodes`]: the comment last
/// (it has spaces; the agent's report never holds `|`).
pub const SINFO_NODES_FORMAT: &str = "NodeList:|,Partition:|,StateLong:|,Features:|,Reason:|,Comment:|";
/// At most this many nodes are read.
const MAX_NODES: usize = 10_000;

/// One node of a partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeRow {
    pub name: String,
    /// The partition (`*` marks the default one).
    pub partition: String,
    pub state: String,
    /// Its hardware class id, if its agent published one.
    pub class: Option<String>,
    /// Why it is down or drained ("" when it is not).
    pub reason: String,
    /// Its agent's report, if any.
    pub report: Option<NodeReport>,
}

/// A node's power state (Slurm's power saving, elastic workers), from the
/// suffix of its long state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Power {
    /// Running (no power flag).
    Up,
    /// `~`: powered down, started on demand.
    Down,
    /// `#`: being started (POWERING_UP / configuring).
    PoweringUp,
    /// `%` or `!`: being stopped.
    PoweringDown,
}

impl NodeRow {
    /// Whether Slurm may start a job on it now or soon (a powered-down
    /// elastic node, `idle~`, counts: Slurm starts it for a job).
    pub fn usable(&self) -> bool {
        matches!(
            self.base_state().as_str(),
            "idle" | "mixed" | "allocated" | "completing" | "planned"
        )
    }

    /// Its power state.
    pub fn power(&self) -> Power {
        let s = self.state.to_ascii_lowercase();
        match s.chars().last() {
            Some('~') => Power::Down,
            Some('#') => Power::PoweringUp,
            Some('%' | '!') => Power::PoweringDown,
            _ if s.contains("powering_up") => Power::PoweringUp,
            _ if s.contains("powered_down") => Power::Down,
            _ if s.contains("powering_down") => Power::PoweringDown,
            _ => Power::Up,
        }
    }

    /// How many GPUs its agent reports (0: none, or no report).
    pub fn gpus(&self) -> u32 {
        self.report.as_ref().map_or(0, NodeReport::gpu_count)
    }

    /// Its state without the power and other flags (`idle`, `down`,
    /// `drained`, ...), lower case.
    pub fn base_state(&self) -> String {
        self.state
            .to_ascii_lowercase()
            .trim_end_matches(['~', '#', '%', '!', '*', '$', '@', '^', '-'])
            .to_owned()
    }
}

/// `sinfo` lines in [`SINFO_NODES_FORMAT`]; odd lines are skipped.
pub fn parse_nodes(text: &str) -> Vec<NodeRow> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(6, '|');
            let (name, partition, state, features) = (f.next()?, f.next()?, f.next()?, f.next()?);
            let reason = f.next().unwrap_or("").trim();
            let comment = f.next().unwrap_or("").trim_end_matches('|');
            if name.is_empty() || name.len() > 200 {
                return None;
            }
            Some(NodeRow {
                name: name.to_owned(),
                partition: partition.to_owned(),
                state: state.to_owned(),
                class: features.split(',').find_map(class_of_feature).map(str::to_owned),
                reason: if reason == "none" { "" } else { reason }.chars().take(200).collect(),
                report: NodeReport::parse(comment),
            })
        })
        .take(MAX_NODES)
        .collect()
}

/// Each node once (sinfo shows a node once per partition).
pub fn each_node_once(mut rows: Vec<NodeRow>) -> Vec<NodeRow> {
    let mut seen = std::collections::BTreeSet::new();
    rows.retain(|r| seen.insert(r.name.clone()));
    rows
}

/// The rows of `partition` (None: the default partition, marked `*`).
pub fn in_partition(rows: Vec<NodeRow>, partition: Option<&str>) -> Vec<NodeRow> {
    rows.into_iter()
        .filter(|r| match partition {
            Some(p) => r.partition.trim_end_matches('*') == p,
            None => r.partition.ends_with('*'),
        })
        .collect()
}

/// The rows of nodes with at least `gpus` GPUs (all of them for none).
pub fn with_gpus(rows: Vec<NodeRow>, gpus: u32) -> Vec<NodeRow> {
    rows.into_iter().filter(|r| gpus == 0 || r.gpus() >= gpus).collect()
}

/// The class the calls of one experiment keep to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassChoice {
    pub id: String,
    /// Its usable nodes.
    pub nodes: u32,
    /// How many classes the partition's usable nodes have.
    pub classes: usize,
}

impl ClassChoice {
    /// `sbatch --constraint=` for it.
    pub fn constraint(&self) -> String {
        format!("{FEATURE_PREFIX}{}", self.id)
    }
}

/// The usable nodes of each class.
fn class_sizes(rows: &[NodeRow]) -> BTreeMap<&str, u32> {
    let mut sizes: BTreeMap<&str, u32> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.usable()) {
        if let Some(c) = &r.class {
            *sizes.entry(c.as_str()).or_default() += 1;
        }
    }
    sizes
}

/// The class for the calls of one experiment when the partition's usable
/// nodes are of two classes or more: the one with the most nodes (ties:
/// the smaller id). None when they are of one class (or none published
/// one): nothing to choose, and a constraint would only keep out nodes that
/// have not published theirs yet.
pub fn choose_class(rows: &[NodeRow]) -> Option<ClassChoice> {
    let sizes = class_sizes(rows);
    if sizes.len() < 2 {
        return None;
    }
    let (id, nodes) = sizes
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(id, n)| ((*id).to_owned(), *n))?;
    Some(ClassChoice { id, nodes, classes: sizes.len() })
}

/// For a multi-node job of `nodes` nodes: the classes with that many
/// usable nodes, as `--constraint` (`[dlgclass_a|dlgclass_b]`, Slurm's
/// "all nodes of one of these", or the one class); None when the partition
/// has fewer than two classes, or no class has enough nodes (the job
/// would never start: it spans classes, and its fingerprints say so).
pub fn one_class_of_any(rows: &[NodeRow], nodes: u32) -> Option<String> {
    let sizes = class_sizes(rows);
    if sizes.len() < 2 {
        return None;
    }
    let list: Vec<String> = sizes
        .iter()
        .filter(|(_, n)| **n >= nodes)
        .map(|(id, _)| format!("{FEATURE_PREFIX}{id}"))
        .collect();
    match list.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        _ => Some(format!("[{}]", list.join("|"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SINFO: &str = "\
worker1|delegate*|idle|dlgclass_aaaaaaaaaa|none|delegate class=aaaaaaaaaa deployed=aaaaaaaaaa label=none governor=unknown boost=unknown perf=seccomp counters=software cpu=AMD EPYC 7B13|
worker2|delegate*|mixed|avx2,dlgclass_bbbbbbbbbb|none|delegate class=bbbbbbbbbb deployed=aaaaaaaaaa label=slow governor=unknown boost=unknown perf=seccomp counters=software cpu=AMD EPYC 7B13|
worker3|delegate*|idle~|dlgclass_bbbbbbbbbb|none||
worker4|delegate*|down*|dlgclass_aaaaaaaaaa|Not responding|(null)|
worker5|gpu|idle|(null)|none|rack 4|
worker5|delegate*|idle|(null)|none|rack 4|
garbage
";

    #[test]
    fn nodes_are_read_with_their_class_and_report() {
        let rows = parse_nodes(SINFO);
        assert_eq!(rows.len(), 6);
        assert_eq!(rows[1].class.as_deref(), Some("bbbbbbbbbb"));
        assert!(rows[1].report.as_ref().is_some_and(NodeReport::drifted));
        assert_eq!(rows[2].report, None);
        assert_eq!(rows[4].class, None);
        assert!(rows[2].usable() && !rows[3].usable());
        assert_eq!((rows[3].reason.as_str(), rows[0].reason.as_str()), ("Not responding", ""));
        assert_eq!((rows[2].power(), rows[2].base_state().as_str()), (Power::Down, "idle"));
        assert_eq!((rows[3].power(), rows[3].base_state().as_str()), (Power::Up, "down"));
        assert_eq!(in_partition(rows.clone(), None).len(), 5);
        assert_eq!(in_partition(rows.clone(), Some("gpu")).len(), 1);
        assert_eq!(each_node_once(rows).len(), 5);
    }

    #[test]
    fn the_class_with_most_usable_nodes_is_chosen() {
        let rows: Vec<NodeRow> = in_partition(parse_nodes(SINFO), None)
            .into_iter()
            .filter(|r| r.name != "worker5")
            .collect();
        // worker4 (class a) is down: b has 2 usable nodes, a 1.
        let c = choose_class(&rows).unwrap();
        assert_eq!((c.id.as_str(), c.nodes, c.classes), ("bbbbbbbbbb", 2, 2));
        assert_eq!(c.constraint(), "dlgclass_bbbbbbbbbb");
        assert_eq!(
            one_class_of_any(&rows, 1).as_deref(),
            Some("[dlgclass_aaaaaaaaaa|dlgclass_bbbbbbbbbb]")
        );
        // Only class b has two usable nodes; no class has three.
        assert_eq!(one_class_of_any(&rows, 2).as_deref(), Some("dlgclass_bbbbbbbbbb"));
        assert_eq!(one_class_of_any(&rows, 3), None);
    }

    #[test]
    fn calls_that_ask_for_gpus_keep_to_a_class_of_nodes_with_as_many() {
        let node = |n: &str, c: &str, gpus: &str| {
            format!("{n}|ml*|idle|dlgclass_{c}|none|delegate class={c} deployed={c} label=none governor=unknown boost=unknown perf=seccomp counters=software gpus={gpus} cpu=AMD EPYC|\n")
        };
        let text = [
            node("cpu1", "cccccccccc", "none"),
            node("cpu2", "cccccccccc", "none"),
            node("cpu3", "cccccccccc", "none"),
            node("h1", "dddddddddd", "2xNVIDIA_H100_80GB_HBM3"),
            node("h2", "dddddddddd", "2xNVIDIA_H100_80GB_HBM3"),
            node("a1", "aaaaaaaaaa", "1xNVIDIA_A100-SXM4-80GB"),
        ]
        .concat();
        let rows = parse_nodes(&text);
        assert_eq!(rows[3].gpus(), 2);
        // Without GPUs: the largest class, the CPU nodes.
        assert_eq!(choose_class(&with_gpus(rows.clone(), 0)).unwrap().id, "cccccccccc");
        // One GPU each: the H100s (2 nodes) over the one A100, never both.
        let c = choose_class(&with_gpus(rows.clone(), 1)).unwrap();
        assert_eq!((c.id.as_str(), c.nodes, c.classes), ("dddddddddd", 2, 2));
        // Two GPUs: only the H100 nodes have them, one class, nothing to choose.
        assert_eq!(with_gpus(rows.clone(), 2).len(), 2);
        assert_eq!(choose_class(&with_gpus(rows, 2)), None);
    }

    #[test]
    fn ties_go_to_the_smaller_id_and_one_class_is_no_choice() {
        let row = |n: &str, c: &str| NodeRow {
            name: n.into(),
            partition: "p*".into(),
            state: "idle".into(),
            class: Some(c.into()),
            reason: String::new(),
            report: None,
        };
        let rows = [row("a", "2222222222"), row("b", "1111111111")];
        assert_eq!(choose_class(&rows).unwrap().id, "1111111111");
        assert_eq!(choose_class(&rows[..1]), None);
        assert_eq!(one_class_of_any(&rows[..1], 1), None);
        let unknown = NodeRow { class: None, ..row("c", "") };
        assert_eq!(choose_class(&[row("a", "1111111111"), unknown]), None);
    }
}

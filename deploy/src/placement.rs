//! Which worker runs where, decided once here: from the swarm's machines
//! that `machine add` labelled `delegate.worker=N` (placement,
//! `DELEGATE_STACK_PLACEMENT=1`), the number a joining machine gets
//! ([`joining`]), the
//! workers the stack runs and the replicas of each worker service, and what
//! refuses or warns about a deploy. build_cluster.d/machines.sh and
//! stack.sh apply the answer (lines of [`Placement::lines`]).

use crate::slurm_conf::stack_workers;
use crate::{RenderError, Settings};

/// A machine of the swarm labelled a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub worker: u64,
    /// The swarm's node id.
    pub node: String,
    pub host: String,
}

/// The machines of `N NODE-ID HOSTNAME` lines (machines.sh's
/// `machine_workers`); a line whose N is not a worker number (1 to 999)
/// names no machine.
pub fn machines(text: &str) -> Vec<Machine> {
    let mut out: Vec<Machine> = text
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let worker = f.next()?.parse::<u64>().ok().filter(|n| (1..=999).contains(n))?;
            let node = f.next().unwrap_or("").to_owned();
            let host = f.next().unwrap_or("").to_owned();
            Some(Machine { worker, node, host })
        })
        .collect();
    out.sort_by_key(|m| m.worker);
    out
}

/// The lowest worker number no machine has.
pub fn next_worker(machines: &[Machine]) -> u64 {
    (1..).find(|n| machines.iter().all(|m| m.worker != *n)).unwrap_or(1)
}

/// The number a machine joining as `host` (the swarm's node `node`, empty
/// when it is in no swarm yet) gets: the one asked for (`--worker`), else
/// the one it has (a machine in this swarm keeps its number), else the
/// lowest free one; or why it cannot join, in one sentence. A number is
/// one machine's.
pub fn joining(machines: &[Machine], node: &str, host: &str, asked: Option<&str>) -> Result<u64, String> {
    let had = machines.iter().find(|m| !node.is_empty() && m.node == node).map(|m| m.worker);
    let n = match asked {
        Some(a) => worker_number(a).ok_or_else(|| format!("--worker must be a number from 1 to 999, not '{a}'"))?,
        None => had.unwrap_or_else(|| next_worker(machines)),
    };
    if let Some(had) = had.filter(|h| *h != n) {
        return Err(format!(
            "machine {host} is worker{had} already (./build_cluster.sh machine remove worker{had} first)"
        ));
    }
    match machines.iter().find(|m| m.worker == n && (node.is_empty() || m.node != node)) {
        Some(other) => Err(format!(
            "worker{n} is already the machine {}'s (./build_cluster.sh machine list)",
            other.host
        )),
        None => Ok(n),
    }
}

/// A worker number as written: 1 to 999, no sign, no leading zero.
fn worker_number(s: &str) -> Option<u64> {
    let ok = !s.is_empty() && s.len() <= 3 && !s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| s.parse().ok()).flatten()
}

/// What the stack runs, and what a deploy must be told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// How many workers Slurm knows (and the stack has services for).
    pub slots: u64,
    /// The numbers of the workers that run: with placement, those of the
    /// machines within the slots; else 1 to the workers' count.
    pub workers: Vec<u64>,
    /// The replicas of each worker service, slot by slot; `None` when the
    /// stack is elastic (the power service decides them as it runs).
    pub replicas: Option<Vec<u8>>,
    /// Why a deploy is refused, when it is.
    pub refuse: Option<String>,
    /// What a deploy warns about.
    pub warn: Vec<String>,
    /// Where each worker runs, for the deploy's log (placement only).
    pub log: Option<String>,
}

/// The placement of the settings' workers on `machines`.
pub fn place(s: &Settings, machines: &[Machine]) -> Result<Placement, RenderError> {
    let declared = stack_workers(s)?;
    let elastic = declared.elastic.is_some();
    let mut p = Placement {
        slots: declared.declared(),
        ..Placement::default()
    };
    if !s.flag("DELEGATE_STACK_PLACEMENT")? {
        p.workers = (1..=p.slots).collect();
        p.replicas = (!elastic).then(|| vec![1; p.workers.len()]);
        if !machines.is_empty() {
            // Without placement swarm would put any service on any
            // machine, where the manager's directories are not.
            p.refuse = Some("this swarm has worker machines (./build_cluster.sh machine list): deploy with placement (DELEGATE_STACK_PLACEMENT=1 in cluster.toml)".into());
        }
        return Ok(p);
    }
    if elastic {
        // (the power service starts and stops them; each has its machine)
        p.workers = (1..=p.slots).collect();
    } else {
        // The workers are the machines within the slots (those beyond the
        // settings' count too: added to the running course by `machine
        // add`).
        p.workers = machines.iter().map(|m| m.worker).filter(|n| *n <= p.slots).collect();
        p.replicas = Some((1..=p.slots).map(|n| u8::from(p.workers.contains(&n))).collect());
        beyond_the_slots(&mut p, machines);
    }
    every_worker_has_a_machine(&mut p, declared.count, machines);
    p.log = Some(where_each_runs(p.slots, p.workers.len() as u64, machines));
    Ok(p)
}

/// Refuses the deploy when a worker up to `count` has no machine.
fn every_worker_has_a_machine(p: &mut Placement, count: u64, machines: &[Machine]) {
    let missing: String = (1..=count)
        .filter(|n| machines.iter().all(|m| m.worker != *n))
        .map(|n| format!(" worker{n}"))
        .collect();
    if !missing.is_empty() {
        p.refuse = Some(format!(
            "placement: no machine for{missing}: ./build_cluster.sh machine add HOST (one per worker), or deploy --workers {}",
            machines.len()
        ));
    }
}

/// Warns of machines whose number has no slot (they run nothing).
fn beyond_the_slots(p: &mut Placement, machines: &[Machine]) {
    let beyond: String = machines
        .iter()
        .filter(|m| m.worker > p.slots)
        .map(|m| format!(" worker{} ({})", m.worker, m.host))
        .collect();
    if !beyond.is_empty() {
        p.warn
            .push(format!("placement: no slot for{beyond}: DELEGATE_STACK_SLOTS is {}", p.slots));
    }
}

/// The deploy's line: each worker's machine, and the slots that wait for one.
fn where_each_runs(slots: u64, running: u64, machines: &[Machine]) -> String {
    let on: Vec<String> = machines
        .iter()
        .filter(|m| m.worker <= slots)
        .map(|m| format!("worker{} on {}", m.worker, m.host))
        .collect();
    let waiting = if slots > running {
        format!("; Slurm knows worker1..{slots}, those without a machine wait for one (machine add)")
    } else {
        String::new()
    };
    format!("placement: {}{waiting}", on.join(", "))
}

impl Placement {
    /// Lines build_cluster.sh reads: `slots N`, `workers N...`,
    /// then `replicas R...` unless elastic, `refuse SENTENCE`, a
    /// `warn SENTENCE` each, `log SENTENCE`, when there are.
    pub fn lines(&self) -> String {
        let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
        let mut out = format!("slots {}\nworkers {}\n", self.slots, join(&self.workers));
        if let Some(r) = &self.replicas {
            let r: Vec<u64> = r.iter().map(|x| u64::from(*x)).collect();
            out.push_str(&format!("replicas {}\n", join(&r)));
        }
        for (key, line) in self
            .refuse
            .iter()
            .map(|l| ("refuse", l))
            .chain(self.warn.iter().map(|l| ("warn", l)))
            .chain(self.log.iter().map(|l| ("log", l)))
        {
            out.push_str(&format!("{key} {}\n", line.replace('\n', " ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema's defaults where the test sets nothing.
    fn settings(pairs: &[(&str, &str)]) -> Settings {
        let defaults = [
            ("DELEGATE_ELASTIC", "0"),
            ("DELEGATE_STACK_PLACEMENT", "0"),
            ("DELEGATE_STACK_WORKERS", "2"),
            ("DELEGATE_STACK_SLOTS", "16"),
        ];
        pairs.iter().fold(Settings::from_pairs(defaults), |s, (k, v)| s.with(k, v))
    }

    const TWO: &str = "1 n1 m1\n2 n2 m2\n";

    /// Settings with placement, `workers` workers and `slots` slots.
    fn placed(workers: &str, slots: &str) -> Settings {
        settings(&[
            ("DELEGATE_STACK_PLACEMENT", "1"),
            ("DELEGATE_STACK_WORKERS", workers),
            ("DELEGATE_STACK_SLOTS", slots),
        ])
    }

    #[test]
    fn machines_are_read_from_the_labels_and_sorted() {
        let m = machines("2 id2 host-b\n\n1 id1 host-a\nx id3 host-c\n0 id4 h\n1000 id5 h\n");
        assert_eq!(
            m,
            vec![
                Machine {
                    worker: 1,
                    node: "id1".into(),
                    host: "host-a".into()
                },
                Machine {
                    worker: 2,
                    node: "id2".into(),
                    host: "host-b".into()
                },
            ]
        );
    }

    #[test]
    fn a_joining_machine_gets_a_number_that_is_no_other_machines() {
        let two = machines("1 id1 m1\n2 id2 m2\n");
        assert_eq!(joining(&two, "", "root@m3", None), Ok(3));
        assert_eq!(joining(&two, "id2", "root@m2", None), Ok(2), "a machine keeps its number");
        assert_eq!(joining(&two, "id2", "root@m2", Some("2")), Ok(2));
        assert_eq!(joining(&two, "", "root@m3", Some("7")), Ok(7));
        assert_eq!(
            joining(&two, "id2", "root@m2", Some("5")),
            Err("machine root@m2 is worker2 already (./build_cluster.sh machine remove worker2 first)".into())
        );
        assert_eq!(
            joining(&two, "", "root@m3", Some("1")),
            Err("worker1 is already the machine m1's (./build_cluster.sh machine list)".into())
        );
        for bad in ["0", "01", "1000", "-1", "1e3", "", " 1", "x"] {
            assert_eq!(
                joining(&two, "", "h", Some(bad)),
                Err(format!("--worker must be a number from 1 to 999, not '{bad}'")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_next_machine_gets_the_lowest_free_number() {
        assert_eq!(next_worker(&[]), 1);
        assert_eq!(next_worker(&machines("1 a a\n3 c c\n")), 2);
        assert_eq!(next_worker(&machines(TWO)), 3);
    }

    #[test]
    fn without_placement_every_worker_runs_and_machines_refuse_the_deploy() {
        let s = settings(&[("DELEGATE_STACK_WORKERS", "3")]);
        let p = place(&s, &[]).unwrap();
        assert_eq!(
            (p.slots, p.workers.clone(), p.replicas.clone()),
            (3, vec![1, 2, 3], Some(vec![1, 1, 1]))
        );
        assert_eq!(p.refuse, None);
        let p = place(&s, &machines(TWO)).unwrap();
        assert!(p.refuse.unwrap().contains("deploy with placement"));
    }

    #[test]
    fn placement_runs_the_machines_within_the_slots() {
        let s = placed("2", "3");
        let p = place(&s, &machines("1 a m1\n2 b m2\n4 d m4\n")).unwrap();
        assert_eq!(p.slots, 3);
        assert_eq!(p.workers, vec![1, 2]);
        assert_eq!(p.replicas, Some(vec![1, 1, 0]));
        assert_eq!(p.refuse, None);
        assert_eq!(p.warn, vec!["placement: no slot for worker4 (m4): DELEGATE_STACK_SLOTS is 3"]);
        assert_eq!(
            p.log.as_deref(),
            Some("placement: worker1 on m1, worker2 on m2; Slurm knows worker1..3, those without a machine wait for one (machine add)")
        );
    }

    #[test]
    fn placement_refuses_a_worker_without_its_machine() {
        let s = placed("3", "3");
        let p = place(&s, &machines("2 b m2\n")).unwrap();
        assert_eq!(
            p.refuse.as_deref(),
            Some("placement: no machine for worker1 worker3: ./build_cluster.sh machine add HOST (one per worker), or deploy --workers 1")
        );
    }

    #[test]
    fn an_elastic_stack_knows_its_maximum_and_leaves_replicas_to_the_power_service() {
        let s = settings(&[
            ("DELEGATE_STACK_PLACEMENT", "1"),
            ("DELEGATE_ELASTIC", "1"),
            ("DELEGATE_ELASTIC_MIN", "1"),
            ("DELEGATE_ELASTIC_MAX", "2"),
            ("DELEGATE_ELASTIC_IDLE", "30"),
            ("DELEGATE_ELASTIC_RESUME_TIMEOUT", "120"),
        ]);
        let p = place(&s, &machines(TWO)).unwrap();
        assert_eq!((p.slots, p.workers.clone(), p.replicas.clone()), (2, vec![1, 2], None));
        assert_eq!(p.refuse, None);
        assert_eq!(p.log.as_deref(), Some("placement: worker1 on m1, worker2 on m2"));
        // (each worker the power service may start needs its machine)
        let p = place(&s, &machines("1 a m1\n")).unwrap();
        assert!(p.refuse.unwrap().contains("no machine for worker2"));
    }

    #[test]
    fn the_lines_say_each_decision_once() {
        let s = placed("2", "2");
        let text = place(&s, &machines(TWO)).unwrap().lines();
        assert_eq!(
            text,
            "slots 2\nworkers 1 2\nreplicas 1 1\nlog placement: worker1 on m1, worker2 on m2\n"
        );
    }

    #[test]
    fn a_count_out_of_the_schemas_bounds_is_refused() {
        let s = settings(&[("DELEGATE_STACK_WORKERS", "0")]);
        let err = place(&s, &[]).unwrap_err();
        assert!(err.to_string().contains("DELEGATE_STACK_WORKERS"), "{err}");
    }
}

//! The stack's user node, per student (run by docker/cluster-entrypoint.sh
//! in the user node's container at its start):
//!
//! - each student's own Slurm configuration: the node's slurm.conf with
//!   `AuthInfo` and `AccountingStoragePass` naming the student's own munged
//!   socket (a student holding silent connections to a shared munged would
//!   stop every Slurm command on the node; with one munged each they stop
//!   only their own);
//! - each student's limits on queries to Slurm (iptables rules, owner
//!   match): at most `rate` new connections per second after a burst to
//!   slurmctld's and slurmdbd's ports, at most `conns` open at once, none to
//!   the workers' slurmd. Slurm 22.05 has no per-user RPC limit of its own.

use std::fmt::Write as _;

use crate::RenderError;

/// slurm.conf for a student whose munged listens on `socket`: `base` with
/// its `AuthInfo`/`AccountingStoragePass` lines replaced by ones naming
/// `socket`, right after `AuthType=auth/munge`.
pub fn student_slurm_conf(base: &str, socket: &str) -> Result<String, RenderError> {
    if !crate::settings::is_safe_path(socket) {
        return Err(RenderError::Invalid(format!("{socket:?} is not a safe socket path")));
    }
    let mut out = String::with_capacity(base.len() + 200);
    let mut found = false;
    for line in base.lines() {
        if line.starts_with("AuthInfo=") || line.starts_with("AccountingStoragePass=") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if line == "AuthType=auth/munge" {
            found = true;
            let _ = writeln!(out, "AuthInfo=socket={socket}\nAccountingStoragePass={socket}");
        }
    }
    if !found {
        return Err(RenderError::Invalid("slurm.conf has no AuthType=auth/munge line".into()));
    }
    Ok(out)
}

/// The ports students' queries go to, from slurm.conf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmPorts {
    /// slurmctld's port or range (iptables form `6817:6820`) and slurmdbd's.
    pub queries: Vec<String>,
    /// slurmd's.
    pub slurmd: u16,
}

/// The last value of `key=` in slurm.conf.
fn last_value<'a>(conf: &'a str, key: &str) -> Option<&'a str> {
    conf.lines().rev().find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// The ports of slurm.conf (Slurm's defaults when it names none).
pub fn slurm_ports(conf: &str) -> Result<SlurmPorts, RenderError> {
    let port = |v: &str| -> Result<u16, RenderError> {
        v.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| RenderError::Invalid(format!("slurm.conf names port {v:?}")))
    };
    let ctld = last_value(conf, "SlurmctldPort").unwrap_or("6817");
    let ctld = match ctld.split_once('-') {
        Some((a, b)) => format!("{}:{}", port(a)?, port(b)?),
        None => port(ctld)?.to_string(),
    };
    let mut queries = vec![ctld];
    if let Some(dbd) = last_value(conf, "AccountingStoragePort") {
        queries.push(port(dbd)?.to_string());
    }
    Ok(SlurmPorts {
        queries,
        slurmd: port(last_value(conf, "SlurmdPort").unwrap_or("6818"))?,
    })
}

/// A student's query limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryLimits {
    /// New connections per second (0: no limit) after `burst`.
    pub rate: u32,
    pub burst: u32,
    /// Open connections at once (0: no limit).
    pub conns: u32,
}

/// The chain the rules go into (OUTPUT sends new connections to the
/// query ports and slurmd there).
pub const CHAIN: &str = "delegate-queries";

/// The iptables arguments of one student's rules (each a plain word list).
pub fn student_rules(uid: u32, ports: &SlurmPorts, l: QueryLimits) -> Vec<Vec<String>> {
    let w = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
    let mut rules = vec![w(&format!(
        "-A {CHAIN} -m owner --uid-owner {uid} -p tcp --dport {} -j REJECT --reject-with tcp-reset",
        ports.slurmd
    ))];
    if l.conns > 0 {
        rules.push(w(&format!(
            "-A {CHAIN} -m owner --uid-owner {uid} -p tcp -m connlimit --connlimit-above {} --connlimit-mask 0 -j REJECT --reject-with tcp-reset",
            l.conns
        )));
    }
    if l.rate > 0 {
        rules.push(w(&format!(
            "-A {CHAIN} -m owner --uid-owner {uid} -m hashlimit --hashlimit-name q{uid} --hashlimit-above {}/sec --hashlimit-burst {} -j DROP",
            l.rate,
            l.burst.max(1)
        )));
    }
    rules
}

/// For the entrypoint: `ports P,Q,S` (the OUTPUT rule's ports, slurmd's
/// last) then `rule ARGS...` per rule of every uid.
pub fn query_plan(conf: &str, uids: &[u32], l: QueryLimits) -> Result<String, RenderError> {
    let ports = slurm_ports(conf)?;
    let mut out = format!("ports {},{}\n", ports.queries.join(","), ports.slurmd);
    for &uid in uids {
        for r in student_rules(uid, &ports, l) {
            let _ = writeln!(out, "rule {}", r.join(" "));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = "ClusterName=delegate\nAuthType=auth/munge\nAuthInfo=socket=/run/munge/munge.socket.2\nSlurmctldPort=6817\nSlurmdPort=6818\nAccountingStoragePort=6819\nAccountingStoragePass=/run/munge/munge.socket.2\n";

    #[test]
    fn a_students_slurm_conf_names_their_own_munged() {
        let s = student_slurm_conf(CONF, "/run/munge-users/ada/munge.socket").unwrap();
        assert_eq!(
            s,
            "ClusterName=delegate\nAuthType=auth/munge\nAuthInfo=socket=/run/munge-users/ada/munge.socket\nAccountingStoragePass=/run/munge-users/ada/munge.socket\nSlurmctldPort=6817\nSlurmdPort=6818\nAccountingStoragePort=6819\n"
        );
        let e = student_slurm_conf("ClusterName=x\n", "/run/x").unwrap_err().to_string();
        assert!(e.contains("slurm.conf has no AuthType=auth/munge line"), "{e}");
        let e = student_slurm_conf(CONF, "/run/x y;rm").unwrap_err().to_string();
        assert!(e.contains("\"/run/x y;rm\" is not a safe socket path"), "{e}");
    }

    #[test]
    fn the_ports_come_from_slurm_conf_or_slurms_defaults() {
        assert_eq!(
            slurm_ports(CONF).unwrap(),
            SlurmPorts {
                queries: vec!["6817".into(), "6819".into()],
                slurmd: 6818
            }
        );
        let range = slurm_ports("SlurmctldPort=6817-6820\n").unwrap();
        assert_eq!((range.queries, range.slurmd), (vec!["6817:6820".to_owned()], 6818));
        let e = slurm_ports("SlurmdPort=x\n").unwrap_err().to_string();
        assert!(e.contains("slurm.conf names port \"x\""), "{e}");
        let e = slurm_ports("SlurmctldPort=70000\n").unwrap_err().to_string();
        assert!(e.contains("slurm.conf names port \"70000\""), "{e}");
    }

    #[test]
    fn each_student_gets_the_slurmd_ban_and_the_limits_asked_for() {
        let limits = QueryLimits { rate: 20, burst: 0, conns: 16 };
        let plan = query_plan(CONF, &[3001], limits).unwrap();
        assert_eq!(
            plan,
            "ports 6817,6819,6818\n\
             rule -A delegate-queries -m owner --uid-owner 3001 -p tcp --dport 6818 -j REJECT --reject-with tcp-reset\n\
             rule -A delegate-queries -m owner --uid-owner 3001 -p tcp -m connlimit --connlimit-above 16 --connlimit-mask 0 -j REJECT --reject-with tcp-reset\n\
             rule -A delegate-queries -m owner --uid-owner 3001 -m hashlimit --hashlimit-name q3001 --hashlimit-above 20/sec --hashlimit-burst 1 -j DROP\n"
        );
        let none = QueryLimits { rate: 0, burst: 5, conns: 0 };
        assert_eq!(query_plan(CONF, &[7], none).unwrap().lines().count(), 2, "slurmd's ban only");
    }
}

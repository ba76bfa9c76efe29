//! Which node `delegate doctor` runs on, and the munged socket its Slurm
//! configuration names: what a healthy node of that role has.

use std::path::{Path, PathBuf};

/// Where the deployment writes the node's role (build_cluster.sh: `single`
/// for `--local`; the stack's entrypoint: `head`, `worker`, `user`).
pub const ROLE_FILE: &str = "/etc/delegate/node-role";

/// The role of this node in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    /// Everything on one machine (`build_cluster.sh --local`).
    Single,
    /// A worker: Slurm runs jobs here, the agent starts sandboxes.
    Worker,
    /// The user node (JupyterHub): Slurm's client commands only; the
    /// sandboxes run on the workers.
    User,
    /// The head: slurmctld.
    Head,
}

impl NodeRole {
    /// The role named by `text` (the role file's first word); a node the
    /// deployment did not mark is taken as a single machine.
    pub fn parse(text: &str) -> Option<NodeRole> {
        match text.split_whitespace().next()? {
            "single" => Some(NodeRole::Single),
            "worker" => Some(NodeRole::Worker),
            "user" => Some(NodeRole::User),
            "head" => Some(NodeRole::Head),
            _ => None,
        }
    }

    /// This node's role: the role file, else a single machine.
    pub fn of_this_node() -> NodeRole {
        read_small(Path::new(ROLE_FILE))
            .and_then(|t| NodeRole::parse(&t))
            .unwrap_or(NodeRole::Single)
    }

    /// True when sandboxes run here (the runner and the agent are checked).
    pub fn runs_sandboxes(self) -> bool {
        matches!(self, NodeRole::Single | NodeRole::Worker)
    }

    pub fn describe(self) -> &'static str {
        match self {
            NodeRole::Single => "single machine: Slurm, the root agent and the sandboxes all run here",
            NodeRole::Worker => "worker: Slurm runs jobs here, the root agent starts their sandboxes",
            NodeRole::User => {
                "user node: Slurm's commands (each student with a munged of their own); the sandboxes run \
                 on the workers (the instructor's `build_cluster.sh test` checks them)"
            }
            NodeRole::Head => "head: slurmctld; the sandboxes run on the workers",
        }
    }
}

/// A file of at most 4 KiB, as text (None when absent, larger or unreadable).
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path).ok()?.take(4097).read_to_end(&mut buf).ok()?;
    (buf.len() <= 4096).then(|| String::from_utf8_lossy(&buf).into_owned())
}

/// The Slurm configuration this process's Slurm commands read.
pub fn slurm_conf_path() -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"))
}

/// The munged socket named by `AuthInfo=...socket=PATH` in a slurm.conf's
/// text (None: the default socket).
pub fn munge_socket(conf: &str) -> Option<String> {
    conf.lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("AuthInfo="))
        .next_back()?
        .split(',')
        .find_map(|kv| kv.trim().strip_prefix("socket="))
        .map(str::to_owned)
        .filter(|s| !s.is_empty())
}

/// The munged socket of this process's Slurm configuration (bounded read:
/// 1 MiB).
pub fn munge_socket_in_use() -> Option<String> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(slurm_conf_path())
        .ok()?
        .take(1 << 20)
        .read_to_end(&mut buf)
        .ok()?;
    munge_socket(&String::from_utf8_lossy(&buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        assert_eq!(NodeRole::parse("user\n"), Some(NodeRole::User));
        assert_eq!(NodeRole::parse("single"), Some(NodeRole::Single));
        assert_eq!(NodeRole::parse("worker extra"), Some(NodeRole::Worker));
        assert_eq!(NodeRole::parse("head"), Some(NodeRole::Head));
        assert_eq!(NodeRole::parse("dbd"), None);
        assert_eq!(NodeRole::parse(""), None);
        assert!(!NodeRole::User.runs_sandboxes() && NodeRole::Worker.runs_sandboxes());
    }

    #[test]
    fn the_munge_socket_of_a_slurm_conf() {
        let conf = "ClusterName=x\nAuthType=auth/munge\nAuthInfo=socket=/run/munge-users/ada/munge.socket\n";
        assert_eq!(munge_socket(conf).as_deref(), Some("/run/munge-users/ada/munge.socket"));
        assert_eq!(munge_socket("AuthInfo=cred_expire=30,socket=/s\n").as_deref(), Some("/s"));
        assert_eq!(munge_socket("AuthType=auth/munge\n"), None);
        assert_eq!(munge_socket("AuthInfo=socket=\n"), None);
    }
}

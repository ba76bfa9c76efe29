//! `delegate-deploy`: prints one of the cluster's configuration files,
//! rendered from the `DELEGATE_*` settings in its environment and the
//! facts given as options (build_cluster.sh calls it; see the crate doc).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use delegate_deploy::lockdown::GateForm;
use delegate_deploy::slurm_conf::LocalNode;
use delegate_deploy::stack_file::Facts;
use delegate_deploy::{
    cgroup, cluster_file, gres, local_gpus, lockdown, placement, roster, roster_state, site_policy, slurm_conf,
    stack_accounts, stack_file, user_node, worker_policy, RenderError, Settings, Shape,
};
use roster_state::Reserved;

#[derive(Parser)]
#[command(
    name = "delegate-deploy",
    version,
    about = "Render a delegate cluster's configuration files from its settings"
)]
struct Cli {
    #[command(subcommand)]
    file: Rendered,
}

#[derive(Subcommand)]
enum Rendered {
    /// slurm.conf (local: this node's facts as options; stack: cluster.toml's settings).
    SlurmConf {
        #[arg(long, value_enum)]
        shape: Shape,
        /// The node's short host name (local).
        #[arg(long, default_value = "")]
        node: String,
        /// The node's hardware as `slurmd -C` prints it (local).
        #[arg(long, default_value = "")]
        hardware: String,
        /// GPUs declared to Slurm (local).
        #[arg(long, default_value_t = 0)]
        gpus: u64,
        /// The account slurmctld runs as (local).
        #[arg(long, default_value = "slurm")]
        slurm_user: String,
    },
    /// gres.conf: the GPUs' device files.
    GresConf {
        #[arg(long, value_enum)]
        shape: Shape,
        #[arg(long, default_value = "")]
        node: String,
        #[arg(long, default_value_t = 0)]
        gpus: u64,
        /// Device files in Slurm's order, as gres.conf's File= takes them (local).
        #[arg(long, default_value = "")]
        files: String,
    },
    /// cgroup.conf: Slurm's cgroup side for a node of these facts (with
    /// `IgnoreSystemd=yes`, slurmd's slice must be made before it starts).
    CgroupConf {
        #[arg(long, value_enum)]
        shape: Shape,
        /// The node's cgroup hierarchy (`stat -fc %T /sys/fs/cgroup`:
        /// cgroup2fs is v2).
        #[arg(long, value_enum)]
        cgroup: cgroup::Hierarchy,
        /// Whether systemd runs the node (`/run/systemd/system` exists).
        #[arg(long)]
        systemd: bool,
        /// Slurm's version as `slurmd -V` prints it.
        #[arg(long)]
        slurm_version: String,
    },
    /// The site policy as first installed.
    Policy {
        #[arg(long, value_enum)]
        shape: Shape,
        /// GPUs jobs may ask for (local; the stack's workers have none).
        #[arg(long, default_value_t = 0)]
        max_gpus: u64,
    },
    /// slurmctld's job gate (job_submit.lua) following the site policy.
    Gate {
        /// The runner the scripts exec (default: the policy's `runner`).
        #[arg(long)]
        runner: Option<String>,
        /// The site policy (its defaults when the file does not exist yet).
        #[arg(long)]
        policy: PathBuf,
        #[arg(long)]
        admin_group: String,
        #[arg(long)]
        slurm_uid: u32,
        /// A module for the site's own job_submit.lua (it loads it with
        /// dofile and calls job_submit/job_modify; docs/existing-site.md),
        /// instead of slurmctld's whole job_submit.lua.
        #[arg(long)]
        module: bool,
    },
    /// slurmstepd's SPANK stack (the lockdown plugin's line).
    Plugstack {
        #[arg(long)]
        plugin: String,
        #[arg(long)]
        admin_gid: u32,
        #[arg(long)]
        runner: String,
        /// delegate's nodes on a cluster shared with plain Slurm jobs
        /// (repeatable; none: every node is delegate's).
        #[arg(long = "node", value_name = "HOST")]
        nodes: Vec<String>,
    },
    /// The roster's checked entries, `line|user|name|email|role` per line.
    Roster {
        /// The roster (CSV: username,full name[,email][,role]).
        csv: PathBuf,
        /// Every entry is an instructor.
        #[arg(long)]
        instructors: bool,
    },
    /// Adds the roster's new entries to the stack's roster state (uids
    /// chosen here); prints `added USER UID ROLE` per account added, then
    /// `entries N`.
    RosterAdd {
        /// The roster state file (written whole, 0600, when it changes).
        #[arg(long)]
        state: PathBuf,
        /// The roster (CSV: username,full name[,email][,role]).
        #[arg(long)]
        csv: PathBuf,
        /// Every entry is an instructor.
        #[arg(long)]
        instructors: bool,
        /// The first uid the roster gives.
        #[arg(long)]
        first_uid: u32,
        /// cluster.toml's accounts, `name:uid` (left alone, their uids taken).
        #[arg(long = "reserved", value_name = "NAME:UID")]
        reserved: Vec<Reserved>,
        /// Another id no account may get (the admin group's).
        #[arg(long = "reserved-id", value_name = "ID")]
        reserved_ids: Vec<u32>,
    },
    /// Takes USER out of the stack's roster state; prints the account.
    RosterRemove {
        #[arg(long)]
        state: PathBuf,
        #[arg(long = "reserved", value_name = "NAME:UID")]
        reserved: Vec<Reserved>,
        user: String,
    },
    /// Every account of the stack: cluster.toml's, then the roster's.
    RosterList {
        #[arg(long)]
        state: PathBuf,
        #[arg(long = "reserved", value_name = "NAME:UID")]
        reserved: Vec<Reserved>,
        /// cluster.toml's instructors.
        #[arg(long = "admin", value_name = "NAME")]
        admins: Vec<String>,
    },
    /// The user node: a student's slurm.conf, naming their own munged.
    StudentSlurmConf {
        /// The node's slurm.conf.
        #[arg(long)]
        base: PathBuf,
        /// The student's munged socket.
        #[arg(long)]
        socket: String,
    },
    /// The user node: `ports ...` and one `rule ...` (iptables arguments)
    /// per rule limiting each student's queries to Slurm.
    QueryPlan {
        /// The node's slurm.conf (its ports).
        #[arg(long)]
        slurm_conf: PathBuf,
        /// New connections per second (0: no limit).
        #[arg(long)]
        rate: u32,
        #[arg(long)]
        burst: u32,
        /// Open connections at once (0: no limit).
        #[arg(long)]
        conns: u32,
        /// The students' uids.
        #[arg(long = "uid", value_name = "UID")]
        uids: Vec<u32>,
    },
    /// Every setting resolved (environment over --file over default), as
    /// shell assignments; or the example file or the docs' table.
    Settings {
        /// The settings file (cluster.toml).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Print the commented example file instead.
        #[arg(long, conflicts_with = "markdown")]
        example: bool,
        /// Print the Markdown table of docs/configuration.md instead.
        #[arg(long)]
        markdown: bool,
    },
    /// The single machine's GPUs for DELEGATE_LOCAL_GPUS: `files EXPR`,
    /// `count N`, `max_gpus N`, then `device PATH MAJOR MINOR` per
    /// stand-in device to make.
    LocalGpus {
        /// The minor of each `/dev/nvidia<N>` of this machine (repeatable).
        #[arg(long = "nvidia", value_name = "N")]
        nvidia: Vec<u32>,
    },
    /// A size setting (DELEGATE_HOME_QUOTA, DELEGATE_USER_NODE_MEM) in bytes.
    Bytes {
        /// The setting's name.
        name: String,
    },
    /// A CPUs setting (DELEGATE_USER_NODE_CPUS) as a CFS quota: microseconds
    /// of CPU per `--period` microseconds.
    CpuQuota {
        /// The setting's name.
        name: String,
        #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1000..=1_000_000))]
        period: u64,
    },
    /// Which worker runs where (placement: on the machines `machine add`
    /// labelled): `slots N`, `workers N...`, `replicas R...`
    /// unless elastic, then `refuse`, `warn` and `log` lines of a deploy.
    Placement {
        /// The swarm's labelled machines, `N NODE-ID HOSTNAME` per line.
        #[arg(long)]
        machines: PathBuf,
    },
    /// The number of a machine joining the course (`machine add`): `join N`,
    /// or `refuse SENTENCE` when it cannot be that worker.
    Joining {
        /// The swarm's labelled machines, `N NODE-ID HOSTNAME` per line.
        #[arg(long)]
        machines: PathBuf,
        /// The joining machine's swarm node id, empty when it is in none.
        #[arg(long, default_value = "")]
        node: String,
        /// How the instructor named it (`machine add HOST`).
        #[arg(long)]
        host: String,
        /// The number asked for (`--worker N`).
        #[arg(long)]
        worker: Option<String>,
    },
    /// The stack file (docker stack deploy) with what only the deployment knows.
    StackFile(Facts),
    /// The stack's `accounts` config: cluster.toml's accounts and the
    /// roster state's, each name and uid once (`--names`: the names only).
    StackAccounts {
        #[arg(long)]
        roster_state: PathBuf,
        #[arg(long)]
        names: bool,
    },
    /// The stack's `admins` config: the admin group, its members
    /// cluster.toml's admins and the roster's instructors.
    StackAdmins {
        #[arg(long)]
        roster_state: PathBuf,
    },
    /// The stack's `students` config: `name uid` of every account that is
    /// not an admin.
    StackStudents {
        #[arg(long)]
        roster_state: PathBuf,
    },
    /// A stack worker's policy.toml: the deployed one with what only the
    /// worker's container knows set in it.
    WorkerPolicy {
        /// The deployed policy.toml.
        #[arg(long)]
        policy: PathBuf,
        /// The agent's staging directory as the host's engine sees it.
        #[arg(long)]
        staging_host_dir: String,
        /// The host's /proc as mounted in the container, when it is.
        #[arg(long)]
        host_proc: Option<String>,
    },
    /// The sandbox image a policy.toml names (its default_image).
    PolicyImage {
        #[arg(long)]
        policy: PathBuf,
    },
}

fn run(file: Rendered, s: &Settings) -> Result<String, RenderError> {
    match file {
        Rendered::SlurmConf { shape, node, hardware, gpus, slurm_user } => {
            let local = LocalNode { node, hardware, gpus, slurm_user };
            slurm_conf::render(s, shape, Some(&local))
        }
        Rendered::GresConf { shape, node, gpus, files } => gres::render(s, shape, &node, gpus, &files),
        Rendered::Bytes { name } => Ok(format!("{}\n", s.bytes(&name)?)),
        Rendered::CpuQuota { name, period } => Ok(format!("{}\n", s.cpu_quota_us(&name, period)?)),
        Rendered::LocalGpus { nvidia } => {
            local_gpus::plan(s.raw_or("DELEGATE_LOCAL_GPUS", "auto"), &nvidia).map(|p| p.lines())
        }
        Rendered::CgroupConf { shape, cgroup, systemd, slurm_version } => {
            cgroup::render(shape, cgroup, systemd, &slurm_version)
        }
        Rendered::Policy { shape, max_gpus } => {
            let mem = if shape == Shape::Local {
                site_policy::mem_total_kib()?
            } else {
                0
            };
            site_policy::render(s, shape, max_gpus, mem)
        }
        Rendered::Gate {
            runner,
            policy,
            admin_group,
            slurm_uid,
            module,
        } => {
            let form = if module { GateForm::Module } else { GateForm::Whole };
            lockdown::gate(runner.as_deref(), &policy, &admin_group, slurm_uid, form)
        }
        Rendered::Plugstack { plugin, admin_gid, runner, nodes } => {
            lockdown::plugstack(&plugin, admin_gid, &runner, &nodes)
        }
        Rendered::Settings { file, example, markdown } => settings(file.as_deref(), example, markdown),
        Rendered::Roster { csv, instructors } => Ok(roster::lines(&read_roster(&csv, instructors)?)),
        Rendered::RosterAdd {
            state,
            csv,
            instructors,
            first_uid,
            reserved,
            reserved_ids,
        } => roster_add(&state, &csv, instructors, first_uid, &reserved, &reserved_ids),
        Rendered::RosterRemove { state, reserved, user } => {
            let mut s = roster_state::load(&state).map_err(RenderError::Invalid)?;
            let gone = s.remove(&user, &reserved).map_err(RenderError::Invalid)?;
            roster_state::store(&state, &s).map_err(RenderError::Invalid)?;
            Ok(format!("removed {} {}\n", gone.user, gone.uid))
        }
        Rendered::RosterList { state, reserved, admins } => {
            let s = roster_state::load(&state).map_err(RenderError::Invalid)?;
            Ok(s.table(&reserved, &admins))
        }
        Rendered::StudentSlurmConf { base, socket } => user_node::student_slurm_conf(&read_text(&base)?, &socket),
        Rendered::QueryPlan { slurm_conf, rate, burst, conns, uids } => {
            user_node::query_plan(&read_text(&slurm_conf)?, &uids, user_node::QueryLimits { rate, burst, conns })
        }
        Rendered::Placement { machines } => {
            placement::place(s, &placement::machines(&read_text(&machines)?)).map(|p| p.lines())
        }
        Rendered::Joining { machines, node, host, worker } => {
            let known = placement::machines(&read_text(&machines)?);
            Ok(match placement::joining(&known, &node, &host, worker.as_deref()) {
                Ok(n) => format!("join {n}\n"),
                Err(why) => format!("refuse {}\n", why.replace('\n', " ")),
            })
        }
        Rendered::StackFile(facts) => stack_file::render(s, &facts),
        Rendered::StackAccounts { roster_state, names } => {
            let text = stack_accounts::accounts(s, &roster_or_empty(&roster_state)?)?;
            Ok(if names {
                text.lines()
                    .filter_map(|l| l.split(' ').next())
                    .map(|n| format!("{n}\n"))
                    .collect()
            } else {
                text
            })
        }
        Rendered::StackAdmins { roster_state } => stack_accounts::admins(s, &roster_or_empty(&roster_state)?),
        Rendered::StackStudents { roster_state } => stack_accounts::students(s, &roster_or_empty(&roster_state)?),
        Rendered::WorkerPolicy { policy, staging_host_dir, host_proc } => worker_policy::worker_policy(
            &read_text(&policy)?,
            &worker_policy::WorkerFacts {
                staging_host_dir: &staging_host_dir,
                host_proc: host_proc.as_deref(),
            },
        ),
        Rendered::PolicyImage { policy } => {
            worker_policy::default_image(&read_text(&policy)?).map(|i| format!("{i}\n"))
        }
    }
}

/// The roster state at `path`; none yet (no roster added) is an empty one.
fn roster_or_empty(path: &std::path::Path) -> Result<roster_state::RosterState, RenderError> {
    if !path.exists() {
        return Ok(roster_state::RosterState::default());
    }
    roster_state::load(path).map_err(RenderError::Invalid)
}

/// A text file read whole.
fn read_text(path: &std::path::Path) -> Result<String, RenderError> {
    std::fs::read_to_string(path).map_err(|e| RenderError::Invalid(format!("cannot read {}: {e}", path.display())))
}

/// The roster file's checked entries.
fn read_roster(csv: &std::path::Path, instructors: bool) -> Result<Vec<roster::Entry>, RenderError> {
    let text = std::fs::read(csv)
        .map_err(|e| RenderError::Invalid(format!("cannot read the roster {}: {e}", csv.display())))?;
    let text = String::from_utf8(text)
        .map_err(|_| RenderError::Invalid(format!("the roster {} is not UTF-8 text", csv.display())))?;
    roster::parse(&text, instructors).map_err(|e| RenderError::Invalid(e.to_string()))
}

/// `roster-add`: the state file gains the roster's new accounts.
fn roster_add(
    state: &std::path::Path,
    csv: &std::path::Path,
    instructors: bool,
    first_uid: u32,
    reserved: &[Reserved],
    reserved_ids: &[u32],
) -> Result<String, RenderError> {
    let entries = read_roster(csv, instructors)?;
    let mut s = roster_state::load(state).map_err(RenderError::Invalid)?;
    let added = s.add(&entries, reserved, reserved_ids, first_uid);
    if !added.is_empty() {
        roster_state::store(state, &s).map_err(RenderError::Invalid)?;
    }
    let mut out: String = added
        .iter()
        .map(|a| {
            format!(
                "added {} {} {}\n",
                a.user,
                a.uid,
                if a.instructor { "instructor" } else { "student" }
            )
        })
        .collect();
    out.push_str(&format!("entries {}\n", entries.len()));
    Ok(out)
}

fn settings(file: Option<&std::path::Path>, example: bool, markdown: bool) -> Result<String, RenderError> {
    if example {
        return Ok(cluster_file::example());
    }
    if markdown {
        return Ok(cluster_file::markdown());
    }
    let values = match file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| RenderError::Invalid(format!("cannot read the settings file {}: {e}", p.display())))?;
            cluster_file::read_file(&text, &p.display().to_string())?
        }
        None => Default::default(),
    };
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("DELEGATE_"))
        .collect();
    Ok(cluster_file::shell(&cluster_file::resolve(
        &values,
        &env,
        cluster_file::Machine::this(),
    )?))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.file, &Settings::from_env()) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("delegate-deploy: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `delegate-deploy`: prints one of the cluster's configuration files,
//! rendered from the `DELEGATE_*` settings in its environment and the
//! facts given as options (build_cluster.sh calls it; see the crate doc).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use delegate_deploy::slurm_conf::LocalNode;
use delegate_deploy::{gres, lockdown, site_policy, slurm_conf, RenderError, Settings, Shape};

#[derive(Parser)]
#[command(
    name = "delegate-deploy",
    version,
    about = "Render a delegate cluster's configuration files from its settings"
)]
struct Cli {
    #[command(subcommand)]
    file: File,
}

#[derive(Subcommand)]
enum File {
    /// slurm.conf (local: this node's facts as options; stack: cluster.conf's settings).
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
        #[arg(long)]
        runner: String,
        /// The site policy (its defaults when the file does not exist yet).
        #[arg(long)]
        policy: PathBuf,
        #[arg(long)]
        admin_group: String,
        #[arg(long)]
        slurm_uid: u32,
    },
    /// slurmstepd's SPANK stack (the lockdown plugin's line).
    Plugstack {
        #[arg(long)]
        plugin: String,
        #[arg(long)]
        admin_gid: u32,
        #[arg(long)]
        runner: String,
    },
    /// The stack's number of workers (the elastic maximum when elastic).
    StackWorkers,
}

fn run(file: File, s: &Settings) -> Result<String, RenderError> {
    match file {
        File::SlurmConf { shape, node, hardware, gpus, slurm_user } => {
            let local = LocalNode { node, hardware, gpus, slurm_user };
            slurm_conf::render(s, shape, Some(&local))
        }
        File::GresConf { shape, node, gpus, files } => gres::render(s, shape, &node, gpus, &files),
        File::Policy { shape, max_gpus } => {
            let mem = if shape == Shape::Local {
                site_policy::mem_total_kib()?
            } else {
                0
            };
            site_policy::render(s, shape, max_gpus, mem)
        }
        File::Gate { runner, policy, admin_group, slurm_uid } => {
            lockdown::gate(&runner, &policy, &admin_group, slurm_uid)
        }
        File::Plugstack { plugin, admin_gid, runner } => lockdown::plugstack(&plugin, admin_gid, &runner),
        File::StackWorkers => Ok(format!("{}\n", slurm_conf::stack_workers(s)?.count)),
    }
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

//! `delegate`: run commands in a sandbox on a Slurm cluster.
//!
//! Exit codes:
//! - 0: success;
//! - the job's own exit code, for `submit --wait` and `wait` of one job that
//!   ran to an exit (for several jobs: the code of the first job, in argument
//!   order, that did not succeed);
//! - 1: a delegate error (bad input, Slurm or file-system failure);
//! - 2: a usage error;
//! - 124: the job timed out, or `wait --timeout` expired;
//! - 125: the job failed without an exit code, was refused or was lost;
//! - 130: the job was cancelled.

mod cli;
mod commands;
mod fail;
mod machine;
mod output;

use std::io;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{AdminCmd, Cli, Cmd};
use crate::commands::{admin, cancel, doctor, list, logs, rush, status, submit, wait};
use crate::fail::CliResult;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            if !f.msg.is_empty() {
                eprintln!("delegate: error: {}", f.msg);
            }
            ExitCode::from(f.code)
        }
    }
}

fn init_logging(verbose: u8) {
    let env = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty());
    let filter = match (verbose, env) {
        (0, None) => return,
        (0, Some(e)) => e,
        (1, _) => "delegate_client=info,delegate_protocol=info,delegate=info".to_owned(),
        (_, _) => "debug".to_owned(),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(io::stderr)
        .with_target(false)
        .try_init();
}

/// Dispatches a parsed command line to its command.
fn run(cli: Cli) -> CliResult {
    match &cli.command {
        Cmd::Submit(a) => submit::submit(&cli, a),
        Cmd::Status { ids, file } => status::status(&cli, ids, file.as_deref()),
        Cmd::List => list::list(&cli),
        Cmd::Wait { ids, file, timeout } => wait::wait(&cli, ids, file.as_deref(), *timeout),
        Cmd::Logs { id, follow, stderr, rank } => {
            let c = commands::client(&cli.root)?;
            let id = commands::parse_id(id)?;
            match rank {
                Some(k) => logs::rank_logs(&c, &id, *k, *stderr),
                None => logs::logs(&c, &id, *follow, *stderr, cli.json),
            }
        }
        Cmd::Result { id } => status::result(&cli, id),
        Cmd::Tensorboard { id } => status::tensorboard(&cli, id),
        Cmd::Cancel { ids } => cancel::cancel(&cli, ids),
        Cmd::Doctor => doctor::doctor(&cli),
        Cmd::Admin(AdminCmd::Usage { since, csv }) => admin::usage(&cli, since.as_deref(), *csv),
        Cmd::Admin(AdminCmd::Queue) => admin::queue(&cli),
        Cmd::Admin(AdminCmd::Nodes) => admin::nodes(&cli),
        Cmd::Admin(AdminCmd::Rush { since }) => rush::rush(&cli, since.as_deref()),
    }
}

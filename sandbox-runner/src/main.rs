//! `sandbox-runner`: runs delegate jobs in Docker sandboxes on a worker.
//!
//! ```text
//! sandbox-runner <JOB_DIR>                 run the job in the absolute job directory
//! sandbox-runner pull <JOB_DIR>...         one allocation of a map: the calls it claims, one after another
//! sandbox-runner probe [--json]            report engine, image and perf mode (for `delegate doctor`)
//! sandbox-runner ranks <JOB_DIR>           the batch step of a multi-node job: srun one rank per node
//! sandbox-runner rank <JOB_DIR>            one rank (the task of that srun step; see `ranks`)
//! ```
//!
//! Installed `root:root`, mode `0755`: an ordinary program of the student's,
//! holding no privilege and no Docker socket. It checks the job directory,
//! hands it to the node's root agent (`sandbox-agent`, over
//! `/run/delegate/agent.sock`) as a descriptor, and records the outcome as
//! the student. The agent trusts nothing it says. It reads the policy only
//! from `/etc/delegate/policy.toml` (root-owned); `DELEGATE_POLICY` names
//! another policy file only when the real uid is 0 (tests).
//!
//! Exit codes of `sandbox-runner <JOB_DIR>`:
//! - `0`: an outcome was written into the job directory (whatever the job's
//!   fate: completed, failed, timed out, cancelled or refused).
//! - `2`: usage error (bad arguments).
//! - `3`: refused without an outcome: the directory itself failed the checks
//!   (bad path, symlink, wrong owner, writable by others) or an outcome
//!   already exists. Nothing was written into it.
//! - `4`: internal error: no outcome could be written.
//!
//! `pull` is one allocation of a map (an element of the map's job array,
//! each given every call of the map): it goes through the directories in
//! map order and runs each one it claims (the `claim` file, created
//! `O_EXCL`: exactly one allocation runs a call), exactly as
//! `sandbox-runner <JOB_DIR>` would, each in its own fresh container. It
//! stops claiming once it is as old as the site's `max_allocation_time`,
//! once another user's job waits for the partition (squeue, at most once a
//! second, between calls; at least one call per start), or after
//! SIGTERM/SIGINT/SIGHUP (the call in progress is cancelled); with calls
//! left unclaimed and not signalled, it requeues its own job (`scontrol
//! requeue`) so that they wait in Slurm's queue again. While a call runs,
//! stderr goes to its own log file `<parent>/<job-id>.log` (the file that
//! is a single job's Slurm log): opened without following symlinks,
//! created as the user's group, it must be a regular file of the caller;
//! when it cannot be opened, that call logs to the allocation's stderr with
//! a warning. The allocation's stderr gets one summary line per call. A
//! directory that already holds an outcome (the client cancelled the call
//! before its turn) is skipped. Exit codes of `pull`: `0` every call it
//! claimed ended with an outcome (or was skipped as above); `3` some
//! directory was refused without an outcome; `4` some call ended with an
//! internal error (4 wins over 3).
//!
//! A running job (single or in a map) whose `cancel` marker appears is
//! killed and ends `cancelled` ("cancelled by the user"); in a map only
//! that call stops.
//!
//! Exit codes of `probe`: `0` when the engine is reachable and the default
//! image present, `1` otherwise.
//!
//! Logs go to stderr (Slurm's log of the batch job). When the job did not
//! complete, the last stderr line is one of
//! `delegate: refused: <reason>`, `delegate: <state>: <reason>` (state being
//! failed, timed-out or cancelled) or `delegate: error: <reason>`.

/// A line on stderr (Slurm's log of the job) that never panics: stderr is
/// the student's to close or fill (a full non-blocking pipe); a line that
/// cannot be written is lost, the runner goes on.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod agent;
mod attempt;
mod calllog;
mod probe;
mod pull;
mod ranks;
mod run;
mod slurm;
mod validate;

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use delegate_protocol::policy::{Policy, PolicyError, DEFAULT_POLICY_PATH, POLICY_ENV};
use probe::Show;
use std::io::Write as _;

#[derive(Parser, Debug)]
#[command(
    name = "sandbox-runner",
    version,
    about = "Runs one delegate job in a Docker sandbox (started by the Slurm batch script)",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    /// Absolute path of the job directory (`<root>/<job-id>`).
    #[arg(required = true, value_name = "JOB_DIR")]
    job_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One allocation of a map: run the calls it claims, in order, each in
    /// its own container, each logging to `<parent>/<job-id>.log`, until
    /// every call is claimed, the allocation is as old as the site's
    /// max_allocation_time or another user's job waits (then it requeues
    /// itself when calls are left).
    Pull {
        /// Absolute paths of the map's job directories, in map order.
        #[arg(required = true, num_args = 1.., value_name = "JOB_DIR")]
        dirs: Vec<PathBuf>,
    },
    /// The batch step of a multi-node job: check it, run one `rank` per
    /// node with srun, write the job's outcome from the ranks'.
    Ranks {
        #[arg(value_name = "JOB_DIR")]
        dir: PathBuf,
    },
    /// One rank of a multi-node job (run by `ranks` through srun).
    Rank {
        #[arg(value_name = "JOB_DIR")]
        dir: PathBuf,
    },
    /// Report the Docker engine, the default image and the perf mode in effect.
    Probe {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// The policy: only the root-owned default file, unless the real uid is 0.
fn load_policy() -> Result<Policy, PolicyError> {
    let real_root = nix::unistd::getuid().is_root();
    let path = match std::env::var_os(POLICY_ENV) {
        Some(p) if real_root => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_POLICY_PATH),
    };
    Policy::load(Path::new(&path), true)
}

fn init_logging() {
    let level = if nix::unistd::getuid().is_root() && std::env::var_os("DELEGATE_RUNNER_DEBUG").is_some() {
        tracing::Level::DEBUG
    } else {
        tracing::Level::INFO
    };
    // A log line that cannot be written (stderr closed, or a full
    // non-blocking pipe) is dropped: never tracing's own eprintln!, which
    // panics (issue 11, attack 4).
    tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .with_max_level(level)
        .init();
}

/// The runner needs no capability. Whatever it was started with (run by
/// root, installed with file capabilities by mistake) is dropped before
/// anything else, so no capability can leak into what it does for the user.
fn drop_capabilities() -> Result<(), caps::errors::CapsError> {
    use caps::CapSet;
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set)?;
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    init_logging();
    if let Err(e) = drop_capabilities() {
        say!("delegate: error: cannot drop capabilities: {e}");
        std::process::exit(run::EXIT_INTERNAL);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("delegate: error: cannot start the runtime: {e}");
            std::process::exit(run::EXIT_INTERNAL);
        }
    };
    let code = rt.block_on(async_main(cli));
    // Do not wait for lingering blocking tasks (e.g. a hung file write).
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    std::process::exit(code);
}

/// Signal handlers first, before any job is touched: a signal must never
/// kill the runner while it holds a container. `Err` is the exit code.
fn signal_handlers() -> Result<run::SignalWatch, i32> {
    run::install_signal_handlers().map_err(|e| {
        say!("delegate: error: cannot install signal handlers: {e}");
        run::EXIT_INTERNAL
    })
}

async fn async_main(cli: Cli) -> i32 {
    match (cli.command, cli.job_dir) {
        (Some(Command::Probe { json }), _) => {
            let report = match load_policy() {
                Ok(policy) => probe::probe(&policy).await,
                Err(e) => probe::Report {
                    error: e.to_string(),
                    perf_mode: "unknown".into(),
                    perf_detail: "the site policy could not be read".into(),
                    ..Default::default()
                },
            };
            if json {
                let _ = writeln!(std::io::stdout(), "{}", report.to_json());
            } else {
                let _ = write!(std::io::stdout(), "{}", report.to_text());
            }
            if report.ok() {
                0
            } else {
                1
            }
        }
        (Some(Command::Pull { dirs }), _) => {
            let signals = match signal_handlers() {
                Ok(s) => s,
                Err(code) => return code,
            };
            pull::run_pull(&dirs, signals).await
        }
        (Some(Command::Ranks { dir }), _) => match signal_handlers() {
            Ok(s) => ranks::run_ranks(&dir, s).await,
            Err(code) => code,
        },
        (Some(Command::Rank { dir }), _) => match signal_handlers() {
            Ok(s) => ranks::run_rank(&dir, s).await,
            Err(code) => code,
        },
        (None, Some(dir)) => {
            let signals = match signal_handlers() {
                Ok(s) => s,
                Err(code) => return code,
            };
            let mut agent = None;
            let finish = run::run_job(&dir, load_policy(), &mut agent, signals).await;
            if let Some(line) = finish.final_line {
                say!("{line}");
            }
            finish.code
        }
        (None, None) => {
            say!("delegate: error: a job directory or the probe subcommand is required");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("sandbox-runner").chain(args.iter().copied()))
    }

    /// The kind of error clap refuses `args` with.
    fn refused(args: &[&str]) -> ErrorKind {
        parse(args).expect_err("refused").kind()
    }

    #[test]
    fn single_job_dir() {
        let c = parse(&["/home/a/.delegate/jobs/x"]).unwrap();
        assert!(c.command.is_none());
        assert_eq!(c.job_dir.unwrap(), PathBuf::from("/home/a/.delegate/jobs/x"));
    }

    #[test]
    fn pull_dirs_in_order() {
        let c = parse(&["pull", "/j/a", "/j/b", "/j/c"]).unwrap();
        match c.command {
            Some(Command::Pull { dirs }) => {
                assert_eq!(dirs, vec![PathBuf::from("/j/a"), PathBuf::from("/j/b"), PathBuf::from("/j/c")])
            }
            other => panic!("{other:?}"),
        }
        assert!(c.job_dir.is_none());
    }

    #[test]
    fn rank_subcommands() {
        assert!(matches!(
            parse(&["ranks", "/j/a"]).unwrap().command,
            Some(Command::Ranks { .. })
        ));
        assert!(matches!(parse(&["rank", "/j/a"]).unwrap().command, Some(Command::Rank { .. })));
        assert_eq!(refused(&["rank"]), ErrorKind::MissingRequiredArgument);
        assert_eq!(refused(&["rank", "/j/a", "/j/b"]), ErrorKind::UnknownArgument);
    }

    #[test]
    fn pull_needs_a_dir() {
        assert_eq!(refused(&["pull"]), ErrorKind::MissingRequiredArgument);
        // "batch" is taken for the job directory; "/j/a" after it is refused
        // as a subcommand given with a job directory.
        assert_eq!(
            refused(&["batch", "/j/a"]),
            ErrorKind::ArgumentConflict,
            "the planned batch of old is gone"
        );
    }

    #[test]
    fn probe_still_parses() {
        let c = parse(&["probe", "--json"]).unwrap();
        assert!(matches!(c.command, Some(Command::Probe { json: true })));
        assert_eq!(refused(&[]), ErrorKind::MissingRequiredArgument);
        // A second job directory is refused as a subcommand given with a job directory.
        assert_eq!(refused(&["/j/a", "/j/b"]), ErrorKind::ArgumentConflict);
    }
}

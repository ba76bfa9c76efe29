//! The command line: clap's types for every command and its arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use delegate_protocol::units::{parse_duration, parse_size};

pub const EXIT_HELP: &str = "\
Exit codes:
  0    success
  N    submit --wait / wait: the job's own exit code when it ran to an exit
       (several jobs: that of the first one, in argument order, that did not succeed)
  1    delegate error (bad input, Slurm or file-system failure)
  2    usage error
  124  the job timed out, or wait --timeout expired
  125  the job failed without an exit code, was refused by the site policy, or was lost
  130  the job was cancelled

Environment:
  DELEGATE_ROOT       job directories (default ~/.delegate/jobs)
  DELEGATE_RUNNER     runner executed on the worker (default: the site policy's runner)
  DELEGATE_PARTITION  Slurm partition (default: Slurm's default)
  DELEGATE_POLICY     site policy file (default /etc/delegate/policy.toml)
  RUST_LOG            log filter (logs are off unless -v or RUST_LOG is given)";

/// Run commands in a sandbox on a Slurm cluster.
#[derive(Parser, Debug)]
#[command(name = "delegate", version, after_long_help = EXIT_HELP)]
pub struct Cli {
    /// Directory of the job directories [env: DELEGATE_ROOT; default ~/.delegate/jobs].
    #[arg(long, global = true, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Log what delegate does to stderr (-vv for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Submit a command; prints the job id.
    #[command(after_long_help = EXIT_HELP)]
    Submit(SubmitArgs),
    /// Show the state of jobs (all jobs when no id is given).
    Status {
        #[arg(conflicts_with = "file")]
        ids: Vec<String>,
        /// The calls of the last submission of this jobs file.
        #[arg(short = 'f', long = "file", visible_alias = "jobs-file", value_name = "JOBS.yml")]
        file: Option<PathBuf>,
    },
    /// Wait until jobs are over; exits with the job's exit code.
    #[command(after_long_help = EXIT_HELP)]
    Wait {
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        ids: Vec<String>,
        /// Wait for every call of the last submission of this jobs file.
        #[arg(short = 'f', long = "file", visible_alias = "jobs-file", value_name = "JOBS.yml")]
        file: Option<PathBuf>,
        /// Give up after this long (e.g. 30s, 5m).
        #[arg(long, value_parser = duration_arg)]
        timeout: Option<u64>,
    },
    /// Print a job's output.
    Logs {
        id: String,
        /// Keep printing new output (stdout and stderr) until the job is over.
        #[arg(short, long)]
        follow: bool,
        /// Print stderr instead of stdout.
        #[arg(long, conflicts_with = "follow")]
        stderr: bool,
        /// A multi-node job's rank K (its own stdout or stderr).
        #[arg(long, value_name = "K", conflicts_with = "follow")]
        rank: Option<u32>,
    },
    /// Show how a job ended: state, exit code, reason, host and timings.
    Result { id: String },
    /// Where the job's TensorBoard is: its event files (anywhere in /job),
    /// served by your JupyterHub server while it runs and after.
    Tensorboard { id: String },
    /// Cancel jobs and wait (up to 15 s) until they are over.
    Cancel {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// List all jobs: id, function or command, state, node, elapsed time,
    /// when submitted, and the reason of a job that did not complete.
    List,
    /// Check that Slurm, munge, Docker, the sandbox image, the delegate root
    /// and the site policy work.
    Doctor,
    /// The instructor's view (root and the admin group only): usage per
    /// student from Slurm's accounting, and the queue now.
    #[command(subcommand)]
    Admin(AdminCmd),
}

#[derive(Subcommand, Debug)]
pub enum AdminCmd {
    /// Per student: calls, submissions, allocations, node-time, jobs still
    /// active and failures by reason, from sacct.
    Usage {
        /// From this date or time (e.g. 2026-11-23, 2026-11-23T08:00,
        /// now-2days) [default: now-7days].
        #[arg(long, value_name = "DATE")]
        since: Option<String>,
        /// Print CSV (one line per student) instead of a table.
        #[arg(long)]
        csv: bool,
    },
    /// Who waits for what right now: every job running or pending, running
    /// first, then in the order Slurm will start them.
    Queue,
    /// The partition's nodes: each one's hardware class, governor, boost
    /// and counters as its agent reports them, and every node whose class
    /// changed since the last deployment (drift).
    Nodes,
    /// The rush now, as the instructor's page shows it: calls running and
    /// waiting, busy and free nodes, the waits (median, 90th percentile,
    /// longest), the students waiting longest, the nodes out and why, and
    /// with --since the heaviest users by node time.
    Rush {
        /// Also the heaviest users by node time from this date or time
        /// (sacct: e.g. now-3hours, 2026-11-23T08:00).
        #[arg(long, value_name = "DATE")]
        since: Option<String>,
    },
}

#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// CPUs for the sandbox.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub cpus: u32,
    /// GPUs for the sandbox (Slurm GRES gpu): the sandbox gets exactly the
    /// devices Slurm allocates, within the site policy's max_gpus.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub gpus: u32,
    /// Nodes: more than 1 runs one sandbox (rank) per node, started
    /// together, with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    /// MASTER_PORT and a network private to the job; within the site
    /// policy's max_nodes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub nodes: u32,
    /// Times the call runs again, on another node, when its node is lost
    /// mid-call (default 2, or the site policy's max_retries when lower;
    /// 0: it ends lost). A call that failed, raised, timed out or was
    /// cancelled never runs again; a multi-node job neither.
    #[arg(long, value_name = "N")]
    pub retries: Option<u32>,
    /// Memory limit (e.g. 512M, 2G).
    #[arg(long, default_value = "1G", value_parser = size_arg)]
    pub mem: u64,
    /// Time limit (e.g. 30s, 10m, 1h).
    #[arg(long, default_value = "10m", value_parser = duration_arg)]
    pub time: u64,
    /// Sandbox image [default: the site policy's default image].
    #[arg(long)]
    pub image: Option<String>,
    /// Environment variable for the job, NAME=VALUE (or NAME to pass this
    /// process's value). Repeatable.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Wait for the job, print its stdout and stderr, exit with its exit code.
    #[arg(long)]
    pub wait: bool,
    /// Submit held: the job stays pending until `scontrol release <slurm-id>`.
    #[arg(long, conflicts_with = "wait")]
    pub hold: bool,
    /// Submit N copies of the command in one submission (call i gets
    /// DELEGATE_INDEX=i). They run one after another in shared exclusive
    /// allocations, each in its own fresh sandbox; prints one id per line.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub count: u32,
    /// Let the --count copies (or a --nodes job's nodes) run on nodes of
    /// different hardware classes; by default they keep to one class
    /// (`delegate admin nodes` lists them).
    #[arg(long)]
    pub mix_classes: bool,
    /// Run the command N times in one sandbox on the same cores (after
    /// --warmup K unmeasured runs) and record each run's wall time;
    /// `delegate result` shows the statistics (min, median ± MAD, mean ±
    /// std, outliers, a warning when the spread is too wide).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub repeat: Option<u32>,
    /// Unmeasured runs before the --repeat ones.
    #[arg(long, value_name = "K", requires = "repeat", value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub warmup: Option<u32>,
    /// A file or directory to ship with the job (repeatable): copied into
    /// the job directory before submission, seen as /job/NAME in the
    /// sandbox; links out of a directory are left out; all of them at most
    /// the site's job size (max_job_bytes).
    #[arg(long = "file", value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// Submit every job of a jobs file (YAML; see docs/ml.md), checked
    /// whole first: each problem is printed with its line and nothing is
    /// submitted. Prints each job's name and its calls' ids.
    #[arg(
        short = 'f',
        long = "jobs-file",
        value_name = "JOBS.yml",
        conflicts_with_all = ["command", "count", "cpus", "gpus", "nodes", "retries", "mem", "time", "image", "env", "files", "repeat"]
    )]
    pub jobs_file: Option<PathBuf>,
    /// The command and its arguments (run without a shell).
    #[arg(required_unless_present = "jobs_file", last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn duration_arg(s: &str) -> Result<u64, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// Docs that are true (issue 31): every long flag of every command is in
/// the CLI reference (docs/students.md), and every flag written there exists.
#[cfg(test)]
mod docs_tests {
    use clap::CommandFactory;

    fn long_flags(cmd: &clap::Command, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            out.extend(a.get_long().map(str::to_string));
            out.extend(a.get_visible_aliases().into_iter().flatten().map(str::to_string));
        }
        for sub in cmd.get_subcommands() {
            long_flags(sub, out);
        }
    }

    /// Every `--word` of `text` (words of a-z and '-').
    fn written_flags(text: &str) -> Vec<String> {
        text.split("--")
            .skip(1)
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                    .collect::<String>()
            })
            .filter(|w| !w.is_empty() && !w.starts_with('-'))
            .collect()
    }

    #[test]
    fn every_flag_is_documented_and_every_documented_flag_exists() {
        let readme = include_str!("../../../docs/students.md");
        let start = readme.find("### CLI reference").expect("docs/students.md's CLI reference");
        let end = start + readme[start..].find("\n## ").expect("the section after it");
        let section = &readme[start..end];
        let mut flags = Vec::new();
        long_flags(&super::Cli::command(), &mut flags);
        flags.retain(|f| f != "help" && f != "version");
        for f in &flags {
            assert!(
                section.contains(&format!("--{f}")),
                "--{f} is missing from the CLI reference (docs/students.md)"
            );
        }
        // The syntax column of the table (the prose may quote sbatch's).
        let syntax: String = section
            .lines()
            .filter(|l| l.starts_with("| `delegate"))
            .filter_map(|l| l.split(" | ").next())
            .collect::<Vec<_>>()
            .join("\n");
        for w in written_flags(&syntax) {
            assert!(
                flags.contains(&w),
                "the CLI reference (docs/students.md) names --{w}, which no command has"
            );
        }
    }
}

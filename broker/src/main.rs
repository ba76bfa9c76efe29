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

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use delegate_broker::client::{self, exit_status_for, Client, Config, JobStatus, Stream, SubmitRequest};
use delegate_broker::policy::{PerfMode, Policy, DEFAULT_POLICY_PATH, POLICY_ENV};
use delegate_broker::protocol::{now_ms, JobId, State};
use delegate_broker::units::{format_duration, parse_duration, parse_size};

const EXIT_HELP: &str = "\
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
  DELEGATE_RUNNER     runner executed on the worker (default /usr/local/bin/sandbox-runner)
  DELEGATE_PARTITION  Slurm partition (default: Slurm's default)
  DELEGATE_POLICY     site policy file (default /etc/delegate/policy.toml)
  RUST_LOG            log filter (logs are off unless -v or RUST_LOG is given)";

/// Run commands in a sandbox on a Slurm cluster.
#[derive(Parser, Debug)]
#[command(name = "delegate", version, after_long_help = EXIT_HELP)]
struct Cli {
    /// Directory of the job directories [env: DELEGATE_ROOT; default ~/.delegate/jobs].
    #[arg(long, global = true, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Log what delegate does to stderr (-vv for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Submit a command; prints the job id.
    #[command(after_long_help = EXIT_HELP)]
    Submit(SubmitArgs),
    /// Show the state of jobs (all jobs when no id is given).
    Status { ids: Vec<String> },
    /// Wait until jobs are over; exits with the job's exit code.
    #[command(after_long_help = EXIT_HELP)]
    Wait {
        #[arg(required = true)]
        ids: Vec<String>,
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
    },
    /// Show how a job ended: state, exit code, reason, host and timings.
    Result { id: String },
    /// Cancel jobs and wait (up to 15 s) until they are over.
    Cancel {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// List all jobs.
    List,
    /// Check that Slurm, munge, Docker, the sandbox image, the delegate root
    /// and the site policy work.
    Doctor,
}

#[derive(Args, Debug)]
struct SubmitArgs {
    /// CPUs for the sandbox.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    cpus: u32,
    /// Memory limit (e.g. 512M, 2G).
    #[arg(long, default_value = "1G", value_parser = size_arg)]
    mem: u64,
    /// Time limit (e.g. 30s, 10m, 1h).
    #[arg(long, default_value = "10m", value_parser = duration_arg)]
    time: u64,
    /// Sandbox image [default: the site policy's default image].
    #[arg(long)]
    image: Option<String>,
    /// Environment variable for the job, NAME=VALUE (or NAME to pass this
    /// process's value). Repeatable.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Wait for the job, print its stdout and stderr, exit with its exit code.
    #[arg(long)]
    wait: bool,
    /// Submit held: the job stays pending until `scontrol release <slurm-id>`.
    #[arg(long, conflicts_with = "wait")]
    hold: bool,
    /// Submit N copies of the command in one submission (call i gets
    /// DELEGATE_INDEX=i). They run one after another in shared exclusive
    /// allocations, each in its own fresh sandbox; prints one id per line.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    count: u32,
    /// The command and its arguments (run without a shell).
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<String>,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}
fn duration_arg(s: &str) -> Result<u64, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// A failure of the CLI: one sentence and an exit code.
struct Fail {
    msg: String,
    code: u8,
}

impl Fail {
    fn new(msg: impl Into<String>, code: u8) -> Fail {
        Fail { msg: msg.into(), code }
    }
}

impl<E: std::error::Error> From<E> for Fail {
    fn from(e: E) -> Fail {
        Fail::new(e.to_string(), 1)
    }
}

type CliResult = Result<u8, Fail>;

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
        (1, _) => "delegate_broker=info,delegate=info".to_owned(),
        (_, _) => "debug".to_owned(),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(io::stderr)
        .with_target(false)
        .try_init();
}

fn client(cli_root: &Option<PathBuf>) -> Result<Client, Fail> {
    let mut cfg = Config::from_env()?;
    if let Some(r) = cli_root {
        cfg.root = if r.is_absolute() {
            r.clone()
        } else {
            std::env::current_dir()?.join(r)
        };
    }
    Ok(Client::new(cfg)?)
}

fn parse_ids(ids: &[String]) -> Result<Vec<JobId>, Fail> {
    ids.iter()
        .map(|s| JobId::parse(s.trim()).map_err(|e| Fail::new(e.to_string(), 1)))
        .collect()
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<(), Fail> {
    let s = serde_json::to_string_pretty(v)?;
    println!("{s}");
    Ok(())
}

fn run(cli: Cli) -> CliResult {
    match &cli.command {
        Cmd::Submit(a) => submit(&cli, a),
        Cmd::Status { ids } => {
            let c = client(&cli.root)?;
            let st = if ids.is_empty() { c.list()? } else { c.status(&parse_ids(ids)?)? };
            print_statuses(&st, cli.json)?;
            Ok(0)
        }
        Cmd::List => {
            let c = client(&cli.root)?;
            print_statuses(&c.list()?, cli.json)?;
            Ok(0)
        }
        Cmd::Wait { ids, timeout } => {
            let c = client(&cli.root)?;
            let ids = parse_ids(ids)?;
            let st = c.wait(&ids, timeout.map(Duration::from_secs))?;
            if cli.json {
                print_json(&st)?;
            }
            finish_wait(&st, *timeout)
        }
        Cmd::Logs { id, follow, stderr } => {
            let c = client(&cli.root)?;
            let id = parse_ids(std::slice::from_ref(id))?.remove(0);
            logs(&c, &id, *follow, *stderr, cli.json)
        }
        Cmd::Result { id } => {
            let c = client(&cli.root)?;
            let id = parse_ids(std::slice::from_ref(id))?.remove(0);
            let st = c.status(std::slice::from_ref(&id))?;
            if cli.json {
                print_json(&st[0])?;
            } else {
                print_result(&st[0]);
            }
            Ok(0)
        }
        Cmd::Cancel { ids } => {
            let c = client(&cli.root)?;
            let ids = parse_ids(ids)?;
            let st = c.cancel(&ids)?;
            print_statuses(&st, cli.json)?;
            let stuck: Vec<String> = st.iter().filter(|s| !s.is_terminal()).map(|s| s.id.to_string()).collect();
            if stuck.is_empty() {
                Ok(0)
            } else {
                Err(Fail::new(
                    format!(
                        "{} did not end within {} s of the cancellation (check `squeue`)",
                        stuck.join(", "),
                        client::CANCEL_WAIT.as_secs()
                    ),
                    1,
                ))
            }
        }
        Cmd::Doctor => doctor(&cli),
    }
}

// ---------------------------------------------------------------------------
// submit / wait
// ---------------------------------------------------------------------------

fn submit(cli: &Cli, a: &SubmitArgs) -> CliResult {
    let mut env = Vec::new();
    for e in &a.env {
        match e.split_once('=') {
            Some((k, v)) => env.push((k.to_owned(), v.to_owned())),
            None => match std::env::var(e) {
                Ok(v) => env.push((e.clone(), v)),
                Err(_) => {
                    return Err(Fail::new(
                        format!("--env {e}: expected NAME=VALUE, or NAME of a variable set in this environment"),
                        1,
                    ))
                }
            },
        }
    }
    let mut req = SubmitRequest::command(a.command.clone());
    req.image = a.image.clone();
    req.cpus = a.cpus;
    req.mem_bytes = a.mem;
    req.time_limit_secs = a.time;
    req.env = env;
    req.hold = a.hold;
    let reqs: Vec<SubmitRequest> = if a.count == 1 {
        vec![req]
    } else {
        (0..a.count)
            .map(|i| {
                let mut r = req.clone();
                r.env.retain(|(k, _)| k != "DELEGATE_INDEX");
                r.env.push(("DELEGATE_INDEX".into(), i.to_string()));
                r
            })
            .collect()
    };
    let c = client(&cli.root)?;
    let hs = c.submit_many(&reqs)?;
    let ids: Vec<JobId> = hs.iter().map(|h| h.id.clone()).collect();
    if !a.wait {
        if cli.json {
            match hs.as_slice() {
                [h] => print_json(h)?,
                hs => print_json(&hs)?,
            }
        } else {
            for h in &hs {
                println!("{}", h.id);
            }
        }
        return Ok(0);
    }
    tracing::info!(jobs = hs.len(), slurm_id = %hs[0].slurm_id, "waiting");
    // Ctrl-C (or SIGTERM) while waiting cancels the jobs, as srun does.
    install_interrupt_handler();
    let st = c.wait_with(&ids, None, interrupted)?;
    if interrupted() && !st.iter().all(JobStatus::is_terminal) {
        eprintln!("delegate: interrupted; cancelling {}", if ids.len() == 1 { format!("job {}", ids[0]) } else { format!("{} jobs", ids.len()) });
        let st = c.cancel(&ids)?;
        if cli.json {
            match st.as_slice() {
                [s] => print_json(s)?,
                st => print_json(&st)?,
            }
        }
        return Ok(130);
    }
    if cli.json {
        match st.as_slice() {
            [s] => print_json(s)?,
            st => print_json(&st)?,
        }
    } else {
        for id in &ids {
            copy_output(&c, id, Stream::Stdout)?;
            copy_output(&c, id, Stream::Stderr)?;
        }
    }
    finish_wait(&st, None)
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

fn install_interrupt_handler() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(SigHandler::Handler(on_interrupt), SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        if let Err(e) = unsafe { sigaction(sig, &action) } {
            tracing::debug!(signal = ?sig, error = %e, "cannot install a signal handler");
        }
    }
}

/// Streams a job's stdout or stderr file to ours.
fn copy_output(c: &Client, id: &JobId, stream: Stream) -> Result<(), Fail> {
    let Some(mut f) = c.open_output(id, stream)? else {
        return Ok(());
    };
    let res = match stream {
        Stream::Stdout => io::copy(&mut f, &mut io::stdout().lock()).and_then(|_| io::stdout().flush()),
        Stream::Stderr => io::copy(&mut f, &mut io::stderr().lock()).map(|_| ()),
    };
    match res {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Fail::new(format!("cannot copy the job's {}: {e}", stream.file_name()), 1)),
    }
}

/// The exit code after waiting; explains jobs that did not run to an exit.
fn finish_wait(st: &[JobStatus], timeout: Option<u64>) -> CliResult {
    let open: Vec<String> = st.iter().filter(|s| !s.is_terminal()).map(|s| s.id.to_string()).collect();
    if !open.is_empty() {
        return Err(Fail::new(
            format!(
                "timed out after {} waiting for {}",
                format_duration(timeout.unwrap_or(0)),
                open.join(", ")
            ),
            124,
        ));
    }
    let mut code = 0u8;
    for s in st {
        let c = exit_status_for(s).unwrap_or(1).clamp(0, 255) as u8;
        // A job that ran to an exit speaks through its exit code; explain the rest.
        let ran_to_exit = s.exit_code.is_some() && !s.refused && matches!(s.state, State::Completed | State::Failed);
        if !ran_to_exit {
            eprintln!("delegate: job {} {}: {}", s.id, s.state, s.reason);
        }
        if code == 0 {
            code = c;
        }
    }
    Ok(code)
}

// ---------------------------------------------------------------------------
// status / result
// ---------------------------------------------------------------------------

fn secs(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.1}s")
    } else {
        format_duration(s.round() as u64)
    }
}

fn print_statuses(st: &[JobStatus], json: bool) -> Result<(), Fail> {
    if json {
        return print_json(&st);
    }
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{:<24}  {:<8}  {:<9}  {:>4}  {:>8}  REASON", "ID", "SLURM", "STATE", "EXIT", "ELAPSED");
    for s in st {
        let _ = writeln!(
            out,
            "{:<24}  {:<8}  {:<9}  {:>4}  {:>8}  {}",
            s.id,
            s.slurm_id.as_deref().unwrap_or("-"),
            s.state.as_str(),
            s.exit_code.map_or("-".to_owned(), |c| c.to_string()),
            s.elapsed_secs.map_or("-".to_owned(), secs),
            s.reason
        );
    }
    Ok(())
}

fn print_result(s: &JobStatus) {
    let ago = |ms: u64| secs(now_ms().saturating_sub(ms) as f64 / 1000.0);
    println!("job:       {}", s.id);
    println!("slurm job: {}", s.slurm_id.as_deref().unwrap_or("-"));
    println!("state:     {}", s.state);
    println!("exit code: {}", s.exit_code.map_or("-".to_owned(), |c| c.to_string()));
    println!("reason:    {}", s.reason);
    if s.refused {
        println!("refused:   yes (by the site policy on the worker)");
    }
    if s.oom_killed {
        println!("oom:       killed for exceeding its memory limit");
    }
    println!("host:      {}", s.host.as_deref().filter(|h| !h.is_empty()).unwrap_or("-"));
    if let Some(t) = s.submitted_ms {
        println!("submitted: {} ago", ago(t));
    }
    if let (Some(sub), Some(start)) = (s.submitted_ms, s.started_ms) {
        println!("queued:    {}", secs(start.saturating_sub(sub) as f64 / 1000.0));
    }
    if let Some(e) = s.elapsed_secs {
        println!("ran:       {}", secs(e));
    }
    if let Some(t) = s.finished_ms {
        println!("finished:  {} ago", ago(t));
    }
}

// ---------------------------------------------------------------------------
// logs
// ---------------------------------------------------------------------------

fn logs(c: &Client, id: &JobId, follow: bool, stderr: bool, json: bool) -> CliResult {
    let stream = if stderr { Stream::Stderr } else { Stream::Stdout };
    if json && !follow {
        let bytes = c.read_output(id, stream, 64 << 20)?.unwrap_or_default();
        print_json(&serde_json::json!({
            "id": id,
            "stream": stream.file_name(),
            "text": String::from_utf8_lossy(&bytes),
        }))?;
        return Ok(0);
    }
    // Make sure the job exists (a clear error otherwise).
    c.status(std::slice::from_ref(id))?;
    if !follow {
        copy_output(c, id, stream)?;
        return Ok(0);
    }
    // Follow both streams until the job has an outcome; ask Slurm every 2 s
    // so a job that dies without one still ends the loop.
    let mut files: [(Stream, Option<std::fs::File>, u64); 2] =
        [(Stream::Stdout, None, 0), (Stream::Stderr, None, 0)];
    let mut last_check = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let over = c.has_outcome(id)?
            || (last_check.elapsed() >= client::SLURM_INTERVAL && {
                last_check = Instant::now();
                c.status(std::slice::from_ref(id))?.iter().all(JobStatus::is_terminal)
            });
        let mut progressed = false;
        for (stream, file, pos) in files.iter_mut() {
            if file.is_none() {
                *file = c.open_output(id, *stream)?;
            }
            let Some(f) = file.as_mut() else { continue };
            f.seek(SeekFrom::Start(*pos))?;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                *pos += n as u64;
                progressed = true;
                let res = match stream {
                    Stream::Stdout => io::stdout().write_all(&buf[..n]).and_then(|_| io::stdout().flush()),
                    Stream::Stderr => io::stderr().write_all(&buf[..n]),
                };
                if let Err(e) = res {
                    if e.kind() == io::ErrorKind::BrokenPipe {
                        return Ok(0);
                    }
                    return Err(e.into());
                }
            }
        }
        // `over` was computed before this read, so everything written before
        // the outcome has been printed.
        if over {
            return Ok(0);
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

// ---------------------------------------------------------------------------
// doctor
// ---------------------------------------------------------------------------

#[derive(serde::Serialize)]
struct Check {
    check: &'static str,
    ok: bool,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

fn check(check: &'static str, res: Result<String, (String, String)>) -> Check {
    match res {
        Ok(detail) => Check {
            check,
            ok: true,
            detail,
            fix: None,
        },
        Err((detail, fix)) => Check {
            check,
            ok: false,
            detail,
            fix: Some(fix),
        },
    }
}

struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Output {
    fn first_line(&self) -> String {
        self.stderr
            .lines()
            .chain(self.stdout.lines())
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("no output")
            .chars()
            .take(300)
            .collect()
    }
}

/// Runs a program with a time limit (killing it, by its pid, when over).
fn run_cmd(program: &str, args: &[&str], stdin: Option<Vec<u8>>, limit: Duration) -> Result<Output, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(p) = out_pipe.as_mut() {
            let _ = p.take(1 << 20).read_to_end(&mut s);
        }
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.take(1 << 20).read_to_end(&mut s);
        }
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{program} did not answer within {} s", limit.as_secs()));
            }
            Err(e) => return Err(format!("cannot wait for {program}: {e}")),
        }
    };
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_t.join().unwrap_or_default()).into_owned();
    Ok(Output {
        ok: status.success(),
        stdout,
        stderr,
    })
}

fn doctor(cli: &Cli) -> CliResult {
    let mut checks = Vec::new();
    let t = Duration::from_secs(20);
    let slurm_fix = "start Slurm (build_cluster.sh --local on a single machine) and check that slurmctld is running and SLURM_CONF points at its configuration";

    checks.push(check(
        "slurm controller",
        match run_cmd("scontrol", &["ping"], None, t) {
            Ok(o) if o.ok && o.stdout.contains("UP") => Ok(o.stdout.lines().next().unwrap_or("").trim().to_owned()),
            Ok(o) => Err((format!("scontrol ping: {}", o.first_line()), slurm_fix.into())),
            Err(e) => Err((e, slurm_fix.into())),
        },
    ));
    checks.push(check(
        "slurm nodes",
        match run_cmd("sinfo", &["--noheader", "--format=%P %a %D %T"], None, t) {
            Ok(o) if o.ok => {
                let lines: Vec<&str> = o.stdout.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
                let usable = lines.iter().any(|l| {
                    let st = l.rsplit(' ').next().unwrap_or("");
                    ["idle", "mixed", "allocated", "completing"].iter().any(|u| st.starts_with(u))
                });
                if usable {
                    Ok(lines.join("; "))
                } else if lines.is_empty() {
                    Err(("sinfo lists no partitions".into(), "define a partition and nodes in slurm.conf".into()))
                } else {
                    Err((
                        format!("no usable node: {}", lines.join("; ")),
                        "start slurmd on the workers and `scontrol update nodename=<node> state=resume`".into(),
                    ))
                }
            }
            Ok(o) => Err((format!("sinfo: {}", o.first_line()), slurm_fix.into())),
            Err(e) => Err((e, slurm_fix.into())),
        },
    ));
    let munge_fix = "start munged (same /etc/munge/munge.key on every node)";
    checks.push(check(
        "munge",
        match run_cmd("munge", &["-n"], None, t) {
            Ok(o) if o.ok => match run_cmd("unmunge", &[], Some(o.stdout.into_bytes()), t) {
                Ok(u) if u.ok => Ok("a credential round-trips through munge and unmunge".into()),
                Ok(u) => Err((format!("unmunge: {}", u.first_line()), munge_fix.into())),
                Err(e) => Err((e, munge_fix.into())),
            },
            Ok(o) => Err((format!("munge -n: {}", o.first_line()), munge_fix.into())),
            Err(e) => Err((e, munge_fix.into())),
        },
    ));

    // Docker, image and perf mode, as the setgid runner sees them.
    let cfg = Config::from_env();
    let runner = cfg
        .as_ref()
        .map(|c| c.runner.display().to_string())
        .unwrap_or_else(|_| client::DEFAULT_RUNNER.to_owned());
    let policy = Policy::load_for_client();
    let runner_fix = format!("install sandbox-runner at {runner} (setgid docker) or set DELEGATE_RUNNER");
    match run_cmd(&runner, &["probe", "--json"], None, Duration::from_secs(60)) {
        Ok(o) => match serde_json::from_str::<serde_json::Value>(o.stdout.trim()) {
            Ok(v) => {
                let d = &v["docker"];
                checks.push(check(
                    "docker",
                    if d["ok"].as_bool() == Some(true) {
                        Ok(format!(
                            "Docker {} (API {})",
                            d["version"].as_str().unwrap_or("?"),
                            d["api_version"].as_str().unwrap_or("?")
                        ))
                    } else {
                        Err((
                            format!("Docker does not answer the runner: {}", d["error"].as_str().unwrap_or("no detail")),
                            "start dockerd and check that the runner's group can reach the Docker socket".into(),
                        ))
                    },
                ));
                let i = &v["image"];
                let name = i["name"].as_str().unwrap_or("?").to_owned();
                checks.push(check(
                    "sandbox image",
                    if i["present"].as_bool() == Some(true) {
                        Ok(format!("{name} is present"))
                    } else {
                        Err((
                            format!("{name} is not present on this Docker engine"),
                            "build it (build_cluster.sh builds the sandbox image)".into(),
                        ))
                    },
                ));
                let p = &v["perf_mode"];
                let mode = p["mode"].as_str().unwrap_or("");
                let detail = p["detail"].as_str().unwrap_or("");
                let wants_off = matches!(&policy, Ok(pol) if pol.perf_mode == PerfMode::Off);
                checks.push(check(
                    "perf mode",
                    match mode {
                        "perfmon" | "seccomp" => Ok(format!("{mode}: {detail}")),
                        "off" if wants_off => Ok(format!("off (as the site policy asks): {detail}")),
                        other => Err((
                            format!("perf counters are not available in the sandbox ({other}): {detail}"),
                            "set perf_mode in the site policy and check kernel.perf_event_paranoid and the Docker version".into(),
                        )),
                    },
                ));
            }
            Err(e) => {
                let why = if o.ok { format!("its output is not JSON ({e})") } else { o.first_line() };
                for name in ["docker", "sandbox image", "perf mode"] {
                    checks.push(check(name, Err((format!("{runner} probe --json: {why}"), runner_fix.clone()))));
                }
            }
        },
        Err(e) => {
            for name in ["docker", "sandbox image", "perf mode"] {
                checks.push(check(name, Err((e.clone(), runner_fix.clone()))));
            }
        }
    }

    checks.push(check(
        "delegate root",
        (|| -> Result<String, String> {
            let c = client(&cli.root).map_err(|f| f.msg)?;
            let probe = c.root().join(format!(".doctor-{}", std::process::id()));
            std::fs::write(&probe, b"ok").map_err(|e| format!("cannot write in {}: {e}", c.root().display()))?;
            let _ = std::fs::remove_file(&probe);
            Ok(format!("{} is writable", c.root().display()))
        })()
        .map_err(|e| (e, "make the directory yours and mode 0700, or choose another with --root / DELEGATE_ROOT".into())),
    ));
    let policy_path = std::env::var_os(POLICY_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_POLICY_PATH));
    checks.push(check(
        "site policy",
        match Policy::load(&policy_path, false) {
            Ok(p) => Ok(format!("{} (default image {})", policy_path.display(), p.default_image)),
            Err(e) => Err((
                e.to_string(),
                format!("install a root-owned policy at {DEFAULT_POLICY_PATH} (see build_cluster.sh) or set {POLICY_ENV}"),
            )),
        },
    ));

    let all_ok = checks.iter().all(|c| c.ok);
    if cli.json {
        print_json(&checks)?;
    } else {
        for c in &checks {
            if c.ok {
                println!("ok    {:<16} {}", c.check, c.detail);
            } else {
                println!(
                    "FAIL  {:<16} {} (fix: {})",
                    c.check,
                    c.detail,
                    c.fix.as_deref().unwrap_or("")
                );
            }
        }
    }
    if all_ok {
        Ok(0)
    } else {
        Err(Fail::new("", 1))
    }
}

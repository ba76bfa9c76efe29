//! `delegate submit`: one command, or `--count` copies in one submission;
//! `--wait` streams the output and exits with the job's exit code (Ctrl-C
//! cancels the jobs, as srun does).

use std::sync::atomic::{AtomicBool, Ordering};

use std::path::Path;

use delegate_client::{Client, ClientError, JobHandle, JobStatus, JobsFile, Stream, SubmitRequest};
use delegate_protocol::JobId;

use super::client;
use super::wait::finish_wait;
use crate::cli::{Cli, SubmitArgs};
use crate::fail::{CliResult, Fail};
use crate::output::{copy_output, print_json};

pub fn submit(cli: &Cli, a: &SubmitArgs) -> CliResult {
    if let Some(f) = &a.jobs_file {
        return submit_file(cli, a, f);
    }
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
    let mut req = SubmitRequest::command(repeated_command(a));
    req.image = a.image.clone();
    req.resources = delegate_protocol::Resources {
        cpus: a.cpus,
        gpus: a.gpus,
        nodes: a.nodes,
        mem_bytes: a.mem,
        time_limit_secs: a.time,
        retries: 0,
    };
    req.retries = a.retries;
    req.env = env;
    req.hold = a.hold;
    req.mix_classes = a.mix_classes;
    req.files = a.files.clone();
    let reqs = req.copies(a.count);
    let c = client(&cli.root)?;
    let hs = c.submit_many(&reqs)?;
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
    wait_and_print(cli, &c, &hs)
}

/// The command as the sandbox runs it: with `--repeat`, through the
/// sandbox's timer (`python3 -m delegate_sandbox.repeat`, in every
/// sandbox image), which runs it `--warmup` + `--repeat` times and records
/// the measured runs in the job directory (`repeats`).
fn repeated_command(a: &SubmitArgs) -> Vec<String> {
    let Some(n) = a.repeat else {
        return a.command.clone();
    };
    let mut argv: Vec<String> = ["python3", "-m", "delegate_sandbox.repeat", "--repeat"]
        .map(String::from)
        .into();
    argv.extend([
        n.to_string(),
        "--warmup".into(),
        a.warmup.unwrap_or(0).to_string(),
        "--".into(),
    ]);
    argv.extend(a.command.iter().cloned());
    argv
}

/// `delegate submit -f JOBS.yml [--hold] [--wait]`: every job of the file,
/// checked whole before anything is submitted.
fn submit_file(cli: &Cli, a: &SubmitArgs, path: &Path) -> CliResult {
    let mut file = JobsFile::load(path).map_err(ClientError::from)?;
    for r in file.entries.iter_mut().flat_map(|e| e.requests.iter_mut()) {
        r.hold = a.hold;
        r.mix_classes = a.mix_classes;
    }
    let c = client(&cli.root)?;
    let submitted = c.submit_jobs_file(&file)?;
    if !a.wait {
        if cli.json {
            let rows: Vec<serde_json::Value> = submitted
                .iter()
                .map(|(n, hs)| serde_json::json!({"job_name": n, "calls": hs}))
                .collect();
            print_json(&rows)?;
        } else {
            for (n, hs) in &submitted {
                let ids: Vec<String> = hs.iter().map(|h| h.id.to_string()).collect();
                println!("{n}  {}", ids.join(" "));
            }
        }
        return Ok(0);
    }
    let hs: Vec<JobHandle> = submitted.into_iter().flat_map(|(_, hs)| hs).collect();
    wait_and_print(cli, &c, &hs)
}

/// `--wait`: waits for the calls, prints their output (or JSON statuses)
/// and returns the exit code; Ctrl-C cancels them.
fn wait_and_print(cli: &Cli, c: &Client, hs: &[JobHandle]) -> CliResult {
    let ids: Vec<JobId> = hs.iter().map(|h| h.id.clone()).collect();
    tracing::info!(jobs = hs.len(), slurm_id = %hs[0].slurm_id, "waiting");
    // Ctrl-C (or SIGTERM) while waiting cancels the jobs, as srun does.
    install_interrupt_handler();
    let st = c.wait_with(&ids, None, interrupted)?;
    if interrupted() && !st.iter().all(JobStatus::is_terminal) {
        eprintln!(
            "delegate: interrupted; cancelling {}",
            if ids.len() == 1 {
                format!("job {}", ids[0])
            } else {
                format!("{} jobs", ids.len())
            }
        );
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
            copy_output(c, id, Stream::Stdout)?;
            copy_output(c, id, Stream::Stderr)?;
        }
    }
    finish_wait(&st, None)
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
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

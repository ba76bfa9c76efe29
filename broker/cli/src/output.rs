//! How the CLI prints: JSON, the status table, a job's result, and a job's
//! output streams copied to ours.

use std::io::{self, Write};

use delegate_client::jobsfile::Record;
use delegate_client::{Client, JobStatus, Stream};
use delegate_protocol::units::format_duration;
use delegate_protocol::{now_ms, JobId};

use crate::fail::Fail;

pub fn print_json<T: serde::Serialize>(v: &T) -> Result<(), Fail> {
    let s = serde_json::to_string_pretty(v)?;
    println!("{s}");
    Ok(())
}

pub fn secs(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.1}s")
    } else {
        format_duration(s.round() as u64)
    }
}

pub fn print_statuses(st: &[JobStatus], json: bool) -> Result<(), Fail> {
    if json {
        return print_json(&st);
    }
    let mut out = io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<24}  {:<8}  {:<9}  {:>4}  {:>8}  REASON",
        "ID", "SLURM", "STATE", "EXIT", "ELAPSED"
    );
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

/// `status -f`: the statuses of a jobs file's calls (in the record's
/// order), each with its job's name.
pub fn print_named_statuses(rec: &Record, st: &[JobStatus], json: bool) -> Result<(), Fail> {
    let names: Vec<&str> = rec
        .jobs
        .iter()
        .flat_map(|(n, ids)| ids.iter().map(move |_| n.as_str()))
        .collect();
    if json {
        let rows = names
            .iter()
            .zip(st)
            .map(|(n, s)| {
                let mut v = serde_json::to_value(s)?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("job_name".into(), (*n).into());
                }
                Ok(v)
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()
            .map_err(|e| Fail::new(format!("cannot print JSON: {e}"), 1))?;
        return print_json(&rows);
    }
    let width = names.iter().map(|n| n.len()).max().unwrap_or(3).max(3);
    let mut out = io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<width$}  {:<24}  {:<9}  {:>4}  {:>8}  REASON",
        "JOB", "ID", "STATE", "EXIT", "ELAPSED"
    );
    for (n, s) in names.iter().zip(st) {
        let _ = writeln!(
            out,
            "{:<width$}  {:<24}  {:<9}  {:>4}  {:>8}  {}",
            n,
            s.id,
            s.state.as_str(),
            s.exit_code.map_or("-".to_owned(), |c| c.to_string()),
            s.elapsed_secs.map_or("-".to_owned(), secs),
            s.reason
        );
    }
    Ok(())
}

pub fn print_result(s: &JobStatus) {
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

/// Streams a job's stdout or stderr file to ours.
pub fn copy_output(c: &Client, id: &JobId, stream: Stream) -> Result<(), Fail> {
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

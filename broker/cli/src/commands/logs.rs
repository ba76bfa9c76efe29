//! `delegate logs`: a job's output, or both streams followed until it is over.

use std::io::{self, Write};

use delegate_client::{Client, Stream};
use delegate_protocol::JobId;

use crate::fail::CliResult;
use crate::output::{copy_output, print_json};

/// `delegate logs --rank K`: rank K's stdout (or stderr) of a multi-node job.
pub fn rank_logs(c: &Client, id: &JobId, rank: u32, stderr: bool) -> CliResult {
    let stream = if stderr { Stream::Stderr } else { Stream::Stdout };
    c.status(std::slice::from_ref(id))?;
    let Some(mut f) = c.open_rank_output(id, stream, rank)? else {
        return Ok(0);
    };
    let res = match stream {
        Stream::Stdout => io::copy(&mut f, &mut io::stdout().lock()).and_then(|_| io::stdout().flush()),
        Stream::Stderr => io::copy(&mut f, &mut io::stderr().lock()).map(|_| ()),
    };
    match res {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
}

/// Every rank's stdout (or stderr) of a multi-node job, in rank order, each
/// after a `--- rank K of N ---` line on the same stream.
fn all_ranks(c: &Client, id: &JobId, nodes: u32, stream: Stream) -> CliResult {
    for rank in 0..nodes {
        let header = format!("--- rank {rank} of {nodes} ---\n");
        let res = match stream {
            Stream::Stdout => io::stdout().write_all(header.as_bytes()).and_then(|_| io::stdout().flush()),
            Stream::Stderr => io::stderr().write_all(header.as_bytes()),
        };
        if matches!(&res, Err(e) if e.kind() == io::ErrorKind::BrokenPipe) {
            return Ok(0);
        }
        res?;
        rank_logs(c, id, rank, stream == Stream::Stderr)?;
    }
    Ok(0)
}

pub fn logs(c: &Client, id: &JobId, follow: bool, stderr: bool, json: bool) -> CliResult {
    let stream = if stderr { Stream::Stderr } else { Stream::Stdout };
    // A multi-node job keeps each rank's output apart (stdout.<rank>).
    let nodes = c.spec(id).map(|s| s.resources.nodes).unwrap_or(1);
    if nodes > 1 {
        if json || follow {
            return Err(crate::fail::Fail::new(
                format!(
                    "job {id} is a {nodes}-node job: each rank's output is apart; \
                     `delegate logs {id}` prints them all, `delegate logs --rank K {id}` one"
                ),
                2,
            ));
        }
        c.status(std::slice::from_ref(id))?;
        return all_ranks(c, id, nodes, stream);
    }
    if json && !follow {
        let bytes = c.read_output(id, stream, 64 << 20)?.unwrap_or_default();
        print_json(&serde_json::json!({
            "id": id,
            "stream": stream.file_name(),
            "text": String::from_utf8_lossy(&bytes),
        }))?;
        return Ok(0);
    }
    if !follow {
        // Make sure the job exists (a clear error otherwise).
        c.status(std::slice::from_ref(id))?;
        copy_output(c, id, stream)?;
        return Ok(0);
    }
    let mut failed: Option<io::Error> = None;
    c.follow_output(id, |stream, bytes| {
        let res = match stream {
            Stream::Stdout => io::stdout().write_all(bytes).and_then(|_| io::stdout().flush()),
            Stream::Stderr => io::stderr().write_all(bytes),
        };
        match res {
            Ok(()) => true,
            // A closed pipe (`| head`) ends the following quietly.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => false,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    })?;
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(0),
    }
}

//! The runner's questions to Slurm (`scontrol`), each bounded: a deadline
//! after which the program is killed, and a bounded answer. A hung Slurm
//! command never holds a node.

use std::process::{Command, Stdio};
use std::time::Duration;

/// How long the runner waits for one Slurm command.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// The most of a command's output the runner reads.
const MAX_ANSWER: usize = 64 * 1024;

/// Runs `program args` with a deadline; its standard output, or why not.
/// A thread waits for the program (reading its output as it comes); past
/// the deadline the program is killed.
pub fn ask(program: &str, args: &[&str], deadline: Duration) -> Result<String, String> {
    let shown = format!("{program} {}", args.join(" "));
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {shown} ({e})"))?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(deadline) {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("cannot wait for {shown} ({e})")),
        Err(_) => {
            // (not reaped yet: the waiting thread still holds it)
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            return Err(format!("{shown} did not answer within {} s", deadline.as_secs()));
        }
    };
    let text = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(MAX_ANSWER)]).into_owned();
    if !out.status.success() {
        return Err(format!("{shown} failed ({}): {}", out.status, text(&out.stderr).trim()));
    }
    Ok(text(&out.stdout))
}

/// How many times Slurm had queued this job again when this run started,
/// asked of slurmctld once (the first call; the job's environment does not
/// carry it: the lockdown's SPANK plugin keeps only what slurmstepd sets
/// for every job). 0 outside a Slurm job or when Slurm cannot be asked.
pub fn restart_count() -> u32 {
    static AT_START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *AT_START.get_or_init(|| job_restarts().unwrap_or(0))
}

/// Whether Slurm queued this job again since it started (its node was set
/// down or failed, or it was requeued): slurmctld's restart count of the
/// job is above the one this run started with ([`restart_count`], which
/// must have been asked at the start).
pub fn requeued_since_start() -> bool {
    let before = restart_count();
    job_restarts().is_some_and(|now| now > before)
}

/// slurmctld's restart count of this job (`Restarts=`), asked by the
/// allocation's own id: an array's element by `<array>_<task>`, since the
/// bare job id of the element whose id is the array's own names every
/// element, and the first `Restarts=` of that answer could be another
/// element's (a requeue of another element then read as this one's: the
/// call it ran counted as lost and run again).
fn job_restarts() -> Option<u32> {
    let job = crate::pull::allocation_id();
    if job == "0" {
        return None;
    }
    match ask("scontrol", &["show", "job", "-o", &job], DEADLINE) {
        Ok(text) => restarts_in(&text),
        Err(e) => {
            tracing::warn!("cannot ask Slurm how many times the job was queued again: {e}");
            None
        }
    }
}

/// The `Restarts=N` of `scontrol show job -o`.
fn restarts_in(text: &str) -> Option<u32> {
    text.split_whitespace().find_map(|w| w.strip_prefix("Restarts=")?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_past_its_deadline_is_killed() {
        let t = std::time::Instant::now();
        let e = ask("sleep", &["30"], Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("did not answer within"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
        assert_eq!(ask("echo", &["hi"], DEADLINE).unwrap(), "hi\n");
        assert!(ask("false", &[], DEADLINE).unwrap_err().contains("failed"));
        assert!(ask("/nonexistent/x", &[], DEADLINE).unwrap_err().contains("cannot run"));
    }

    #[test]
    fn the_restart_count_is_read() {
        let line = "JobId=7 JobName=x UserId=a(1) Requeue=1 Restarts=2 BatchFlag=1 Reboot=0";
        assert_eq!(restarts_in(line), Some(2));
        assert_eq!(restarts_in("JobId=7"), None);
    }
}

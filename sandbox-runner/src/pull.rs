//! `sandbox-runner pull`: one allocation of a map. Every allocation of the
//! map (the elements of one job array) is given all the map's calls; each
//! goes through them in order and runs the next one it claims
//! ([`delegate_protocol::claim`]), each in its own fresh container with its
//! own log, as long as
//! - the allocation is younger than the site's `max_allocation_time`, and
//! - no other user's job that has not run yet waits for the partition
//!   (asked of the node's agent between calls, at most once a second; a
//!   map's allocation that stepped aside before waits its turn).
//!
//! When it stops early with calls left unclaimed, it asks Slurm to requeue
//! it (`scontrol requeue`, which the gate allows a map's allocations): the
//! rest of the map waits in Slurm's queue again, in fair-share order,
//! under the same job id. It runs at least one call each time it starts,
//! so a map always moves.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use delegate_protocol::agent::{Answer, QueueRequest, Request};
use delegate_protocol::claim::{claim_at, Claim, MAX_CLAIM_BYTES};
use delegate_protocol::fsio::open_dir_nofollow;
use delegate_protocol::{exists_at, read_bounded_at, CLAIM, OUTCOME};

use crate::agent::Agent;
use crate::calllog::{self, Redirect};
use crate::run::{self, SignalWatch, EXIT_OUTCOME};

/// How often at most an allocation asks Slurm whether others wait.
const QUEUE_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// The bound when the site policy cannot be read (the agent enforces the
/// site's own bound anyway).
const DEFAULT_BOUND_SECS: u64 = 600;

/// Why an allocation stops claiming calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// It went through every call.
    Done,
    /// It is as old as `max_allocation_time`.
    Bound,
    /// Another user's job waits for the partition.
    Others,
    /// Slurm signalled it (scancel, its time limit).
    Signalled,
}

/// Runs the calls this allocation claims; returns the exit code: the worst
/// of its calls' codes (0 < 3 refused < 4 internal error).
pub async fn run_pull(dirs: &[impl AsRef<Path>], signals: SignalWatch) -> i32 {
    let me = Claim {
        allocation: allocation_id(),
        node: delegate_protocol::host::hostname(),
        restart: crate::slurm::restart_count(),
    };
    let bound =
        Duration::from_secs(crate::load_policy().map_or(DEFAULT_BOUND_SECS, |p| p.limits().max_allocation_secs));
    let born = Instant::now();
    let mut queue = QueueWatch::new();
    let mut agent = None;
    let saved = calllog::save_stderr()
        .map_err(|e| tracing::warn!("cannot duplicate standard error ({e}); every call logs here"))
        .ok();
    let mut code = EXIT_OUTCOME;
    let mut ran = 0usize;
    let mut stop = Stop::Done;
    // Where it stopped: every call before was claimed (by it or another).
    let mut rest = dirs.len();
    let total = dirs.len();
    for (i, dir) in dirs.iter().enumerate() {
        let dir = dir.as_ref();
        if signals.borrow().is_some() {
            (stop, rest) = (Stop::Signalled, i);
            break;
        }
        // At least one call each time the allocation starts.
        if ran > 0 && born.elapsed() >= bound {
            (stop, rest) = (Stop::Bound, i);
            break;
        }
        if ran > 0 && queue.others_wait(&mut agent).await {
            (stop, rest) = (Stop::Others, i);
            break;
        }
        let reclaim = match claim(dir, &me) {
            Ok(true) => None,
            // Claimed by this allocation in a start that was lost: again.
            Ok(false) if lost_with_me(dir, &me) => Some(&me),
            Ok(false) => continue,
            Err(e) => {
                // (the checks a run would make: a symbolic link, another
                // owner; never run unclaimed, so never twice)
                refuse_unclaimable(dir, &e.to_string());
                tracing::warn!("call {}/{total}: cannot claim {} ({e}): refused", i + 1, dir.display());
                continue;
            }
        };
        ran += 1;
        let call = ClaimedCall { dir, n: i + 1, total, reclaim };
        code = code.max(run_one(call, saved.as_ref(), &mut agent, signals.clone()).await);
    }
    if stop != Stop::Done {
        step_aside(stop, &dirs[rest..], ran);
    }
    code
}

/// Claims the call in `dir` for this allocation.
fn claim(dir: &Path, me: &Claim) -> delegate_protocol::Result<bool> {
    let fd = open_dir_nofollow(dir)?;
    claim_at(&fd, dir, me)
}

/// Whether the call in `dir` was claimed by this allocation in an earlier
/// start (before Slurm queued it again) and has no outcome: its attempt
/// was lost with that start.
fn lost_with_me(dir: &Path, me: &Claim) -> bool {
    let Ok(fd) = open_dir_nofollow(dir) else { return false };
    if exists_at(&fd, OUTCOME) {
        return false;
    }
    read_bounded_at(&fd, dir, CLAIM, MAX_CLAIM_BYTES, Some(nix::unistd::getuid().as_raw()))
        .ok()
        .and_then(|b| Claim::parse(&String::from_utf8_lossy(&b)))
        .is_some_and(|earlier| me.made_before(&earlier))
}

/// Says in the call's own log why its directory cannot be claimed, as a
/// refusal (the client reads it there): the call ends refused instead of
/// lost.
fn refuse_unclaimable(dir: &Path, why: &str) {
    let uid = nix::unistd::getuid().as_raw();
    match calllog::open_log(dir, uid) {
        Ok((fd, _)) => {
            let line = format!("{}\n", delegate_protocol::refused_line(why));
            let _ = std::fs::File::from(fd).write_all(line.as_bytes());
        }
        Err(e) => tracing::warn!("cannot open the log of {} ({e})", dir.display()),
    }
}

/// This allocation's Slurm id: `<array job>_<task>` for an element of the
/// map's job array, else the job's id.
pub(crate) fn allocation_id() -> String {
    let var = |n: &str| std::env::var(n).ok();
    allocation_of(var("SLURM_ARRAY_JOB_ID"), var("SLURM_ARRAY_TASK_ID"), var("SLURM_JOB_ID"))
}

/// [`allocation_id`] from Slurm's variables (`"0"`: none that is a number).
fn allocation_of(array_job: Option<String>, task: Option<String>, job: Option<String>) -> String {
    let number =
        |v: Option<String>| v.filter(|v| !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit()));
    match (number(array_job), number(task)) {
        (Some(a), Some(t)) => format!("{a}_{t}"),
        _ => number(job).unwrap_or_else(|| "0".into()),
    }
}

/// A claimed call: its directory, its place in the map, and its new
/// claim when it runs again (claimed by this allocation before it was lost).
struct ClaimedCall<'a> {
    dir: &'a Path,
    n: usize,
    total: usize,
    reclaim: Option<&'a Claim>,
}

/// One claimed call, logged to its own `<root>/<job-id>.log` (`saved`: the
/// allocation's own standard error, where everything else goes).
async fn run_one(
    call: ClaimedCall<'_>,
    saved: Option<&OwnedFd>,
    agent: &mut Option<Agent>,
    signals: SignalWatch,
) -> i32 {
    let ClaimedCall { dir, n, total, reclaim } = call;
    let uid = nix::unistd::getuid().as_raw();
    let log = saved.and_then(|saved| match calllog::open_log(dir, uid) {
        Ok((fd, shown)) => Redirect::new(saved, &fd)
            .map_err(|e| tracing::warn!("call {n}/{total}: cannot log to {} ({e}); its log goes here", shown.display()))
            .ok(),
        Err(e) => {
            tracing::warn!(
                "call {n}/{total}: cannot open the log file of {} ({e}); its log goes here",
                dir.display()
            );
            None
        }
    });
    if log.is_some() {
        tracing::info!("call {n}/{total} of a map: {}", dir.display());
    }
    let finish = run::run_call(dir, crate::load_policy(), agent, signals, reclaim).await;
    let (c, summary) = if finish.already_ended {
        let what = "skipped: it already has an outcome (cancelled before its turn)";
        tracing::info!("{}: {what}", dir.display());
        (EXIT_OUTCOME, what.to_string())
    } else {
        if let Some(line) = &finish.final_line {
            say!("{line}");
        }
        let what = finish.final_line.clone().unwrap_or_else(|| "delegate: outcome written".into());
        (finish.code, what)
    };
    drop(log);
    tracing::info!("call {n}/{total} {}: {summary} (code {c})", dir.display());
    c
}

/// Ends the allocation early: with calls left unclaimed among `rest` (the
/// calls from where it stopped), back into Slurm's queue (requeue), else
/// simply over.
fn step_aside(stop: Stop, rest: &[impl AsRef<Path>], ran: usize) {
    let left = rest.iter().filter(|d| !claimed(d.as_ref())).count();
    let why = match stop {
        Stop::Bound => "it is as old as the site's max_allocation_time",
        Stop::Others => "another user's job waits for the partition",
        Stop::Signalled => "Slurm ended it",
        Stop::Done => return,
    };
    if left == 0 || stop == Stop::Signalled {
        tracing::info!("the allocation ends after {ran} calls: {why}; {left} calls left unclaimed");
        return;
    }
    // (this allocation alone: an array's element whose job id is the
    // array's own id named by that id is every element of the array, and
    // requeued the map's other allocations in the middle of their calls)
    let job = allocation_id();
    if job == "0" {
        tracing::warn!("{left} calls left unclaimed and no SLURM_JOB_ID to requeue");
        return;
    }
    tracing::info!("the allocation steps aside after {ran} calls: {why}; {left} calls wait in Slurm's queue again");
    if let Err(e) = crate::slurm::ask("scontrol", &["requeue", &job], crate::slurm::DEADLINE) {
        tracing::warn!("{e}: {left} calls are left to the map's other allocations");
    }
}

/// The call in `dir` has a claim (as far as this machine sees: a claim
/// not seen yet only makes a requeued allocation find nothing to do).
fn claimed(dir: &Path) -> bool {
    open_dir_nofollow(dir).map_or(true, |fd| exists_at(fd.as_fd(), CLAIM))
}

/// Whether another user's job waits for this partition, asked of the
/// node's agent (students do not see other users' jobs; the agent asks
/// Slurm, at most once a second), at most once per
/// [`QUEUE_CHECK_INTERVAL`].
struct QueueWatch {
    partition: Option<String>,
    last: Option<(Instant, bool)>,
}

impl QueueWatch {
    fn new() -> Self {
        QueueWatch {
            partition: std::env::var("SLURM_JOB_PARTITION")
                .ok()
                .filter(|p| !p.is_empty() && p.len() <= 64),
            last: None,
        }
    }

    async fn others_wait(&mut self, agent: &mut Option<Agent>) -> bool {
        if let Some((at, answer)) = self.last {
            if at.elapsed() < QUEUE_CHECK_INTERVAL {
                return answer;
            }
        }
        let answer = match self.ask(agent).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("cannot ask the agent whether others wait ({e}); the allocation goes on");
                *agent = None;
                false
            }
        };
        self.last = Some((Instant::now(), answer));
        answer
    }

    async fn ask(&self, agent: &mut Option<Agent>) -> Result<bool, String> {
        if agent.as_ref().is_some_and(Agent::nearly_idle) {
            *agent = None;
        }
        if agent.is_none() {
            let socket = crate::load_policy().map_err(|e| e.to_string())?.agent_socket;
            *agent = Some(Agent::connect(&socket).await?);
        }
        let a = agent.as_mut().ok_or("no agent connection")?;
        let q = Request::Queue(QueueRequest { partition: self.partition.clone() });
        a.send(&q, &[]).await?;
        match a.recv().await? {
            Answer::Queue { others_wait } => Ok(others_wait),
            Answer::Refused(why) => Err(format!("refused: {why}")),
            other => Err(format!("unexpected answer {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_ids() {
        // (the test's own environment has no Slurm job)
        if std::env::var_os("SLURM_JOB_ID").is_none() {
            assert_eq!(allocation_id(), "0");
        }
        let s = |v: &str| Some(v.to_owned());
        // The element whose job id is the array's own: its element form,
        // never the bare id, which names every element of the array.
        assert_eq!(allocation_of(s("30000082"), s("1"), s("30000082")), "30000082_1");
        assert_eq!(allocation_of(s("30000082"), s("0"), s("30000085")), "30000082_0");
        assert_eq!(allocation_of(None, None, s("512")), "512");
        assert_eq!(allocation_of(s("7"), s("x"), s("9")), "9");
        assert_eq!(allocation_of(None, None, s("1;rm")), "0");
    }

    #[test]
    fn an_unclaimed_call_is_seen() {
        let t = tempfile::tempdir().unwrap();
        assert!(!claimed(t.path()));
        std::fs::write(t.path().join(CLAIM), "1 n\n").unwrap();
        assert!(claimed(t.path()));
        assert!(claimed(&t.path().join("gone")), "an unreadable call is left alone");
    }
}

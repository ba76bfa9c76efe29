//! A map's allocation that stepped aside, eligible again as soon as the
//! node it gave up is taken.
//!
//! An allocation steps aside by going back into Slurm's queue
//! (`scontrol requeue`), and Slurm holds a requeued job until its
//! credential has expired (`cred_expire`, 30 s here): once the other
//! student's short job was over, the node idled for the rest of that time
//! while the map's calls waited. The agent that told the allocation that
//! others wait ([`crate::scheduling::queue`]) watches it: once it is pending again,
//! held only by that begin time, and no other user's job waits for its
//! partition any more (the one it stepped aside for has the node), it is
//! made eligible at once (`StartTime=now`, which the student could set on
//! their own job too). If others still wait, Slurm's own delay stands, as
//! before: the nodes are busy then, none idles. A requeued allocation never
//! counts as "others waiting" (crate::scheduling::queue::others_waiting), so two maps
//! do not trade a node call by call.
//!
//! Stepping aside is the runner's decision, and a runner the student
//! stopped (`scancel --signal=STOP --batch`, `kill -STOP`) decides nothing:
//! its allocation held the node until its time limit while another student
//! waited. [`keep_maps_moving`] takes the decision out of the student's
//! reach: a map's allocation on this node with no sandbox and no question
//! from its runner for [`STALL`] while another user's job waits for its
//! partition is requeued by the agent, as its runner would have done.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ask::SlurmError;
use crate::job::Shared;

/// How long an allocation is watched after it was told to step aside:
/// longer than Slurm's requeue delay, after which there is nothing to do.
const WATCH: Duration = Duration::from_secs(60);
/// Between two looks at the job.
const STEP: Duration = Duration::from_millis(500);
/// At most this much of `scontrol show job`'s answer is read.
const MAX_ANSWER: usize = 64 << 10;
/// Allocations watched at once at most (one per node is the rule).
const MAX_WATCHED: usize = 64;
/// How long a map's allocation may run no sandbox and ask nothing while
/// others wait before the agent requeues it: a runner claims its next call
/// and asks for its sandbox within a second or two, even through a
/// network home.
const STALL: Duration = Duration::from_secs(20);
/// Between two looks at the maps on this node.
const CHECK: Duration = Duration::from_secs(5);

/// When each Slurm job on this node last showed progress: a sandbox
/// started or ended, its runner asked whether others wait.
#[derive(Default)]
pub struct Progress(Mutex<HashMap<String, Instant>>);

impl Progress {
    /// Slurm job `job` made progress now.
    pub fn touch(&self, job: &str) {
        let mut p = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if p.len() >= 4096 {
            p.clear();
        }
        p.insert(job.to_owned(), Instant::now());
    }

    fn last(&self, job: &str) -> Option<Instant> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(job).copied()
    }

    /// Forgets every job but `keep`.
    fn keep_only(&self, keep: &HashSet<&str>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|j, _| keep.contains(j.as_str()));
    }
}

/// The allocations being watched.
#[derive(Default)]
pub struct Watched(Mutex<HashSet<String>>);

/// What became of a watched allocation.
#[derive(Debug, PartialEq, Eq)]
enum Watch {
    /// Made eligible at once.
    Hastened,
    /// It ended, started again or is pending for another reason.
    Over,
    /// Still held by its begin time when the watch ended: others waited.
    OthersWaited,
}

/// Watches Slurm job `job` (a map's allocation of `uid`, told that others
/// wait for `partition`), in the background, once at a time per job.
pub fn watch(shared: Arc<Shared>, job: String, partition: Option<String>, uid: u32) {
    {
        let mut watched = shared.aside.0.lock().unwrap_or_else(|p| p.into_inner());
        if watched.len() >= MAX_WATCHED || !watched.insert(job.clone()) {
            return;
        }
    }
    tokio::spawn(async move {
        let element = element_id(&job).await;
        match until_free(&shared, &element, partition.as_deref(), uid).await {
            Ok(Watch::Hastened) => {
                tracing::info!("Slurm job {job} stepped aside and the node it gave up is taken: eligible again at once")
            }
            Ok(Watch::OthersWaited) => {
                tracing::info!("Slurm job {job} stepped aside; others still wait: Slurm's requeue delay stands")
            }
            Ok(Watch::Over) => {}
            Err(e) => tracing::warn!("Slurm job {job} stepped aside: {e}; Slurm's requeue delay stands"),
        }
        shared.aside.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&job);
    });
}

/// Every [`CHECK`], the maps' allocations running on this node (their
/// batch script is the runner's `pull`, as one job or array elements); each
/// that made no progress for [`STALL`] while another user's job waits for
/// its partition is requeued (then watched as one that stepped aside).
pub async fn keep_maps_moving(shared: Arc<Shared>) {
    // (when first seen running, and whether its batch script is a map's)
    let mut seen: HashMap<String, (Instant, bool)> = HashMap::new();
    let mut served = Served::default();
    loop {
        tokio::time::sleep(CHECK).await;
        if !served.any_stalled(&shared) {
            continue;
        }
        let maps = match squeue_maps(&shared.node).await {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!("cannot list the maps on this node: {e}");
                continue;
            }
        };
        let here: HashSet<&str> = maps.iter().map(|m| m.job.as_str()).collect();
        seen.retain(|j, _| here.contains(j.as_str()));
        shared.progress.keep_only(&here);
        for m in &maps {
            if !seen.contains_key(&m.job) {
                seen.insert(m.job.clone(), (Instant::now(), runs_a_map(&m.job).await));
            }
            let Some(&(first, true)) = seen.get(&m.job) else {
                continue;
            };
            if !stalled(&shared, m, first) || !shared.queue.others_wait(Some(&m.partition), m.uid).await {
                continue;
            }
            tracing::warn!(
                "Slurm job {} (a map's allocation of uid {}) ran no sandbox and asked nothing for {} s \
                 while another user's job waits: its runner is stopped or stuck; requeued, as it would \
                 have stepped aside",
                m.job,
                m.uid,
                STALL.as_secs()
            );
            // (by its element's id: an element whose job id is the
            // array's own named by that id is every element of the array)
            if let Err(e) = scontrol(&["requeue", &m.allocation]).await {
                tracing::warn!("Slurm job {}: {e}", m.job);
                continue;
            }
            seen.remove(&m.job);
            watch(shared.clone(), m.allocation.clone(), Some(m.partition.clone()), m.uid);
        }
    }
}

/// The jobs a slurmstepd serves on this node, from the process table (no
/// question to Slurm), with when each was first seen. Slurm is asked about
/// the node's maps only when one of them may be stalled: a runner that
/// claims call after call never makes the agent ask (in a rush, every
/// node's agent asked slurmctld for every job every 5 s: issue 53).
#[derive(Default)]
struct Served(HashMap<String, Instant>);

impl Served {
    /// Whether a job served here ran no sandbox and showed no progress for
    /// [`STALL`] since it was first seen. Without slurmstepd's path the
    /// process table tells nothing: always (Slurm is asked, as before).
    fn any_stalled(&mut self, shared: &Shared) -> bool {
        if shared.stepds.is_empty() {
            return true;
        }
        let here = crate::scheduling::failed_launch::served_jobs(&shared.stepds);
        self.0.retain(|j, _| here.contains(j));
        for j in here {
            self.0.entry(j).or_insert_with(Instant::now);
        }
        self.0.iter().any(|(job, first)| idle_since(shared, job, *first))
    }
}

/// Whether Slurm job `job` on this node runs no sandbox and showed no
/// progress for [`STALL`] (`first`: when this agent first saw it).
fn idle_since(shared: &Shared, job: &str, first: Instant) -> bool {
    let busy = shared.running.lock().map_or(true, |r| r.contains(job));
    let last = shared.progress.last(job).map_or(first, |t| t.max(first));
    !busy && last.elapsed() >= STALL
}

/// Whether the map's allocation has shown no progress for [`STALL`]
/// (`first`: when this agent first saw it running).
fn stalled(shared: &Shared, m: &Map, first: Instant) -> bool {
    !started_lately(m.ran_secs) && idle_since(shared, &m.job, first)
}

/// Whether an allocation's current run has lasted less than [`STALL`]: a
/// requeued allocation that starts again keeps its job id, and its last
/// progress may be its previous run's (a run not read from Slurm: no).
fn started_lately(ran_secs: Option<u64>) -> bool {
    ran_secs.is_some_and(|r| r < STALL.as_secs())
}

/// Whether the batch script of job `job` is a map's allocation: delegate's
/// runner pulling calls (a one-call job, or another job on a shared node,
/// is never touched).
async fn runs_a_map(job: &str) -> bool {
    scontrol(&["write", "batch_script", job, "-"])
        .await
        .is_ok_and(|s| is_pull_script(&s))
}

fn is_pull_script(script: &str) -> bool {
    script
        .lines()
        .any(|l| l.starts_with("exec '") && l.contains("/sandbox-runner' pull '"))
}

/// A job running on this node, maybe a map's allocation.
#[derive(Debug, PartialEq, Eq)]
struct Map {
    job: String,
    uid: u32,
    partition: String,
    /// Seconds its current run has lasted (squeue's `%M`, which starts
    /// again when a requeued allocation starts again); `None` unread.
    ran_secs: Option<u64>,
    /// Its own id for Slurm's commands (squeue's `%i`): `<array>_<task>`
    /// for an array's element, else the job id.
    allocation: String,
}

async fn squeue_maps(node: &str) -> Result<Vec<Map>, SlurmError> {
    // (STOPPED: `scancel --signal=STOP --batch` makes Slurm say so)
    let argv = [
        "squeue",
        "-h",
        "-t",
        "RUNNING,STOPPED",
        "-w",
        node,
        "-o",
        "%A|%U|%P|%M|%i",
    ];
    Ok(maps_in(&slurm(&argv).await?))
}

/// squeue's `job|uid|partition|time used` lines (a map's allocations are
/// told from the others by their batch script: [`runs_a_map`]).
fn maps_in(squeue: &str) -> Vec<Map> {
    squeue.lines().filter_map(map_of).collect()
}

/// A Slurm job or task number as squeue prints it.
fn digits(s: &str) -> bool {
    !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())
}

/// `<array>_<task>`: an array element's own id.
fn is_element(id: &str) -> bool {
    id.split_once('_').is_some_and(|(a, t)| digits(a) && digits(t))
}

fn map_of(line: &str) -> Option<Map> {
    let f: Vec<&str> = line.trim().split('|').collect();
    let [job, uid, partition, used, id] = f[..] else {
        return None;
    };
    if !digits(job) || partition.is_empty() || partition.len() > 64 {
        return None;
    }
    let element = is_element(id);
    Some(Map {
        job: job.to_owned(),
        uid: uid.parse().ok()?,
        partition: partition.to_owned(),
        ran_secs: used_secs(used),
        allocation: if element { id } else { job }.to_owned(),
    })
}

/// squeue's time used (`%M`: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`) in seconds.
fn used_secs(s: &str) -> Option<u64> {
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, r),
        None => (0, s),
    };
    let parts: Vec<u64> = rest.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let secs = match parts[..] {
        [m, s] => m * 60 + s,
        [h, m, s] => h * 3600 + m * 60 + s,
        _ => return None,
    };
    Some(days * 86_400 + secs)
}

/// The id Slurm's commands take for job `job` alone: `<array>_<task>` for
/// an array's element (the element whose job id is the array's own, named
/// by that id, is every element of the array), else `job` itself.
async fn element_id(job: &str) -> String {
    if job.contains('_') {
        return job.to_owned();
    }
    let answer = slurm(&["squeue", "-h", "-t", "all", "-j", job, "-o", "%A|%i"]).await;
    answer.ok().and_then(|a| element_in(&a, job)).unwrap_or_else(|| job.to_owned())
}

/// From squeue's `job|id` lines, the id of job `job`'s own line.
fn element_in(squeue: &str, job: &str) -> Option<String> {
    squeue.lines().find_map(|l| {
        let (j, id) = l.trim().split_once('|')?;
        (j == job && is_element(id)).then(|| id.to_owned())
    })
}

/// Looks at the job every [`STEP`] until it is requeued and nobody else
/// waits (then makes it eligible), or it is over, or [`WATCH`] passed.
async fn until_free(shared: &Shared, job: &str, partition: Option<&str>, uid: u32) -> Result<Watch, SlurmError> {
    let end = Instant::now() + WATCH;
    while Instant::now() < end {
        let answer = scontrol(&["show", "job", "-o", job]).await?;
        match held_by_begin_time(&answer) {
            Some(true) if !shared.queue.others_wait(partition, uid).await => {
                scontrol(&["update", &format!("jobid={job}"), "StartTime=now"]).await?;
                return Ok(Watch::Hastened);
            }
            Some(_) => {}
            None => return Ok(Watch::Over),
        }
        tokio::time::sleep(STEP).await;
    }
    Ok(Watch::OthersWaited)
}

/// From `scontrol show job -o`: `Some(true)` when the job is pending on its
/// begin time (requeued), `Some(false)` while it still runs or completes,
/// `None` when it is over or pending for another reason (nothing to do).
fn held_by_begin_time(answer: &str) -> Option<bool> {
    let field = |name: &str| {
        answer
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    match (field("JobState")?, field("Reason").unwrap_or("")) {
        ("PENDING", "BeginTime") => Some(true),
        ("RUNNING" | "COMPLETING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_FED", _) => Some(false),
        _ => None,
    }
}

async fn scontrol(args: &[&str]) -> Result<String, SlurmError> {
    let argv: Vec<&str> = std::iter::once("scontrol").chain(args.iter().copied()).collect();
    slurm(&argv).await
}

/// A Slurm command's answer, within [`MAX_ANSWER`].
async fn slurm(argv: &[&str]) -> Result<String, SlurmError> {
    crate::ask::slurm(argv, MAX_ANSWER).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_runners_pull_is_a_map() {
        assert!(is_pull_script(
            "#!/bin/sh\nexec '/usr/local/bin/sandbox-runner' pull '/home/a/.delegate/jobs/x' '/home/a/.delegate/jobs/y'\n"
        ));
        for other in [
            "#!/bin/sh\n# This script was created by sbatch --wrap.\n\nsleep 30\n",
            "#!/bin/sh\nexec '/usr/local/bin/sandbox-runner' '/home/a/.delegate/jobs/x'\n",
            "",
        ] {
            assert!(!is_pull_script(other), "{other:?}");
        }
    }

    #[test]
    fn the_jobs_on_a_node() {
        let out = "512|2001|delegate|0:05|512\n514|2002|gpu|1-02:03:04|30000082_1\ngarbage\n1|x|p|0:01|1\n\
                   5|6||0:01|5\n516|2003|d|?|516_x\n";
        let maps = maps_in(out);
        let jobs: Vec<(&str, u32, &str, Option<u64>, &str)> = maps
            .iter()
            .map(|m| (m.job.as_str(), m.uid, m.partition.as_str(), m.ran_secs, m.allocation.as_str()))
            .collect();
        assert_eq!(
            jobs,
            vec![
                ("512", 2001, "delegate", Some(5), "512"),
                // (an array's element: its own id, never the array's)
                ("514", 2002, "gpu", Some(93_784), "30000082_1"),
                ("516", 2003, "d", None, "516")
            ]
        );
        assert!(maps_in("").is_empty());
        assert_eq!(used_secs("12:34"), Some(754));
        assert_eq!(used_secs("1:00:00"), Some(3600));
        assert_eq!(used_secs("5"), None);
    }

    #[test]
    fn an_arrays_element_is_named_by_its_own_id() {
        let out = "30000085|30000082_0\n30000082|30000082_1\n";
        assert_eq!(element_in(out, "30000082").as_deref(), Some("30000082_1"));
        assert_eq!(element_in(out, "30000085").as_deref(), Some("30000082_0"));
        assert_eq!(element_in("512|512\n", "512"), None, "a job of its own keeps its id");
        assert_eq!(element_in("7|7_x;rm\n", "7"), None);
    }

    #[test]
    fn a_map_that_just_started_again_is_not_stalled() {
        assert!(started_lately(Some(0)) && started_lately(Some(STALL.as_secs() - 1)));
        assert!(!started_lately(Some(STALL.as_secs())), "a run of STALL may be stalled");
        assert!(!started_lately(None), "a time not read: as before");
    }

    #[test]
    fn a_requeued_allocation_is_held_by_its_begin_time() {
        let show = |state: &str, reason: &str| {
            format!("JobId=12 ArrayJobId=11 JobName=delegate UserId=a(1000) JobState={state} Reason={reason} Dependency=(null) Requeue=1 Restarts=1")
        };
        assert_eq!(held_by_begin_time(&show("PENDING", "BeginTime")), Some(true));
        for running in ["RUNNING", "COMPLETING", "CONFIGURING"] {
            assert_eq!(held_by_begin_time(&show(running, "None")), Some(false), "{running}");
        }
        for (state, reason) in [
            ("PENDING", "Priority"),
            ("PENDING", "JobHeldUser"),
            ("COMPLETED", "None"),
            ("CANCELLED", "None"),
        ] {
            assert_eq!(held_by_begin_time(&show(state, reason)), None, "{state} {reason}");
        }
        assert_eq!(held_by_begin_time("slurm_load_jobs error: Invalid job id specified"), None);
        assert_eq!(held_by_begin_time(""), None);
    }
}

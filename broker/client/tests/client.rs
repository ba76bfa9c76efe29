//! The client against fake Slurm tools (shell scripts) and real job
//! directories in a temporary root: submission, status, wait and cancel end
//! to end, without a cluster.

#![allow(clippy::unwrap_used)] // a test: a panic is how it fails

use std::path::Path;
use std::time::{Duration, Instant};

use delegate_client::slurm::{self, Slurm};
use delegate_client::{exit_status_for, Client, ClientError, Config, SubmitRequest, SHARED_CALL_ALLOWANCE_SECS};
use delegate_protocol::{now_ms, open_dir_nofollow, write_record_at, JobId, Outcome, Started, State, Writer};

/// What the runner writes when a job exited with `code`, `ran_ms` after it started.
fn write_completed(dir: &Path, code: i32, reason: &str, ran_ms: u64) {
    let fd = open_dir_nofollow(dir).unwrap();
    let o = Outcome {
        exit_code: Some(code),
        started_ms: Some(now_ms() - ran_ms),
        ..Outcome::ended(State::Completed, reason, "n1", Writer::Runner)
    };
    write_record_at(&fd, dir, &o).unwrap();
}

fn write_started(dir: &Path) {
    let fd = open_dir_nofollow(dir).unwrap();
    let st = Started {
        host: "n1".into(),
        started_ms: now_ms(),
        container_id: "c".into(),
        perf_mode: "seccomp".into(),
    };
    write_record_at(&fd, dir, &st).unwrap();
}

fn fake_slurm(dir: &Path, sbatch_body: &str, squeue_body: &str) -> Slurm {
    use std::os::unix::fs::PermissionsExt;
    let mk = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    Slurm {
        partition: None,
        sbatch: mk("sbatch", sbatch_body),
        squeue: mk("squeue", squeue_body),
        scancel: mk("scancel", "exit 0"),
        // No partition information: one Slurm job per call.
        sinfo: mk("sinfo", "exit 1"),
        ..Slurm::default()
    }
}

/// A directory for the fake Slurm tools.
fn bin_dir(tmp: &Path) -> std::path::PathBuf {
    let bin = tmp.join("bin");
    std::fs::create_dir(&bin).unwrap();
    bin
}

/// The simplest call: `true` in the image `img`.
fn true_req() -> SubmitRequest {
    let mut req = SubmitRequest::command(vec!["true".into()]);
    req.image = Some("img".into());
    req
}

fn client(tmp: &Path, slurm: Slurm) -> Client {
    Client::new(Config {
        root: tmp.join("home/.delegate/jobs"),
        runner: "/nonexistent/runner".into(),
        slurm,
        calls_per_allocation: None,
    })
    .unwrap()
}

#[test]
fn submit_many_is_one_sbatch_of_an_array() {
    let tmp = tempfile::tempdir().unwrap();
    let calls = tmp.path().join("calls");
    let slurm = fake_slurm(
        tmp.path(),
        &format!("cat > {d}/script; echo x >> {d}/calls; echo 77", d = tmp.path().display()),
        "exit 0",
    );
    let c = client(tmp.path(), slurm);
    let mut reqs: Vec<SubmitRequest> = (0..3)
        .map(|i| SubmitRequest::command(vec!["echo".into(), i.to_string()]))
        .collect();
    for r in &mut reqs {
        r.image = Some("img:1".into());
    }
    let hs = c.submit_many(&reqs).unwrap();
    assert_eq!(std::fs::read_to_string(&calls).unwrap(), "x\n");
    let sids: Vec<_> = hs.iter().map(|h| h.slurm_id.as_str()).collect();
    assert_eq!(sids, ["77_0", "77_1", "77_2"]);
    let script = std::fs::read_to_string(tmp.path().join("script")).unwrap();
    assert!(script.contains("#SBATCH --array=0-2"), "{script}");
    for (i, h) in hs.iter().enumerate() {
        assert!(
            script.contains(&format!("{i}) exec >>'{}'", c.log_path(&h.id).display())),
            "{script}"
        );
        assert_eq!(std::fs::read_to_string(h.dir.join("slurm-id")).unwrap(), format!("77_{i}\n"));
    }
    // Mixed resources cannot share one array.
    reqs[1].resources.cpus = 2;
    assert!(matches!(c.submit_many(&reqs), Err(ClientError::InvalidRequest(_))));
    assert_eq!(std::fs::read_to_string(&calls).unwrap(), "x\n");
}

#[test]
fn map_submission_and_cancel() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let mut slurm = fake_slurm(
        &bin,
        &format!("echo \"$@\" > {d}/args; cat > {d}/script; echo 77", d = bin.display()),
        "echo '77|RUNNING|None'",
    );
    let log = bin.join("scancel.log");
    std::fs::write(&slurm.scancel, format!("#!/bin/sh\necho \"$@\" >> {}\n", log.display())).unwrap();
    std::fs::write(&slurm.sinfo, "#!/bin/sh\necho 'delegate*|1|2:00:00|idle'\n").unwrap();
    slurm.partition = None;
    let c = client(tmp.path(), slurm);
    let reqs: Vec<SubmitRequest> = (0..3)
        .map(|i| {
            let mut r = SubmitRequest::command(vec!["echo".into(), i.to_string()]);
            r.image = Some("img:1".into());
            r.resources.time_limit_secs = 60;
            r
        })
        .collect();
    let hs = c.submit_many(&reqs).unwrap();
    let script = std::fs::read_to_string(bin.join("script")).unwrap();
    assert!(!script.contains("--array"), "{script}");
    let dirs: Vec<String> = hs.iter().map(|h| format!("'{}'", h.dir.display())).collect();
    assert_eq!(
        script,
        format!("#!/bin/sh\nexec '/nonexistent/runner' pull {}\n", dirs.join(" ")),
        "one node: one allocation, given every call"
    );
    // Slurm's time: the bound on the allocation (the default policy's
    // 10 minutes), the call in progress (60 s + allowance), a minute of slack.
    let args = std::fs::read_to_string(bin.join("args")).unwrap();
    assert!(
        args.contains(&format!(
            "--time={}",
            slurm::time_limit_minutes(600 + 60 + SHARED_CALL_ALLOWANCE_SECS)
        )),
        "{args}"
    );
    for h in &hs {
        assert_eq!(h.slurm_id, "77");
        assert_eq!(std::fs::read_to_string(h.dir.join("slurm-id")).unwrap(), "77\nshared 3\n");
    }
    // The first call runs; the others wait for the allocation to claim them.
    write_started(&hs[0].dir);
    let st = c.status(&hs.iter().map(|h| h.id.clone()).collect::<Vec<_>>()).unwrap();
    assert_eq!(st[0].state, State::Running);
    assert_eq!(st[1].state, State::Pending);
    assert_eq!(st[1].reason, "waiting for an allocation of its map to claim it");
    // Cancelling one call that has not started ends it at once, without scancel.
    let st = c.cancel(std::slice::from_ref(&hs[2].id)).unwrap();
    assert_eq!(st[0].state, State::Cancelled);
    assert_eq!(st[0].reason, "cancelled by the user before it started");
    assert!(!log.exists(), "scancel must not be called for a map's allocations");
    assert_eq!(c.status(std::slice::from_ref(&hs[1].id)).unwrap()[0].state, State::Pending);
    // Cancelling the last live call cancels the allocation in Slurm, once
    // (the list of its calls says the others are over).
    let list = c.root().join("shared-77.calls");
    let want: String = hs.iter().map(|h| format!("{}\n", h.id)).collect();
    assert_eq!(std::fs::read_to_string(&list).unwrap(), want);
    write_completed(&hs[0].dir, 0, "exited with code 0", 5);
    let _ = c.cancel(std::slice::from_ref(&hs[1].id));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "77\n");
    // Without the list, only a cancel of all its live calls at once does.
    std::fs::remove_file(&log).unwrap();
    let hs = c.submit_many(&reqs).unwrap();
    std::fs::remove_file(c.root().join("shared-77.calls")).unwrap();
    let _ = c.cancel(std::slice::from_ref(&hs[0].id));
    assert!(!log.exists());
    let _ = c.cancel(&hs[1..].iter().map(|h| h.id.clone()).collect::<Vec<_>>());
    assert!(!log.exists(), "two of three calls: the allocation still has one to run");
    let _ = c.cancel(&hs.iter().map(|h| h.id.clone()).collect::<Vec<_>>());
    assert!(!log.exists(), "all are over already: nothing left for scancel");
}

#[test]
fn root_is_created_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let c = client(tmp.path(), Slurm::default());
    for p in [
        tmp.path().join("home/.delegate"),
        tmp.path().join("home/.delegate/jobs"),
    ] {
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o700);
    }
    assert!(c.root().is_absolute());
    let id = JobId::new();
    assert_eq!(c.job_dir(&id), c.root().join(id.as_str()));
    assert!(matches!(c.status(&[id]), Err(ClientError::NoSuchJob { .. })));
    let rel = Client::new(Config {
        root: "relative/root".into(),
        runner: "/x".into(),
        slurm: Slurm::default(),
        calls_per_allocation: None,
    });
    assert!(matches!(rel, Err(ClientError::Root { .. })));
}

#[test]
fn submit_then_lost_then_stable() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    // sbatch records its arguments and stdin; squeue lists nothing.
    let slurm = fake_slurm(
        &bin,
        &format!("echo \"$@\" > {0}/args; cat > {0}/script; echo '42;cluster'", bin.display()),
        "exit 0",
    );
    let c = client(tmp.path(), slurm);
    let mut req = SubmitRequest::command(vec!["echo".into(), "hi".into()]);
    req.image = Some("img:1".into());
    req.payload = Some(b"abc".to_vec());
    let h = c.submit(&req).unwrap();
    assert_eq!(h.slurm_id, "42");
    let args = std::fs::read_to_string(bin.join("args")).unwrap();
    assert!(args.contains(&format!("--job-name={}", h.id)), "{args}");
    assert!(args.contains("--time=11"), "{args}");
    let script = std::fs::read_to_string(bin.join("script")).unwrap();
    assert_eq!(script, format!("#!/bin/sh\nexec '/nonexistent/runner' '{}'\n", h.dir.display()));
    assert_eq!(std::fs::read(h.dir.join("payload")).unwrap(), b"abc");
    assert_eq!(c.spec(&h.id).unwrap().image, "img:1");
    // Slurm no longer lists it and there is no outcome: lost, written once.
    std::fs::write(c.log_path(&h.id), "slurm_script: exec: /nonexistent/runner: not found\n").unwrap();
    let s = c.status(std::slice::from_ref(&h.id)).unwrap();
    assert_eq!(s[0].state, State::Lost);
    assert!(s[0].reason.contains("gone"), "{}", s[0].reason);
    assert!(s[0].reason.contains("not found"), "{}", s[0].reason);
    let again = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_secs(5))).unwrap();
    assert_eq!(again[0].reason, s[0].reason);
    assert_eq!(again[0].finished_ms, s[0].finished_ms);
    let listed = c.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, h.id);
}

#[test]
fn refused_and_sbatch_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let c = client(
        tmp.path(),
        fake_slurm(
            &bin,
            "echo 'sbatch: error: Batch job submission failed: Invalid partition' >&2; exit 1",
            "",
        ),
    );
    let req = true_req();
    match c.submit(&req) {
        Err(ClientError::SubmitFailed { id, reason }) => {
            assert_eq!(
                reason,
                "sbatch failed: sbatch: error: Batch job submission failed: Invalid partition"
            );
            // Slurm made no job: no job directory is left behind.
            assert!(matches!(c.status(&[id]), Err(ClientError::NoSuchJob { .. })));
        }
        other => panic!("{other:?}"),
    }
    assert!(c.list().unwrap().is_empty());
    // A refusal by the accounting policy: the one sentence, nothing left.
    let c = client(
        tmp.path(),
        fake_slurm(
            &bin,
            "echo 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2; \
             echo 'sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user'\\''s size and/or time limits)' >&2; exit 1",
            "",
        ),
    );
    let reqs = vec![req.clone(), req.clone(), req.clone()];
    match c.submit_many(&reqs) {
        Err(e @ ClientError::Refused(delegate_client::slurm::Refusal::SubmitLimit)) => {
            let m = e.to_string();
            assert!(m.contains("MaxSubmitJobsPerUser") && !m.contains("violates"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert!(c.list().unwrap().is_empty());
    // A job the runner refused: Slurm says COMPLETED, the log says why.
    let c = client(
        tmp.path(),
        fake_slurm(&bin, "echo 7", "echo '7|COMPLETED|None'; echo '8|RUNNING|None'"),
    );
    let h = c.submit(&req).unwrap();
    std::fs::write(
        c.log_path(&h.id),
        "delegate: refused: cpus 99 is more than the site maximum of 2\n",
    )
    .unwrap();
    let s = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_secs(5))).unwrap();
    assert_eq!(s[0].state, State::Failed);
    assert!(s[0].refused);
    assert_eq!(s[0].reason, "cpus 99 is more than the site maximum of 2");
}

#[test]
fn cancel_marks_and_scancels_once() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let mut slurm = fake_slurm(&bin, "echo $$", "exit 0");
    // scancel records its arguments (all ids in one call).
    let log = bin.join("scancel.log");
    std::fs::write(&slurm.scancel, format!("#!/bin/sh\necho \"$@\" >> {}\n", log.display())).unwrap();
    slurm.squeue = bin.join("squeue");
    let c = client(tmp.path(), slurm);
    let req = true_req();
    let a = c.submit(&req).unwrap();
    let b = c.submit(&req).unwrap();
    let st = c.cancel(&[a.id.clone(), b.id.clone()]).unwrap();
    assert!(st
        .iter()
        .all(|s| s.state == State::Cancelled && s.reason == "cancelled by the user"));
    assert!(a.dir.join("cancel").exists());
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(calls.trim(), format!("{} {}", a.slurm_id, b.slurm_id));
    // Cancelling a finished job changes nothing and calls no scancel.
    let again = c.cancel(std::slice::from_ref(&a.id)).unwrap();
    assert_eq!(again[0].finished_ms, st[0].finished_ms);
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
}

#[test]
fn wait_wakes_on_outcome_and_times_out() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let c = client(tmp.path(), fake_slurm(&bin, "echo 9", "echo '9|RUNNING|None'"));
    let req = true_req();
    let h = c.submit(&req).unwrap();
    let s = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_millis(300))).unwrap();
    assert_eq!(s[0].state, State::Running, "{:?}", s);
    let dir = h.dir.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        write_completed(&dir, 3, "exited with 3", 1000);
    });
    let t0 = Instant::now();
    let s = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_secs(10))).unwrap();
    writer.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(s[0].state, State::Completed);
    assert_eq!(s[0].exit_code, Some(3));
    assert_eq!(exit_status_for(&s[0]), Some(3));
    assert_eq!(s[0].host.as_deref(), Some("n1"));
}

#[test]
fn consecutive_waits_share_one_squeue_per_interval() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let log = tmp.path().join("squeue-calls");
    let c = client(
        tmp.path(),
        fake_slurm(
            &bin,
            "echo 9",
            &format!("echo x >> {}; echo '9|PENDING|Resources'", log.display()),
        ),
    );
    let req = true_req();
    let h = c.submit(&req).unwrap();
    // Short rounds, as the Python waiter makes them: the first asks
    // Slurm, the next ones within the interval read only the files.
    for _ in 0..4 {
        let s = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_millis(100))).unwrap();
        assert_eq!(s[0].state, State::Pending, "{s:?}");
    }
    // So do the waits of another client of the same root (Python makes
    // one per call).
    let c2 = Client::new(c.config().clone()).unwrap();
    c2.wait(std::slice::from_ref(&h.id), Some(Duration::from_millis(100))).unwrap();
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
}

#[test]
fn wait_any_returns_when_one_job_is_over() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let c = client(tmp.path(), fake_slurm(&bin, "echo 9", "echo '9|RUNNING|None'"));
    let req = true_req();
    let a = c.submit(&req).unwrap();
    let b = c.submit(&req).unwrap();
    let dir = b.dir.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        write_completed(&dir, 0, "exited with code 0", 100);
    });
    let t0 = Instant::now();
    let s = c
        .wait_any_with(&[a.id.clone(), b.id.clone()], Some(Duration::from_secs(10)), || false)
        .unwrap();
    writer.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(s.len(), 2);
    assert!(!s[0].is_terminal(), "{s:?}");
    assert_eq!(s[1].state, State::Completed);
}

/// Waits `secs` on one pending job whose squeue answer is `answer` (a shell
/// snippet); returns how many times squeue ran.
fn squeue_calls_during_wait(secs: u64, answer: &str) -> usize {
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let log = tmp.path().join("squeue-calls");
    let body = format!("echo x >> {log}; n=$(wc -l < {log}); {answer}", log = log.display());
    let c = client(tmp.path(), fake_slurm(&bin, "echo 9", &body));
    let h = c.submit(&true_req()).unwrap();
    let s = c.wait(std::slice::from_ref(&h.id), Some(Duration::from_secs(secs))).unwrap();
    assert_eq!(s[0].state, State::Pending, "{s:?}");
    std::fs::read_to_string(&log).unwrap().lines().count()
}

#[test]
fn a_wait_asks_slurm_less_often_while_nothing_changes() {
    // The same answer every time: asked at 0, 2 and 6 s (then 14 s).
    let quiet = squeue_calls_during_wait(9, "echo '9|PENDING|Priority'");
    assert_eq!(quiet, 3, "squeue calls in 9 s of an unchanging pending job");
}

#[test]
fn a_known_jobs_changing_reason_does_not_make_the_wait_ask_sooner() {
    // The pending reason changes at every answer (as it does in a busy
    // queue): still asked at 0, 2 and 6 s only. Only a newly waited-for
    // job restarts the interval (wait.rs, `new_job_waited_for`).
    let busy = squeue_calls_during_wait(
        9,
        "if [ $((n % 2)) = 0 ]; then r=Priority; else r=Resources; fi; echo \"9|PENDING|$r\"",
    );
    assert_eq!(busy, 3, "squeue calls in 9 s of a job whose reason keeps changing");
}

#[test]
fn a_running_call_names_the_node_slurm_runs_it_on_over_an_earlier_start() {
    // Issue 52, seen in the hub: attempt 1's start record (n1) still
    // visible through a caching home while Slurm runs attempt 2 on worker2.
    // The status's host (the notebook's line) is Slurm's node, and its
    // start time unknown, not attempt 1's.
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let c = client(tmp.path(), fake_slurm(&bin, "echo 7", "echo '7|RUNNING|worker2|None'"));
    let h = c.submit(&true_req()).unwrap();
    write_started(&c.job_dir(&h.id));
    let s = c.status(std::slice::from_ref(&h.id)).unwrap();
    assert_eq!(s[0].state, State::Running, "{s:?}");
    assert_eq!(s[0].host.as_deref(), Some("worker2"), "{s:?}");
    // (its attempts record not visible either: the history counts the
    // start record's attempt as the lost one)
    assert_eq!(
        s[0].reason, "running on worker2; ran again on worker2 (attempt 2): n1 was lost",
        "{s:?}"
    );
    assert_eq!(s[0].started_ms, None, "{s:?}");
    // Slurm on the recorded node: the record's host and start.
    let c = client(tmp.path(), fake_slurm(&bin, "echo 7", "echo '7|RUNNING|n1|None'"));
    let s = c.status(std::slice::from_ref(&h.id)).unwrap();
    assert_eq!(s[0].host.as_deref(), Some("n1"), "{s:?}");
    assert!(s[0].started_ms.is_some(), "{s:?}");
}

#[test]
fn a_lost_call_whose_start_record_is_not_visible_names_slurms_node() {
    // CI on the machines, issue 52: a call with --retries 0 whose engine
    // died before its start record showed through the caching home ended
    // lost with no host. The host is the node Slurm ran it on.
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let c = client(tmp.path(), fake_slurm(&bin, "echo 7", "echo '7|NODE_FAIL|worker1|None'"));
    let h = c.submit(&true_req()).unwrap();
    let s = c.status(std::slice::from_ref(&h.id)).unwrap();
    assert_eq!(s[0].state, State::Lost, "{s:?}");
    assert_eq!(s[0].host.as_deref(), Some("worker1"), "{s:?}");
    // The recorded outcome says so too: a second reader sees the same.
    let s = c.status(std::slice::from_ref(&h.id)).unwrap();
    assert_eq!(s[0].host.as_deref(), Some("worker1"), "{s:?}");
}

#[test]
fn a_directory_a_new_attempt_replaced_reads_as_running_again() {
    // The acceptance day on the machines, stop 64: through the caching
    // home the notebook went on reading the directory a new attempt had
    // replaced (its spec and slurm-id moved out, its lost start record
    // left) and ended the call "never submitted". It runs again; nothing
    // is written into that directory.
    let tmp = tempfile::tempdir().unwrap();
    let bin = bin_dir(tmp.path());
    let c = client(tmp.path(), fake_slurm(&bin, "echo 7", "echo '7|RUNNING|worker2|None'"));
    let h = c.submit(&true_req()).unwrap();
    let dir = tmp.path().join("home/.delegate/jobs").join(h.id.to_string());
    write_started(&dir);
    let spec_at = std::fs::read(dir.join("spec")).unwrap();
    for f in ["spec", "payload", "slurm-id"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    // (made old: past the grace of a submission)
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::open(&dir).unwrap().set_modified(old).unwrap();
    let s = c.status(std::slice::from_ref(&h.id)).unwrap();
    assert_eq!(s[0].state, State::Running, "{s:?}");
    assert!(s[0].reason.contains("new attempt's directory is not visible"), "{s:?}");
    assert_eq!(s[0].host, None, "{s:?}");
    assert!(!dir.join("outcome").exists() && !dir.join("spec").exists());
    // The directory of the call's own (a spec there): as before.
    std::fs::write(dir.join("spec"), spec_at).unwrap();
    let s = c.status(std::slice::from_ref(&h.id)).unwrap();
    assert_ne!(s[0].reason, delegate_client::REPLACED_VIEW, "{s:?}");
}

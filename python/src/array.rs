//! `map` as ONE sbatch: a Slurm job array whose element `i` runs the
//! sandbox-runner on the `i`-th job directory.
//!
//! Each call still gets its own job directory (spec, payload, its own
//! `slurm-id` of the form `<array-id>_<i>`, its own outcome and result), so
//! status, wait, cancel and reattach work per call through the client
//! library exactly as for a single job. Only the submission differs from
//! [`Client::submit`]: the directories are all prepared first, then one
//! `sbatch` whose script carries `#SBATCH --array=0-<n-1>` and picks its
//! directory from `$SLURM_ARRAY_TASK_ID`. Each element's shell redirects its
//! output to `<root>/<job-id>.log`, the per-job Slurm log the client reads
//! for a refusal or a lost job's reason.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use delegate_broker::client::{Client, ClientError, SubmitRequest};
use delegate_broker::policy::Policy;
use delegate_broker::protocol::{
    self, atomic_write_at, encode, now_ms, open_dir_nofollow, write_record_at, JobId, Outcome, ProtocolError,
    Resources, Spec, State, Writer, MAX_PAYLOAD_BYTES,
};
use delegate_broker::slurm::{shell_quote, BatchRequest, SlurmError};
use nix::errno::Errno;
use nix::sys::stat::Mode;

type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Upper bound of one array (Slurm's default MaxArraySize is 1001).
pub const MAX_ARRAY: usize = 1000;

struct Prepared {
    id: JobId,
    dir: PathBuf,
    fd: OwnedFd,
}

fn spec_for(req: &SubmitRequest, image: &str) -> Result<Spec> {
    let spec = Spec {
        job_id: JobId::new(),
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        created_ms: now_ms(),
        image: image.to_owned(),
        task: req.task.clone(),
        resources: Resources {
            cpus: req.cpus,
            mem_bytes: req.mem_bytes,
            time_limit_secs: req.time_limit_secs,
            ..Resources::default()
        },
        env: req.env.clone(),
    };
    spec.validate().map_err(|e| match e {
        ProtocolError::InvalidSpec(m) => ClientError::InvalidRequest(m),
        other => other.into(),
    })?;
    encode(&spec).map_err(|e| ClientError::InvalidRequest(format!("the spec is too large ({e})")))?;
    Ok(spec)
}

fn prepare(root: &Path, root_fd: &OwnedFd, mut spec: Spec, payload: Option<&[u8]>) -> Result<Prepared> {
    let mut attempts = 0;
    loop {
        match nix::sys::stat::mkdirat(root_fd, spec.job_id.as_str(), Mode::from_bits_truncate(0o700)) {
            Ok(()) => break,
            Err(Errno::EEXIST) if attempts < 5 => {
                attempts += 1;
                spec.job_id = JobId::new();
            }
            Err(e) => {
                return Err(ClientError::Io {
                    what: format!("cannot create the job directory {}", root.join(spec.job_id.as_str()).display()),
                    source: e.into(),
                })
            }
        }
    }
    let dir = root.join(spec.job_id.as_str());
    let fd = open_dir_nofollow(&dir)?;
    write_record_at(&fd, &dir, &spec)?;
    if let Some(p) = payload {
        atomic_write_at(&fd, &dir, protocol::PAYLOAD, p, 0o600)?;
    }
    Ok(Prepared {
        id: spec.job_id,
        dir,
        fd,
    })
}

fn fail_all(jobs: &[Prepared], reason: &str) {
    for j in jobs {
        let outcome = Outcome {
            state: State::Failed,
            exit_code: None,
            reason: reason.to_owned(),
            refused: false,
            oom_killed: false,
            started_ms: None,
            finished_ms: now_ms(),
            host: String::new(),
            writer: Writer::Client,
        };
        let _ = write_record_at(&j.fd, &j.dir, &outcome);
    }
}

/// The batch script of an array: element `i` execs the runner on directory `i`.
pub fn array_script(runner: &Path, root: &Path, ids: &[JobId]) -> String {
    let mut s = format!("#!/bin/sh\n#SBATCH --array=0-{}\n", ids.len().saturating_sub(1));
    s.push_str("case \"$SLURM_ARRAY_TASK_ID\" in\n");
    for (i, id) in ids.iter().enumerate() {
        let dir = root.join(id.as_str());
        let log = root.join(format!("{id}.log"));
        s.push_str(&format!(
            "{i}) exec >>{} 2>&1; exec {} {} ;;\n",
            shell_quote(&log.display().to_string()),
            shell_quote(&runner.display().to_string()),
            shell_quote(&dir.display().to_string())
        ));
    }
    s.push_str("esac\necho \"delegate: no job directory for array task $SLURM_ARRAY_TASK_ID\" >&2\nexit 1\n");
    s
}

/// Submits every request in one sbatch (a job array); returns the job ids in
/// the order of `reqs`. All requests must ask for the same resources (they
/// come from one `map`).
pub fn submit_array(client: &Client, reqs: &[SubmitRequest]) -> Result<Vec<JobId>> {
    let first = match reqs.first() {
        Some(r) => r,
        None => return Ok(Vec::new()),
    };
    if reqs.len() > MAX_ARRAY {
        return Err(ClientError::InvalidRequest(format!(
            "{} calls in one map, more than the limit of {MAX_ARRAY} of one job array",
            reqs.len()
        )));
    }
    if reqs.iter().any(|r| (r.cpus, r.mem_bytes, r.time_limit_secs, &r.image) != (first.cpus, first.mem_bytes, first.time_limit_secs, &first.image)) {
        return Err(ClientError::InvalidRequest("the calls of one job array must ask for the same resources".into()));
    }
    for r in reqs {
        if r.payload.as_ref().is_some_and(|p| p.len() as u64 > MAX_PAYLOAD_BYTES) {
            return Err(ClientError::InvalidRequest(format!(
                "a payload is larger than the limit of {MAX_PAYLOAD_BYTES} bytes"
            )));
        }
    }
    let image = match &first.image {
        Some(i) => i.clone(),
        None => Policy::load_for_client()?.default_image,
    };
    let root = client.root().to_path_buf();
    let root_fd = open_dir_nofollow(&root)?;
    let mut jobs = Vec::with_capacity(reqs.len());
    for r in reqs {
        let spec = spec_for(r, &image)?;
        match prepare(&root, &root_fd, spec, r.payload.as_deref()) {
            Ok(p) => jobs.push(p),
            Err(e) => {
                fail_all(&jobs, &format!("another call of the same map could not be prepared: {e}"));
                return Err(e);
            }
        }
    }
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id.clone()).collect();
    let batch = BatchRequest {
        job_name: format!("{}-array", ids[0]),
        chdir: root.clone(),
        output: root.join(format!("{}.array.log", ids[0])),
        cpus: first.cpus,
        time_limit_secs: first.time_limit_secs,
        script: array_script(&client.config().runner, &root, &ids),
        hold: false,
    };
    let array_id = match client.config().slurm.submit(&batch) {
        Ok(s) => s,
        Err(e) => {
            let why = match &e {
                SlurmError::Failed { message, .. } => message.clone(),
                other => other.to_string(),
            };
            let reason = format!("sbatch failed: {why}");
            fail_all(&jobs, &reason);
            return Err(ClientError::SubmitFailed { id: ids[0].clone(), reason });
        }
    };
    for (i, j) in jobs.iter().enumerate() {
        let sid = format!("{array_id}_{i}");
        if let Err(e) = atomic_write_at(&j.fd, &j.dir, protocol::SLURM_ID, format!("{sid}\n").as_bytes(), 0o644) {
            let _ = client.config().slurm.cancel(std::slice::from_ref(&array_id));
            let reason = format!("its Slurm id could not be recorded ({e}); Slurm job array {array_id} was cancelled");
            fail_all(&jobs, &reason);
            return Err(ClientError::SubmitFailed { id: j.id.clone(), reason });
        }
    }
    Ok(ids)
}

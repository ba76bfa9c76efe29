//! Submission: job directories prepared, then ONE `sbatch` for all the
//! calls of a submission (a batch job, a job array, or a map's allocations
//! that pull its calls).

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use delegate_protocol::{
    self as protocol, atomic_write_at_deferred, encode, now_ms, sync_filesystem, write_record_at_deferred, JobId,
    ProtocolError, Resources, Spec, State, MAX_PAYLOAD_BYTES,
};
use nix::errno::Errno;
use nix::sys::stat::Mode;

use crate::plan::{plan_map, MapPlan, MAX_ARRAY};
use crate::site_terms::SiteTerms;
use crate::slurm::{self, BatchRequest, SlurmError};
use crate::{Client, ClientError, JobHandle, Result, SubmitRequest};

impl Client {
    /// Creates the job directory, writes the spec and payload, submits one
    /// batch job and records its Slurm id.
    pub fn submit(&self, req: &SubmitRequest) -> Result<JobHandle> {
        let mut handles = self.submit_many(std::slice::from_ref(req))?;
        handles
            .pop()
            .ok_or_else(|| ClientError::InvalidRequest("nothing was submitted".into()))
    }

    /// Submits every request with ONE `sbatch`: a plain batch job for one
    /// request, a Slurm job array for several (element `i` runs the runner
    /// on the `i`-th job directory, so each call still gets its own job
    /// directory, outcome and single-use sandbox, and status, wait, cancel
    /// and reattach work per call). Several requests must ask for the same
    /// resources and image (they come from one `map`). Returns the handles
    /// in the order of `reqs`.
    pub fn submit_many(&self, reqs: &[SubmitRequest]) -> Result<Vec<JobHandle>> {
        let Some(first) = reqs.first() else {
            return Ok(Vec::new());
        };
        check_submission(reqs)?;
        let site = SiteTerms::load();
        let image = site.image(first.image.as_ref())?;
        let retries = site.retries(first)?;
        let specs = reqs
            .iter()
            .map(|r| self.spec_for(r, &image, retries))
            .collect::<Result<Vec<_>>>()?;
        if let Some(spec) = specs.first() {
            // (the calls of one submission ask for the same resources)
            site.check_resources(&spec.resources)?;
        }
        let jobs = self.prepare_all(reqs, specs, &site)?;
        let ids: Vec<JobId> = jobs.iter().map(|j| j.0.clone()).collect();
        let dirs: Vec<PathBuf> = jobs.iter().map(|j| j.1.clone()).collect();
        let class = self.class_for(first, jobs.len());
        let map = self.allocations(first, jobs.len(), &site, class.as_ref().and_then(|c| c.1));
        let mut batch = self.batch_request(first, &ids, &dirs, map);
        // Slurm queues a call again when its node is lost (the runner then
        // starts a new attempt, within the call's retries).
        batch.requeue = retries > 0 && first.resources.nodes < 2;
        batch.constraint = class.map(|c| c.0);
        let slurm_id = self.sbatch(&batch, &jobs, &ids[0])?;
        self.record_slurm_ids(&slurm_id, &jobs, &ids, map.is_some())
    }

    /// Every call's job directory, made and synced; each distinct shipment
    /// measured (and refused) once, before any directory is made (a map's
    /// calls share theirs). On an error nothing is left behind.
    fn prepare_all(
        &self,
        reqs: &[SubmitRequest],
        specs: Vec<Spec>,
        site: &SiteTerms,
    ) -> Result<Vec<(JobId, PathBuf, OwnedFd)>> {
        let payload_max = reqs.iter().map(|r| r.payload.as_ref().map_or(0, |p| p.len() as u64)).max();
        let mut shipments: Vec<(&[PathBuf], crate::ship::Plan)> = Vec::new();
        for r in reqs.iter().filter(|r| !r.files.is_empty()) {
            if !shipments.iter().any(|(f, _)| *f == r.files.as_slice()) {
                shipments.push((&r.files, self.ship_plan(&r.files, payload_max.unwrap_or(0), site)?));
            }
        }
        let mut jobs: Vec<(JobId, PathBuf, OwnedFd)> = Vec::with_capacity(reqs.len());
        for (spec, req) in specs.into_iter().zip(reqs) {
            let shipment = shipments.iter().find(|(f, _)| *f == req.files.as_slice()).map(|(_, p)| p);
            match self.prepare(spec, req.payload.as_deref(), shipment) {
                Ok(j) => jobs.push(j),
                Err(e) => {
                    self.withdraw_all(&jobs);
                    return Err(e);
                }
            }
        }
        // The job directories were written without a sync each; one sync
        // of the filesystem makes them all durable before Slurm may start
        // a runner on them.
        if let Err(e) = sync_filesystem(&self.root_fd, &self.root) {
            self.withdraw_all(&jobs);
            return Err(e.into());
        }
        Ok(jobs)
    }

    /// The hardware class a submission keeps to, as `--constraint` and the
    /// number of its usable nodes: a map's calls stay on the partition's
    /// largest class, a multi-node job's nodes on any one class, unless the
    /// request mixes classes (or the partition has one class only). Calls
    /// that ask for GPUs choose among the nodes with as many GPUs (a GPU
    /// node's class includes its GPUs' model, memory, driver, MIG and ECC).
    fn class_for(&self, first: &SubmitRequest, calls: usize) -> Option<(String, Option<u32>)> {
        if first.mix_classes || (calls < 2 && first.resources.nodes < 2) {
            return None;
        }
        let rows = match self.config.slurm.nodes() {
            Ok(r) => slurm::nodes::with_gpus(r, first.resources.gpus),
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask Slurm for the nodes' classes; the calls may mix classes");
                return None;
            }
        };
        if calls < 2 {
            return slurm::nodes::one_class_of_any(&rows, first.resources.nodes).map(|c| (c, None));
        }
        let choice = slurm::nodes::choose_class(&rows)?;
        tracing::info!(
            class = %choice.id, nodes = choice.nodes, classes = choice.classes,
            "the calls keep to one hardware class"
        );
        Some((choice.constraint(), Some(choice.nodes)))
    }

    /// The allocations that pull `calls` calls (sharing on: the site's
    /// calls_per_allocation and this client's own setting above 1; the
    /// partition's nodes and limit; the site's max_allocation_time), or
    /// None: one Slurm job per call.
    fn allocations(
        &self,
        first: &SubmitRequest,
        calls: usize,
        site: &SiteTerms,
        class_nodes: Option<u32>,
    ) -> Option<MapPlan> {
        let sites = site.calls_per_allocation();
        let per_allocation = self.config.calls_per_allocation.map_or(sites, |n| n.min(sites));
        if calls <= 1 || per_allocation <= 1 {
            return None;
        }
        let max_allocation = site.max_allocation_secs();
        match self.config.slurm.partition_info() {
            Ok(mut info) => {
                // (the nodes of the one class the calls keep to)
                info.nodes = class_nodes.map_or(info.nodes, |n| n.min(info.nodes));
                plan_map(calls, per_allocation, first.resources.time_limit_secs, &info, max_allocation)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask Slurm about the partition; one Slurm job per call");
                None
            }
        }
    }

    /// The one sbatch of a submission: a map's allocations that pull its
    /// calls when `map` says so, a multi-node rank job, one plain job, or
    /// an array of one job per call.
    fn batch_request(
        &self,
        first: &SubmitRequest,
        ids: &[JobId],
        dirs: &[PathBuf],
        map: Option<MapPlan>,
    ) -> BatchRequest {
        let calls = ids.len();
        if let Some(map) = map {
            BatchRequest {
                job_name: format!("{}-map", ids[0]),
                chdir: self.root.clone(),
                output: self.root.join(if map.allocations == 1 {
                    format!("{}.map.log", ids[0])
                } else {
                    format!("{}.map-%a.log", ids[0])
                }),
                cpus: first.resources.cpus,
                time_limit_secs: map.time_limit_secs,
                script: slurm::with_gpus(
                    slurm::pull_script(&self.config.runner, dirs, map.allocations),
                    first.resources.gpus,
                ),
                hold: first.hold,
                calls,
                constraint: None,
                map: true,
                requeue: true,
            }
        } else if calls == 1 && first.resources.nodes > 1 {
            BatchRequest {
                job_name: ids[0].to_string(),
                chdir: self.root.clone(),
                output: self.log_path(&ids[0]),
                cpus: first.resources.cpus,
                time_limit_secs: first.resources.time_limit_secs,
                script: slurm::ranks_script(&self.config.runner, &dirs[0], first.resources.nodes),
                hold: first.hold,
                calls,
                constraint: None,
                map: false,
                requeue: false,
            }
        } else if calls == 1 {
            BatchRequest {
                job_name: ids[0].to_string(),
                chdir: self.root.clone(),
                output: self.log_path(&ids[0]),
                cpus: first.resources.cpus,
                time_limit_secs: first.resources.time_limit_secs,
                script: slurm::with_gpus(slurm::batch_script(&self.config.runner, &dirs[0]), first.resources.gpus),
                hold: first.hold,
                calls,
                constraint: None,
                map: false,
                requeue: false,
            }
        } else {
            let logs: Vec<PathBuf> = ids.iter().map(|id| self.log_path(id)).collect();
            BatchRequest {
                job_name: format!("{}-array", ids[0]),
                chdir: self.root.clone(),
                output: self.root.join(format!("{}.array.log", ids[0])),
                cpus: first.resources.cpus,
                time_limit_secs: first.resources.time_limit_secs,
                script: slurm::with_gpus(slurm::array_script(&self.config.runner, dirs, &logs), first.resources.gpus),
                hold: first.hold,
                calls,
                constraint: None,
                map: false,
                requeue: false,
            }
        }
    }

    /// Runs sbatch; on failure nothing of the submission is left behind
    /// (or, when a Slurm job may exist, its directories say why they failed).
    fn sbatch(&self, batch: &BatchRequest, jobs: &[(JobId, PathBuf, OwnedFd)], first_id: &JobId) -> Result<String> {
        match self.config.slurm.submit(batch) {
            Ok(s) => Ok(s),
            // Slurm said no (or sbatch could not even start): no Slurm job
            // exists, so no job directory may stay behind either.
            Err(SlurmError::Refused(r)) => {
                self.withdraw_all(jobs);
                Err(ClientError::Refused(r))
            }
            Err(e @ (SlurmError::Failed { .. } | SlurmError::Spawn { .. })) => {
                self.withdraw_all(jobs);
                let why = match &e {
                    SlurmError::Failed { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                Err(ClientError::SubmitFailed {
                    id: first_id.clone(),
                    reason: format!("sbatch failed: {why}"),
                })
            }
            // No answer, or no id: a Slurm job may exist; the directories
            // stay, marked failed with the reason, for whoever looks.
            Err(e) => {
                let reason = format!("sbatch failed: {e}");
                self.fail_all(jobs, &reason);
                Err(ClientError::SubmitFailed { id: first_id.clone(), reason })
            }
        }
    }

    /// Writes each call's `slurm-id` (and a map's list of calls), synced
    /// together; the handles in the order of the calls. The calls of a map
    /// all name the map's job (every element of its array): whichever
    /// allocation claims a call runs it.
    fn record_slurm_ids(
        &self,
        slurm_id: &str,
        jobs: &[(JobId, PathBuf, OwnedFd)],
        ids: &[JobId],
        map: bool,
    ) -> Result<Vec<JobHandle>> {
        let mut handles = Vec::with_capacity(jobs.len());
        // The Slurm id of call `i`.
        let sid_of = |i: usize| {
            if map || jobs.len() == 1 {
                slurm_id.to_string()
            } else {
                format!("{slurm_id}_{i}")
            }
        };
        let shared = map.then_some(jobs.len() as u32);
        if map {
            // The map's calls, for a cancel that reaches its last live call
            // one by one. Best effort: without the list only a cancel of
            // all its calls at once cancels the allocations.
            let text: String = ids.iter().map(|id| format!("{id}\n")).collect();
            if let Err(e) = atomic_write_at_deferred(
                &self.root_fd,
                &self.root,
                &protocol::shared_calls_name(slurm_id),
                text.as_bytes(),
                0o644,
            ) {
                tracing::warn!(error = %e, slurm_id = %slurm_id, "cannot record the calls of a map");
            }
        }
        for (i, (id, dir, fd)) in jobs.iter().enumerate() {
            let sid = sid_of(i);
            let text = protocol::format_slurm_id(&sid, shared);
            if let Err(e) = atomic_write_at_deferred(fd, dir, protocol::SLURM_ID, text.as_bytes(), 0o644) {
                // Without the id nobody can follow the job: withdraw it.
                let _ = self.config.slurm.cancel(&[slurm_id.to_string()]);
                let reason = format!("its Slurm id could not be recorded ({e}); Slurm job {slurm_id} was cancelled");
                self.fail_all(jobs, &reason);
                return Err(ClientError::SubmitFailed { id: id.clone(), reason });
            }
            handles.push(JobHandle {
                id: id.clone(),
                slurm_id: sid,
                dir: dir.clone(),
            });
        }
        // The recorded ids, durable together (a failure leaves them written,
        // only not yet on disk: the jobs are followed all the same).
        if let Err(e) = sync_filesystem(&self.root_fd, &self.root) {
            tracing::warn!(error = %e, "cannot sync the recorded Slurm ids to disk");
        }
        tracing::info!(jobs = handles.len(), map, slurm_id = %slurm_id, "submitted");
        Ok(handles)
    }

    /// The spec of a request, checked for bounds before anything is written.
    pub(crate) fn spec_for(&self, req: &SubmitRequest, image: &str, retries: u32) -> Result<Spec> {
        if let Some(p) = &req.payload {
            if p.len() as u64 > MAX_PAYLOAD_BYTES {
                return Err(ClientError::InvalidRequest(format!(
                    "the payload is {} bytes, more than the limit of {MAX_PAYLOAD_BYTES}",
                    p.len()
                )));
            }
        }
        let spec = Spec {
            job_id: JobId::new(),
            uid: self.uid,
            gid: self.gid,
            created_ms: now_ms(),
            image: image.to_owned(),
            task: req.task.clone(),
            resources: Resources { retries, ..req.resources.clone() },
            env: req.env.clone(),
        };
        spec.validate().map_err(|e| match e {
            ProtocolError::InvalidSpec(m) => ClientError::InvalidRequest(m),
            other => other.into(),
        })?;
        encode(&spec).map_err(|e| ClientError::InvalidRequest(format!("the spec is too large ({e})")))?;
        Ok(spec)
    }

    /// Creates a fresh job directory (mode 0700) and writes the spec and
    /// payload into it. A collision of ids is astronomically unlikely, but
    /// retried rather than sharing a directory.
    fn prepare(
        &self,
        mut spec: Spec,
        payload: Option<&[u8]>,
        shipment: Option<&crate::ship::Plan>,
    ) -> Result<(JobId, PathBuf, OwnedFd)> {
        let mut attempts = 0;
        let fd = loop {
            match nix::sys::stat::mkdirat(&self.root_fd, spec.job_id.as_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) => break self.open_job_dir(&spec.job_id)?,
                Err(Errno::EEXIST) if attempts < 5 => {
                    attempts += 1;
                    spec.job_id = JobId::new();
                }
                Err(e) => {
                    return Err(ClientError::Io {
                        what: format!("cannot create the job directory {}", self.job_dir(&spec.job_id).display()),
                        source: e.into(),
                    })
                }
            }
        };
        let dir = self.job_dir(&spec.job_id);
        // Made durable by the one sync of the submission (submit_many).
        write_record_at_deferred(&fd, &dir, &spec)?;
        if let Some(p) = payload {
            atomic_write_at_deferred(&fd, &dir, protocol::PAYLOAD, p, 0o600)?;
        }
        if let Some(plan) = shipment {
            if let Err(e) = crate::ship::execute(plan, &dir) {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        }
        Ok((spec.job_id, dir, fd))
    }

    /// The shipment of `files` measured against the site's job size, less
    /// what the job directory holds anyway (spec, payload, headroom for the
    /// call's own output).
    fn ship_plan(&self, files: &[PathBuf], payload_bytes: u64, site: &SiteTerms) -> Result<crate::ship::Plan> {
        let limit = site.ship_limit(payload_bytes)?;
        crate::ship::plan(files, limit, Some(&self.root), &mut crate::ship::say_left_out)
    }

    /// Removes every prepared job directory (best effort): for a submission
    /// Slurm refused, so that no job directory exists without a Slurm job.
    fn withdraw_all(&self, jobs: &[(JobId, PathBuf, OwnedFd)]) {
        for (id, dir, _) in jobs {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                tracing::warn!(error = %e, job = %id, "cannot remove the job directory of a refused submission");
            }
        }
    }

    /// Marks every prepared job failed with `reason` (best effort).
    fn fail_all(&self, jobs: &[(JobId, PathBuf, OwnedFd)], reason: &str) {
        for (_, dir, fd) in jobs {
            let _ = self.write_client_outcome(fd, dir, State::Failed, reason, false, (None, None));
        }
    }
}

/// What one submission may be: a multi-node job alone, at most one job
/// array's calls, every call with the same resources, image and hold.
fn check_submission(reqs: &[SubmitRequest]) -> Result<()> {
    let Some(first) = reqs.first() else { return Ok(()) };
    if first.resources.nodes > 1 && reqs.len() > 1 {
        return Err(ClientError::InvalidRequest(
            "a multi-node job is submitted alone (no count, map or jobs-file sharing)".into(),
        ));
    }
    if reqs.len() > MAX_ARRAY {
        return Err(ClientError::InvalidRequest(format!(
            "{} calls in one submission, more than the limit of {MAX_ARRAY} of one job array",
            reqs.len()
        )));
    }
    let same = |r: &SubmitRequest| {
        (&r.resources, &r.image, r.hold, r.retries) == (&first.resources, &first.image, first.hold, first.retries)
    };
    if !reqs.iter().all(same) {
        return Err(ClientError::InvalidRequest(
            "the calls of one job array must ask for the same resources and image".into(),
        ));
    }
    Ok(())
}

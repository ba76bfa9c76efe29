//! Cancelling jobs: the `cancel` marker, one `scancel` for all, and the
//! shared allocations whose last live call is being cancelled.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use delegate_protocol::{self as protocol, atomic_write_at, exists_at, read_bounded_at, JobId, ProtocolError};

use crate::job_files::JobFiles;
use crate::slurm::SlurmPhase;
use crate::wait::{FirstRound, Until};
use crate::{Client, ClientError, JobStatus, Result};

/// How long `cancel` waits for the jobs to end.
pub const CANCEL_WAIT: Duration = Duration::from_secs(15);

impl Client {
    /// Asks for the jobs to end: writes the `cancel` marker in each, cancels
    /// them in Slurm with one `scancel` (an allocation shared with calls not
    /// being cancelled is left running: its runner stops just the cancelled
    /// call, and a call that has not started there is over at once), then waits up to [`CANCEL_WAIT`]
    /// for each to be over. Returns the last statuses.
    pub fn cancel(&self, ids: &[JobId]) -> Result<Vec<JobStatus>> {
        self.cancel_because(ids, None)
    }

    /// [`Client::cancel`], the marker saying why in the user's words (a
    /// map's dropped calls: "call 5 of this map raised ZeroDivisionError";
    /// their state then reads `cancelled: <reason>`).
    pub fn cancel_because(&self, ids: &[JobId], reason: Option<&str>) -> Result<Vec<JobStatus>> {
        let marker = reason
            .and_then(|r| protocol::cancel::cancel_reason_of(r.as_bytes()))
            .unwrap_or_default();
        let jobs = ids.iter().map(|id| self.load(id)).collect::<Result<Vec<_>>>()?;
        let mut slurm_ids = self.over_but_waiting(&jobs);
        for j in &jobs {
            if j.outcome.is_some() {
                continue;
            }
            let Some(fd) = &j.fd else {
                return Err(ClientError::Protocol(ProtocolError::NotKind {
                    path: j.dir.display().to_string(),
                    expected: "job directory delegate can open (it cannot cancel this job)",
                }));
            };
            atomic_write_at(fd, &j.dir, protocol::CANCEL, marker.as_bytes(), 0o644)?;
            if let (Some(s), None) = (&j.slurm_id, j.shared) {
                slurm_ids.push(s.clone());
            }
        }
        // An allocation shared by several calls is cancelled in Slurm only
        // when none of its calls is left to run; otherwise the runner stops
        // the cancelled call (it watches the marker) and goes on.
        let mut shared: HashMap<&str, (u32, HashSet<&JobId>)> = HashMap::new();
        for j in &jobs {
            if let (Some(s), Some(n), None) = (&j.slurm_id, j.shared, &j.outcome) {
                shared
                    .entry(s.as_str())
                    .or_insert_with(|| (n, Default::default()))
                    .1
                    .insert(&j.id);
            }
        }
        for (sid, (n, members)) in shared {
            if members.len() as u32 >= n || self.no_other_live_call(sid, &members) {
                slurm_ids.push(sid.to_owned());
            }
        }
        if let Err(e) = self.config.slurm.cancel(&slurm_ids) {
            // Jobs that ended meanwhile make scancel fail; the wait decides.
            tracing::warn!(error = %e, "scancel reported an error");
        }
        self.wait_inner(ids, Some(CANCEL_WAIT), || false, FirstRound::AskSlurm, Until::AllOver)
    }

    /// The Slurm jobs of calls that are over (a refusal is their outcome)
    /// while their own allocation still waits in Slurm's queue, e.g. held
    /// after a failed launch: nothing of the call is left to run, but the
    /// job would wait on and count toward the student's limits.
    fn over_but_waiting(&self, jobs: &[JobFiles]) -> Vec<String> {
        let own: Vec<&str> = jobs
            .iter()
            .filter(|j| j.outcome.is_some() && j.shared.is_none())
            .filter_map(|j| j.slurm_id.as_deref())
            .collect();
        if own.is_empty() {
            return Vec::new();
        }
        let queue = match self.config.slurm.query_user(self.uid) {
            Ok(q) => q,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell whether the over calls' Slurm jobs still wait");
                return Vec::new();
            }
        };
        own.into_iter()
            .filter(|s| queue.get(*s).is_some_and(|j| j.state.phase() == SlurmPhase::Queued))
            .map(str::to_owned)
            .collect()
    }

    /// True when every call of the shared allocation `sid` other than
    /// `cancelling` is over or being cancelled (its list of calls says which
    /// they are; false when that list cannot be read).
    fn no_other_live_call(&self, sid: &str, cancelling: &HashSet<&JobId>) -> bool {
        let name = protocol::shared_calls_name(sid);
        let text = match read_bounded_at(&self.root_fd, &self.root, &name, 64 * 1024, Some(self.uid)) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) => {
                tracing::debug!(error = %e, "no list of the calls of allocation {sid}");
                return false;
            }
        };
        let calls = protocol::parse_shared_calls(&text);
        !calls.is_empty()
            && calls.iter().all(|id| {
                cancelling.contains(id)
                    || self
                        .open_job_dir(id)
                        .map(|fd| exists_at(&fd, protocol::OUTCOME) || exists_at(&fd, protocol::CANCEL))
                        .unwrap_or(false)
            })
    }
}

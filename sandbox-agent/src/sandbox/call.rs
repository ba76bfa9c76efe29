//! One call as the agent runs it: what its checks established (the policy,
//! the verified caller, the spec, the limits), shared by the job's setup
//! (crate::job) and its supervision (crate::sandbox::supervise), which then depend
//! on this module and not on each other.

use delegate_protocol::policy::Policy;

use crate::caller::ident::{self, Caller};

/// What the agent's checks of one call established.
pub(crate) struct CheckedCall<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) host: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) slurm_job: &'a str,
    pub(crate) spec: &'a delegate_protocol::Spec,
    pub(crate) tmp_bytes: u64,
    pub(crate) max_output: u64,
    pub(crate) max_job_bytes: u64,
    pub(crate) max_job_files: u64,
    pub(crate) caller: &'a Caller,
    pub(crate) node: String,
    /// The only sandbox on this node right now (the agent may then keep
    /// itself off its cores).
    pub(crate) alone: bool,
    /// A rank of a multi-node job (crate::sandbox::rank), or `None`.
    pub(crate) place: Option<ident::RankPlace>,
}

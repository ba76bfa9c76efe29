//! delegate's core: the job-directory protocol ([`protocol`]) shared by the
//! user side and the worker side, the site policy ([`policy`]), and the
//! user-side adapters around them: Slurm ([`slurm`]) and the client
//! operations used by the CLI and the Python shim ([`client`]).

pub mod client;
pub mod policy;
pub mod protocol;
pub mod slurm;
pub mod units;

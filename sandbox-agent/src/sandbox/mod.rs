//! One call's sandbox, from its configuration to its removal: the
//! container configuration and seccomp profile, the engine, the staging
//! mount, the job directory's budget, the output, a rank job's network,
//! and the supervision of the started container.

pub mod call;
pub mod config;
pub mod engine;
pub mod jobdisk;
pub mod lifecycle;
pub mod output;
pub mod rank;
pub mod seccomp;
pub mod stage;
pub mod supervise;

//! This node's facts: its hardware class and report kept in Slurm, and the
//! agent's answer to `delegate doctor`'s probe.

pub mod probe;
pub mod report;

//! The agent's part in Slurm's scheduling of its node: whether others wait
//! (a map's allocation steps aside), a map that stepped aside or stalled
//! kept moving, and launches that cannot succeed here undone.

pub mod aside;
pub mod failed_launch;
pub mod queue;

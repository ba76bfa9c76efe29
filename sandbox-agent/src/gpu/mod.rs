//! GPUs: the devices Slurm gave the calling job and how they reach its
//! sandbox, and what the node's driver says about them.

pub mod devices;
pub mod info;

//! Who connects to the agent and who they are: admission of connections
//! to the socket, one runner's connection, the caller's identity (from the
//! kernel and slurmctld only), and the rate bound on what a caller's
//! actions may log.

pub mod admit;
pub mod conn;
pub mod ident;
pub mod quiet;

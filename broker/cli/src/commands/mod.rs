//! One module per command group; each takes the parsed arguments and
//! returns the exit code ([`crate::fail::CliResult`]).

pub mod admin;
pub mod cancel;
pub mod doctor;
pub mod list;
pub mod logs;
pub mod rush;
pub mod status;
pub mod submit;
pub mod wait;

use std::path::PathBuf;

use delegate_client::{Client, Config};
use delegate_protocol::JobId;

use crate::fail::Fail;

/// The client of the root given by `--root` (else the environment's).
pub fn client(cli_root: &Option<PathBuf>) -> Result<Client, Fail> {
    let mut cfg = Config::from_env()?;
    if let Some(r) = cli_root {
        cfg.root = if r.is_absolute() {
            r.clone()
        } else {
            std::env::current_dir()?.join(r)
        };
    }
    Ok(Client::new(cfg)?)
}

/// Job ids from the command line.
pub fn parse_ids(ids: &[String]) -> Result<Vec<JobId>, Fail> {
    ids.iter()
        .map(|s| JobId::parse(s.trim()).map_err(|e| Fail::new(e.to_string(), 1)))
        .collect()
}

/// One job id from the command line.
pub fn parse_id(id: &str) -> Result<JobId, Fail> {
    JobId::parse(id.trim()).map_err(|e| Fail::new(e.to_string(), 1))
}

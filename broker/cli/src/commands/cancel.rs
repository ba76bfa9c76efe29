//! `delegate cancel`: cancel jobs and wait (up to 15 s) until they are over.

use delegate_client::CANCEL_WAIT;

use super::{client, parse_ids};
use crate::cli::Cli;
use crate::fail::{CliResult, Fail};
use crate::output::print_statuses;

/// `delegate cancel IDS`.
pub fn cancel(cli: &Cli, ids: &[String]) -> CliResult {
    let c = client(&cli.root)?;
    let ids = parse_ids(ids)?;
    let st = c.cancel(&ids)?;
    print_statuses(&st, cli.json)?;
    let stuck: Vec<String> = st.iter().filter(|s| !s.is_terminal()).map(|s| s.id.to_string()).collect();
    if stuck.is_empty() {
        Ok(0)
    } else {
        Err(Fail::new(
            format!(
                "{} did not end within {} s of the cancellation (check `squeue`)",
                stuck.join(", "),
                CANCEL_WAIT.as_secs()
            ),
            1,
        ))
    }
}

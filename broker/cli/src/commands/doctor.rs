//! `delegate doctor`: the client library's checks of this node
//! ([`delegate_client::doctor`]), one line each (or JSON).

use delegate_client::doctor::{self, Check};

use super::client;
use crate::cli::Cli;
use crate::fail::{CliResult, Fail};
use crate::output::print_json;

pub fn doctor(cli: &Cli) -> CliResult {
    let c = client(&cli.root).map_err(|f| f.msg);
    report(cli, &doctor::run(c.as_ref().map_err(Clone::clone)))
}

/// One line per check (or JSON); exit 1 when any failed.
fn report(cli: &Cli, checks: &[Check]) -> CliResult {
    if cli.json {
        print_json(&checks)?;
    } else {
        for c in checks {
            if c.ok {
                println!("ok    {:<16} {}", c.check, c.detail);
            } else {
                println!("FAIL  {:<16} {} (fix: {})", c.check, c.detail, c.fix.as_deref().unwrap_or(""));
            }
        }
    }
    if checks.iter().all(|c| c.ok) {
        Ok(0)
    } else {
        Err(Fail::new("", 1))
    }
}

//! `sandbox-runner batch`: the calls of one exclusive allocation, one
//! after another, each in its own fresh container, each with its own log.

use std::path::Path;

use crate::calllog::{self, Redirect};
use crate::run::{self, SignalWatch, EXIT_OUTCOME};

/// Runs every job directory in order; returns the exit code of the batch:
/// the worst of the calls' codes (0 < 3 refused < 4 internal error), a call
/// skipped because it already had an outcome counting as 0.
pub async fn run_batch(dirs: &[impl AsRef<Path>], signals: SignalWatch) -> i32 {
    // One agent connection for the whole allocation: one identity check.
    let mut agent = None;
    let uid = nix::unistd::getuid().as_raw();
    let saved = match calllog::save_stderr() {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::warn!("cannot duplicate standard error ({e}); every call logs here");
            None
        }
    };
    let total = dirs.len();
    let mut code = EXIT_OUTCOME;
    for (i, dir) in dirs.iter().enumerate() {
        let dir = dir.as_ref();
        let n = i + 1;
        let log = match saved {
            Some(ref saved) => match calllog::open_log(dir, uid) {
                Ok((fd, shown)) => match Redirect::new(saved, &fd) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::warn!("call {n}/{total}: cannot log to {} ({e}); its log goes here", shown.display());
                        None
                    }
                },
                Err(e) => {
                    tracing::warn!(
                        "call {n}/{total}: cannot open the log file of {} ({e}); its log goes here",
                        dir.display()
                    );
                    None
                }
            },
            None => None,
        };
        if log.is_some() {
            tracing::info!("call {n}/{total} of a batch: {}", dir.display());
        }
        let finish = run::run_job(dir, crate::load_policy(), &mut agent, signals.clone()).await;
        let (c, summary) = if finish.already_ended {
            let what = "skipped: it already has an outcome (cancelled before its turn)";
            tracing::info!("{}: {what}", dir.display());
            (EXIT_OUTCOME, what.to_string())
        } else {
            if let Some(line) = &finish.final_line {
                say!("{line}");
            }
            let what = finish.final_line.clone().unwrap_or_else(|| "delegate: outcome written".into());
            (finish.code, what)
        };
        // Back to the batch's own stderr.
        drop(log);
        tracing::info!("call {n}/{total} {}: {summary} (code {c})", dir.display());
        code = code.max(c);
    }
    code
}

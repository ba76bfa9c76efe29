//! The one way the client runs another program (Slurm's tools, the runner's
//! `probe`): with a time limit, so that a hung `squeue` (a controller that
//! does not answer) cannot block a client forever, and with bounded output.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// At most this much of a program's stdout (and of its stderr) is kept; the
/// rest is read and dropped, so the program never blocks on a full pipe.
pub const MAX_OUTPUT_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SubprocessError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} did not answer within {} s", .timeout.as_secs())]
    TimedOut { program: String, timeout: Duration },
    #[error("cannot wait for {program}: {source}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// What a program printed and how it ended.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Stdout as text (invalid UTF-8 replaced).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The first non-empty line of stderr, else of stdout, trimmed and cut
    /// to 300 characters, for messages.
    pub fn first_line(&self) -> Option<String> {
        let pick = |b: &[u8]| {
            String::from_utf8_lossy(b)
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map(|l| l.chars().take(300).collect::<String>())
        };
        pick(&self.stderr).or_else(|| pick(&self.stdout))
    }
}

/// Runs `program` with `args`, feeding it `stdin` (else /dev/null), and
/// waits at most `timeout` for it to exit; past that it is killed and the
/// call fails with [`SubprocessError::TimedOut`]. A spawn that fails with
/// `ETXTBSY` (the program was just written and another thread's fork still
/// holds it open for writing) is retried for half a second.
pub fn run<S: AsRef<OsStr>>(
    program: &Path,
    args: &[S],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output, SubprocessError> {
    run_env(program, args, &[], stdin, timeout)
}

/// [`run`], with `env` added to the program's environment.
pub fn run_env<S: AsRef<OsStr>>(
    program: &Path,
    args: &[S],
    env: &[(&str, &str)],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output, SubprocessError> {
    let name = program.display().to_string();
    tracing::debug!(program = %name, args = ?args.iter().map(|a| a.as_ref().to_string_lossy()).collect::<Vec<_>>(), "running");
    let spawn = || {
        Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    };
    let mut attempt = 0;
    let mut child = loop {
        match spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 20 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
            Err(source) => return Err(SubprocessError::Spawn { program: name, source }),
            Ok(c) => break c,
        }
    };
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A write error (the program exited early) shows up in its status.
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.by_ref().take(MAX_OUTPUT_BYTES).read_to_end(&mut kept);
                let _ = std::io::copy(&mut p, &mut std::io::sink());
            }
            kept
        })
    };
    let out_t = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err_t = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let start = Instant::now();
    // Poll with a short, growing pause: most Slurm calls end within tens of
    // milliseconds, and a blocking wait could not be given up on.
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if start.elapsed() < timeout => {
                std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SubprocessError::TimedOut { program: name, timeout });
            }
            Err(source) => return Err(SubprocessError::Wait { program: name, source }),
        }
    };
    // The pipes close when the program (and anything it left behind holding
    // them) exits; a reader that panicked gives no output.
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    Ok(Output { status, stdout, stderr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_stdin_and_status() {
        let sh = Path::new("/bin/sh");
        let o = run(
            sh,
            &["-c", "cat; echo err >&2; exit 3"],
            Some(b"hello\n"),
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(!o.success());
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(o.stdout_text(), "hello\n");
        assert_eq!(o.first_line().as_deref(), Some("err"));
        let o = run(sh, &["-c", "echo '  '; echo ' out '"], None, Duration::from_secs(10)).unwrap();
        assert!(o.success());
        assert_eq!(o.first_line().as_deref(), Some("out"));
    }

    #[test]
    fn a_hung_program_is_killed() {
        let t0 = Instant::now();
        let e = run(Path::new("/bin/sleep"), &["30"], None, Duration::from_millis(300)).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(e.to_string(), "/bin/sleep did not answer within 0 s");
        assert!(matches!(e, SubprocessError::TimedOut { .. }));
    }

    #[test]
    fn missing_program() {
        let e = run(Path::new("/nonexistent/x"), &[] as &[&str], None, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().starts_with("cannot run /nonexistent/x: "), "{e}");
    }
}

//! The agent's one way to ask a program of the node (Slurm's commands,
//! nvidia-smi): the system's PATH, no stdin, killed when it outlasts its
//! deadline or the agent drops the question, and an answer of bounded
//! size: its output is read as it comes and only its first bytes are kept,
//! so a runaway program costs the agent time (up to the deadline), never
//! memory.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Child;

/// Where the node's programs are (the agent's own PATH is not trusted to
/// have them: a service may start it with a bare one).
pub const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long one of Slurm's commands may take.
const SLURM_PATIENCE: Duration = Duration::from_secs(10);

/// How much of a failed program's stderr an error quotes.
const STDERR_QUOTED: usize = 300;

#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("{program} took more than {deadline:?}")]
    Timeout { program: String, deadline: Duration },
    #[error("{program} failed: {stderr}")]
    Failed { program: String, stderr: String },
    #[error("{program}'s answer is larger than {max} bytes")]
    TooLarge { program: String, max: usize },
}

/// One bounded run of a program: the program and its arguments, how long
/// it may take (its deadline), how large an answer to take.
pub struct BoundedRun<'a> {
    pub argv: &'a [&'a str],
    pub deadline: Duration,
    pub max_answer: usize,
    /// Variables set for the program (beside PATH).
    pub env: &'a [(&'a str, &'a str)],
    /// Nothing of the agent's environment reaches the program but PATH
    /// and `env` (nvidia-smi: a CUDA_VISIBLE_DEVICES of the agent's must
    /// not hide GPUs from it).
    pub clear_env: bool,
}

impl BoundedRun<'_> {
    /// The program's stdout (lossy UTF-8) when it exits 0.
    pub async fn ask(&self) -> Result<String, AskError> {
        let (program, args) = self.argv.split_first().map_or(("", &[][..]), |(p, a)| (*p, a));
        let spawn_error = |source| AskError::Spawn { program: program.into(), source };
        let mut cmd = tokio::process::Command::new(program);
        if self.clear_env {
            cmd.env_clear();
        }
        let mut child = cmd
            .args(args)
            .env("PATH", SYSTEM_PATH)
            .envs(self.env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_error)?;
        let (status, (out, more), (err, _)) = tokio::time::timeout(self.deadline, self.run(&mut child))
            .await
            .map_err(|_| AskError::Timeout {
                program: program.into(),
                deadline: self.deadline,
            })?
            .map_err(spawn_error)?;
        if !status.success() {
            let stderr = String::from_utf8_lossy(&err);
            return Err(AskError::Failed {
                program: program.into(),
                stderr: stderr.trim().chars().take(STDERR_QUOTED).collect(),
            });
        }
        if more {
            return Err(AskError::TooLarge {
                program: program.into(),
                max: self.max_answer,
            });
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Both pipes read to their end (the program never blocks on a full
    /// one), at most `max_answer` bytes of stdout and a quote's worth of
    /// stderr kept, then the exit status.
    async fn run(&self, child: &mut Child) -> std::io::Result<(ExitStatus, Capped, Capped)> {
        let (out, err) = tokio::join!(
            read_capped(child.stdout.take(), self.max_answer),
            read_capped(child.stderr.take(), STDERR_QUOTED * 4),
        );
        Ok((child.wait().await?, out?, err?))
    }
}

/// The first bytes of a stream, and whether there were more.
type Capped = (Vec<u8>, bool);

/// Reads `pipe` to its end, keeping its first `cap` bytes.
async fn read_capped<R: AsyncRead + Unpin>(pipe: Option<R>, cap: usize) -> std::io::Result<Capped> {
    let (mut kept, mut more) = (Vec::new(), false);
    let Some(mut pipe) = pipe else {
        return Ok((kept, more));
    };
    let mut chunk = [0u8; 8192];
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            return Ok((kept, more));
        }
        let room = cap.saturating_sub(kept.len()).min(n);
        kept.extend_from_slice(&chunk[..room]);
        more |= room < n;
    }
}

/// A Slurm command that did not answer: the command line and why.
#[derive(Debug, thiserror::Error)]
#[error("{command}: {source}")]
pub struct SlurmError {
    pub command: String,
    pub source: AskError,
}

/// A Slurm command's answer (`argv`: the command and its arguments),
/// within [`SLURM_PATIENCE`] and `max_answer` bytes; the error names the
/// command.
pub async fn slurm(argv: &[&str], max_answer: usize) -> Result<String, SlurmError> {
    let question = BoundedRun {
        argv,
        deadline: SLURM_PATIENCE,
        max_answer,
        env: &[],
        clear_env: false,
    };
    match question.ask().await {
        Err(AskError::Failed { stderr, .. }) if each_element_succeeded(&stderr) => Ok(String::new()),
        answer => answer.map_err(|source| SlurmError { command: argv.join(" "), source }),
    }
}

/// scontrol's answer to an update or requeue that reached a job array's
/// elements: a line `<element>: No error` for each, and exit status 1
/// although every one succeeded (scontrol prints each element's code once
/// there is more than one, and sets its exit status whatever the code).
fn each_element_succeeded(stderr: &str) -> bool {
    !stderr.trim().is_empty() && stderr.lines().all(|l| l.trim().ends_with(": No error"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question<'a>(argv: &'a [&'a str]) -> BoundedRun<'a> {
        BoundedRun {
            argv,
            deadline: Duration::from_secs(10),
            max_answer: 1 << 10,
            env: &[],
            clear_env: false,
        }
    }

    #[tokio::test]
    async fn an_answer_a_failure_a_timeout_and_an_oversized_answer() {
        assert_eq!(question(&["sh", "-c", "echo yes"]).ask().await.unwrap(), "yes\n");
        let err = question(&["sh", "-c", "echo no >&2; exit 3"]).ask().await.unwrap_err();
        assert_eq!(err.to_string(), "sh failed: no");
        let mut slow = question(&["sleep", "5"]);
        slow.deadline = Duration::from_millis(200);
        assert!(matches!(slow.ask().await.unwrap_err(), AskError::Timeout { .. }));
        let big = question(&["sh", "-c", "head -c 2048 /dev/zero"]).ask().await.unwrap_err();
        assert!(matches!(big, AskError::TooLarge { max: 1024, .. }), "{big}");
        let missing = question(&["no-such-program-of-delegate"]).ask().await.unwrap_err();
        assert!(matches!(missing, AskError::Spawn { .. }), "{missing}");
    }

    #[tokio::test]
    async fn an_array_update_whose_every_element_succeeded_is_an_answer() {
        let ok = [
            "sh",
            "-c",
            "printf '30002306_1: No error\\n30002306_2: No error\\n' >&2; exit 1",
        ];
        assert_eq!(slurm(&ok, 1 << 10).await.unwrap(), "");
        let mixed = [
            "sh",
            "-c",
            "printf '7_1: No error\\n7_2: Job has already finished\\n' >&2; exit 1",
        ];
        let err = slurm(&mixed, 1 << 10).await.unwrap_err();
        assert!(err.to_string().contains("Job has already finished"), "{err}");
        let silent = ["sh", "-c", "exit 1"];
        assert!(matches!(
            slurm(&silent, 1 << 10).await.unwrap_err().source,
            AskError::Failed { .. }
        ));
    }

    #[tokio::test]
    async fn a_cleared_environment_keeps_path_and_the_given_variables() {
        // cargo runs the tests with CARGO_MANIFEST_DIR set.
        let argv = ["sh", "-c", "echo ${CARGO_MANIFEST_DIR:+inherited} $TZ $PATH"];
        let mut q = question(&argv);
        q.env = &[("TZ", "UTC")];
        assert_eq!(q.ask().await.unwrap(), format!("inherited UTC {SYSTEM_PATH}\n"));
        q.clear_env = true;
        assert_eq!(q.ask().await.unwrap(), format!("UTC {SYSTEM_PATH}\n"));
    }
}

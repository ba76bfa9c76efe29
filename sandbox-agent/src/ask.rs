//! The agent's one way to ask a program of the node (Slurm's commands,
//! nvidia-smi): the system's PATH, no stdin, killed when it outlasts its
//! patience or the agent drops the question, and an answer of bounded
//! size that is only read when the program succeeded.

use std::time::Duration;

/// Where the node's programs are (the agent's own PATH is not trusted to
/// have them: a service may start it with a bare one).
pub const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How much of a failed program's stderr an error quotes.
const STDERR_QUOTED: usize = 300;

#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("{program} took more than {patience:?}")]
    Timeout { program: String, patience: Duration },
    #[error("{program} failed: {stderr}")]
    Failed { program: String, stderr: String },
    #[error("{program}'s answer is larger than {max} bytes")]
    TooLarge { program: String, max: usize },
}

/// One question: the program and its arguments, how long to wait, how
/// large an answer to take.
pub struct Question<'a> {
    pub argv: &'a [&'a str],
    pub patience: Duration,
    pub max_answer: usize,
    /// Variables set for the program (beside PATH).
    pub env: &'a [(&'a str, &'a str)],
    /// Nothing of the agent's environment reaches the program but PATH
    /// and `env` (nvidia-smi: a CUDA_VISIBLE_DEVICES of the agent's must
    /// not hide GPUs from it).
    pub clear_env: bool,
}

impl Question<'_> {
    /// The program's stdout (lossy UTF-8) when it exits 0.
    pub async fn ask(&self) -> Result<String, AskError> {
        let (program, args) = self.argv.split_first().map_or(("", &[][..]), |(p, a)| (*p, a));
        let mut cmd = tokio::process::Command::new(program);
        if self.clear_env {
            cmd.env_clear();
        }
        cmd.args(args)
            .env("PATH", SYSTEM_PATH)
            .envs(self.env.iter().copied())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(self.patience, cmd.output())
            .await
            .map_err(|_| AskError::Timeout {
                program: program.into(),
                patience: self.patience,
            })?
            .map_err(|source| AskError::Spawn { program: program.into(), source })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(AskError::Failed {
                program: program.into(),
                stderr: stderr.trim().chars().take(STDERR_QUOTED).collect(),
            });
        }
        if out.stdout.len() > self.max_answer {
            return Err(AskError::TooLarge {
                program: program.into(),
                max: self.max_answer,
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question<'a>(argv: &'a [&'a str]) -> Question<'a> {
        Question {
            argv,
            patience: Duration::from_secs(10),
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
        slow.patience = Duration::from_millis(200);
        assert!(matches!(slow.ask().await.unwrap_err(), AskError::Timeout { .. }));
        let big = question(&["sh", "-c", "head -c 2048 /dev/zero"]).ask().await.unwrap_err();
        assert!(matches!(big, AskError::TooLarge { max: 1024, .. }), "{big}");
        let missing = question(&["no-such-program-of-delegate"]).ask().await.unwrap_err();
        assert!(matches!(missing, AskError::Spawn { .. }), "{missing}");
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

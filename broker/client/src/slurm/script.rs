//! What the client hands `sbatch`: its arguments and the batch scripts that
//! exec the runner on job directories.

use std::path::{Path, PathBuf};

/// Slurm's time limit in minutes for a job whose runner enforces
/// `time_limit_secs` itself: one extra minute of slack, rounded up. Slurm's
/// limit is only a backstop.
pub fn time_limit_minutes(time_limit_secs: u64) -> u64 {
    time_limit_secs.saturating_add(60).div_ceil(60)
}

/// Quotes `s` for a POSIX shell (single quotes; embedded quotes escaped).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The batch script: exec the runner on the job directory.
pub fn batch_script(runner: &Path, job_dir: &Path) -> String {
    format!(
        "#!/bin/sh\nexec {} {}\n",
        shell_quote(&runner.display().to_string()),
        shell_quote(&job_dir.display().to_string())
    )
}

/// The batch script of a job array: element `i` sends its output to
/// `logs[i]` (the per-job Slurm log the client reads for a refusal or a lost
/// job's reason) and execs the runner on `job_dirs[i]`.
pub fn array_script(runner: &Path, job_dirs: &[PathBuf], logs: &[PathBuf]) -> String {
    let mut s = format!("#!/bin/sh\n#SBATCH --array=0-{}\n", job_dirs.len().saturating_sub(1));
    s.push_str("case \"$SLURM_ARRAY_TASK_ID\" in\n");
    for (i, (dir, log)) in job_dirs.iter().zip(logs).enumerate() {
        s.push_str(&format!(
            "{i}) exec >>{} 2>&1; exec {} {} ;;\n",
            shell_quote(&log.display().to_string()),
            shell_quote(&runner.display().to_string()),
            shell_quote(&dir.display().to_string())
        ));
    }
    s.push_str("esac\necho \"delegate: no job directory for array task $SLURM_ARRAY_TASK_ID\" >&2\nexit 1\n");
    s
}

/// The batch script of a map's allocations: `allocations` of them (the
/// elements of a job array when there are several, the whole job when
/// there is one), each execing `sandbox-runner pull` on every call's job
/// directory: each runs the calls it claims, one after another, each in
/// its own fresh container, and writes each call's log to
/// `<root>/<job-id>.log` itself.
pub fn pull_script(runner: &Path, dirs: &[PathBuf], allocations: usize) -> String {
    let mut line = format!("exec {} pull", shell_quote(&runner.display().to_string()));
    for d in dirs {
        line.push(' ');
        line.push_str(&shell_quote(&d.display().to_string()));
    }
    if allocations <= 1 {
        return format!("#!/bin/sh\n{line}\n");
    }
    format!("#!/bin/sh\n#SBATCH --array=0-{}\n{line}\n", allocations - 1)
}

/// The script asking Slurm for `gpus` GPUs (GRES `gpu`) per node: an
/// `#SBATCH --gres=gpu:N` line right after `#!/bin/sh` (no line for 0). The
/// site's job_submit.lua accepts exactly this form and checks that the
/// job's GPU request is the script's own.
pub fn with_gpus(script: String, gpus: u32) -> String {
    if gpus == 0 {
        return script;
    }
    match script.strip_prefix("#!/bin/sh\n") {
        Some(rest) => format!("#!/bin/sh\n#SBATCH --gres=gpu:{gpus}\n{rest}"),
        None => script,
    }
}

/// The batch script of a multi-node rank job: Slurm allocates `nodes`
/// nodes (the `#SBATCH --nodes=N` line, N > 1), and the batch step execs
/// `sandbox-runner ranks <dir>`, which checks the job, starts one
/// `sandbox-runner rank <dir>` per node with srun and writes the job's one
/// outcome from the ranks'. The site's job_submit.lua accepts exactly this
/// form (and only it with more than one node).
pub fn ranks_script(runner: &Path, job_dir: &Path, nodes: u32) -> String {
    format!(
        "#!/bin/sh\n#SBATCH --nodes={nodes}\nexec {} ranks {}\n",
        shell_quote(&runner.display().to_string()),
        shell_quote(&job_dir.display().to_string())
    )
}

/// One batch submission.
#[derive(Clone, Debug)]
pub struct BatchRequest {
    pub job_name: String,
    /// The delegate root (working directory of the batch script).
    pub chdir: PathBuf,
    /// Slurm's log of the batch script.
    pub output: PathBuf,
    pub cpus: u32,
    pub time_limit_secs: u64,
    pub script: String,
    /// Submit held (`--hold`): the job waits for `scontrol release`.
    pub hold: bool,
    /// The calls this submission runs (all its allocations together), told
    /// to the accounting (`--comment=delegate:calls=N`) so that the
    /// instructor's usage counts calls, not allocations.
    pub calls: usize,
    /// `--constraint`: the hardware class the calls keep to (a node
    /// feature `dlgclass_<id>`, or `[a|b]` for one of several).
    pub constraint: Option<String>,
    /// A map's allocations (`pull_script`): requeued when they step aside
    /// (or their node fails: they run only what they claim), their log
    /// appended to across runs.
    pub map: bool,
    /// Slurm queues it again when its node is lost (a call with retries,
    /// [`delegate_protocol::attempt`]); a map's allocations always are.
    pub requeue: bool,
}

/// The arguments of `sbatch` for `req`.
pub fn sbatch_args(req: &BatchRequest, partition: Option<&str>) -> Vec<String> {
    let mut args = vec![
        "--parsable".to_owned(),
        "--exclusive".to_owned(),
        // A call with retries is queued again when its node is lost: the
        // runner starts a new attempt from a fresh directory, within its
        // retries; without, it ends lost with Slurm's reason. A map's
        // allocation runs only the calls it claims, recovers its own lost
        // claims, and requeues itself to step aside for another user.
        if req.map || req.requeue {
            "--requeue"
        } else {
            "--no-requeue"
        }
        .to_owned(),
        format!("--job-name={}", req.job_name),
        format!("--chdir={}", req.chdir.display()),
        format!("--output={}", req.output.display()),
        format!("--cpus-per-task={}", req.cpus),
        format!("--time={}", time_limit_minutes(req.time_limit_secs)),
        format!("--comment={}{}", super::usage::CALLS_COMMENT, req.calls.max(1)),
    ];
    if let Some(p) = partition.filter(|p| !p.is_empty()) {
        args.push(format!("--partition={p}"));
    }
    if req.map {
        args.push("--open-mode=append".to_owned());
    }
    if req.hold {
        args.push("--hold".to_owned());
    }
    if let Some(c) = &req.constraint {
        args.push(format!("--constraint={c}"));
    }
    args
}

#[cfg(test)]
mod tests {

    /// The batch scripts' forms, one file each, the one source of what the
    /// site's gate must accept (issue 57, item 2): this test checks that
    /// the client writes exactly these files (`DELEGATE_WRITE_FIXTURES=1`
    /// writes them instead); tests/lua/job_submit_test.lua checks that the
    /// gate accepts each and writes the same, tests/e2e/test_lockdown.py
    /// submits the single form through the installed gate. A change of a
    /// form here fails there until the gate follows.
    #[test]
    fn the_gates_fixtures_are_the_forms_this_client_writes() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/batch-scripts");
        let r = Path::new("/usr/local/bin/sandbox-runner");
        let d1 = PathBuf::from("/home/alice/.delegate/jobs/20261123T103000-abcdef01");
        let d2 = PathBuf::from("/home/alice/.delegate/jobs/20261123T103001-abcdef02");
        let dirs = [d1.clone(), d2.clone()];
        let logs = [d1.with_extension("log"), d2.with_extension("log")];
        let forms = [
            ("single.sh", batch_script(r, &d1)),
            ("array.sh", array_script(r, &dirs, &logs)),
            ("map.sh", pull_script(r, &dirs, 1)),
            ("map-array.sh", pull_script(r, &dirs, 2)),
            ("gpu-single.sh", with_gpus(batch_script(r, &d1), 1)),
            ("gpu-array.sh", with_gpus(array_script(r, &dirs, &logs), 2)),
            ("ranks.sh", ranks_script(r, &d1, 2)),
        ];
        for (name, script) in forms {
            let path = dir.join(name);
            if std::env::var_os("DELEGATE_WRITE_FIXTURES").is_some() {
                std::fs::write(&path, &script).unwrap();
            }
            let want = std::fs::read_to_string(&path).unwrap_or_default();
            assert_eq!(script, want, "{name}: the client's form differs from {}", path.display());
        }
    }
    use super::*;

    #[test]
    fn args_and_script() {
        assert_eq!(time_limit_minutes(600), 11);
        assert_eq!(time_limit_minutes(5), 2);
        assert_eq!(time_limit_minutes(60), 2);
        assert_eq!(time_limit_minutes(61), 3);
        let req = BatchRequest {
            job_name: "20261123T103000-abcdef01".into(),
            chdir: "/home/a/.delegate/jobs".into(),
            output: "/home/a/.delegate/jobs/20261123T103000-abcdef01.log".into(),
            cpus: 2,
            time_limit_secs: 300,
            script: String::new(),
            hold: false,
            calls: 1,
            constraint: None,
            map: false,
            requeue: false,
        };
        let a = sbatch_args(&req, None);
        assert_eq!(
            a,
            [
                "--parsable",
                "--exclusive",
                "--no-requeue",
                "--job-name=20261123T103000-abcdef01",
                "--chdir=/home/a/.delegate/jobs",
                "--output=/home/a/.delegate/jobs/20261123T103000-abcdef01.log",
                "--cpus-per-task=2",
                "--time=6",
                "--comment=delegate:calls=1"
            ]
        );
        assert_eq!(sbatch_args(&req, Some("debug")).last().unwrap(), "--partition=debug");
        let pinned = BatchRequest {
            constraint: Some("dlgclass_0123456789".into()),
            ..req.clone()
        };
        assert_eq!(sbatch_args(&pinned, None).last().unwrap(), "--constraint=dlgclass_0123456789");
        assert_eq!(
            batch_script(Path::new("/usr/local/bin/sandbox-runner"), Path::new("/home/o'k/j")),
            "#!/bin/sh\nexec '/usr/local/bin/sandbox-runner' '/home/o'\\''k/j'\n"
        );
    }

    #[test]
    fn gpu_scripts() {
        let r = Path::new("/r");
        let one = batch_script(r, Path::new("/h/a"));
        assert_eq!(with_gpus(one.clone(), 0), one);
        assert_eq!(with_gpus(one, 2), "#!/bin/sh\n#SBATCH --gres=gpu:2\nexec '/r' '/h/a'\n");
        let arr = with_gpus(
            array_script(r, &["/h/a".into(), "/h/b".into()], &["/h/a.log".into(), "/h/b.log".into()]),
            1,
        );
        assert!(
            arr.starts_with("#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --array=0-1\n"),
            "{arr}"
        );
    }

    #[test]
    fn rank_scripts() {
        assert_eq!(
            ranks_script(Path::new("/r"), Path::new("/h/a"), 2),
            "#!/bin/sh\n#SBATCH --nodes=2\nexec '/r' ranks '/h/a'\n"
        );
    }

    #[test]
    fn a_maps_allocations_requeue_and_append() {
        let req = BatchRequest {
            job_name: "x-map".into(),
            chdir: "/h".into(),
            output: "/h/x.map.log".into(),
            cpus: 1,
            time_limit_secs: 690,
            script: String::new(),
            hold: false,
            calls: 3,
            constraint: None,
            map: true,
            requeue: false,
        };
        let args = sbatch_args(&req, None);
        assert!(args.contains(&"--requeue".to_owned()) && !args.contains(&"--no-requeue".to_owned()));
        assert!(args.contains(&"--open-mode=append".to_owned()), "{args:?}");
        let single = sbatch_args(&BatchRequest { map: false, ..req.clone() }, None);
        assert!(single.contains(&"--no-requeue".to_owned()) && !single.iter().any(|a| a.starts_with("--open-mode")));
        let retried = sbatch_args(&BatchRequest { map: false, requeue: true, ..req }, None);
        assert!(retried.contains(&"--requeue".to_owned()) && !retried.iter().any(|a| a.starts_with("--open-mode")));
    }

    #[test]
    fn pull_scripts() {
        let r = Path::new("/r");
        let dirs: Vec<PathBuf> = vec!["/h/a".into(), "/h/b".into(), "/h/c".into()];
        assert_eq!(pull_script(r, &dirs, 1), "#!/bin/sh\nexec '/r' pull '/h/a' '/h/b' '/h/c'\n");
        assert_eq!(
            pull_script(r, &dirs, 2),
            "#!/bin/sh\n#SBATCH --array=0-1\nexec '/r' pull '/h/a' '/h/b' '/h/c'\n",
            "every allocation is given every call"
        );
    }
}

//! Test helper: creates a job directory with a spec, as the calling user.
//!
//! ```text
//! mkjob <jobs-root> [--time SECS] [--mem SIZE] [--cpus N] [--image IMG] [--uid N] [--python] -- ARGV...
//! ```
//! Prints the absolute job directory. Used for manual runs of the runner:
//! `runuser -u alice -- mkjob /home/alice/.delegate/jobs -- id -u`.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use clap::Parser;
use delegate_protocol::units::parse_size;
use delegate_protocol::{now_ms, open_dir_nofollow, write_record_at, JobId, Resources, Spec, Task};

#[derive(Parser)]
struct Args {
    root: PathBuf,
    #[arg(long, default_value_t = 600)]
    time: u64,
    #[arg(long, default_value = "512M")]
    mem: String,
    #[arg(long, default_value_t = 1)]
    cpus: u32,
    #[arg(long, default_value = "delegate-sandbox:latest")]
    image: String,
    /// Spec uid (default: the real uid).
    #[arg(long)]
    uid: Option<u32>,
    /// A Python task instead of a command.
    #[arg(long)]
    python: bool,
    /// Extra environment, NAME=VALUE.
    #[arg(long)]
    env: Vec<String>,
    argv: Vec<String>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let id = JobId::new();
    std::fs::create_dir_all(&a.root)?;
    let dir = a.root.join(id.as_str());
    std::fs::create_dir(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let task = if a.python {
        Task::Python {
            python_version: "3.11".into(),
            cloudpickle_version: "3.0".into(),
        }
    } else {
        Task::Command { argv: a.argv }
    };
    let spec = Spec {
        job_id: id,
        uid: a.uid.unwrap_or_else(|| nix::unistd::getuid().as_raw()),
        gid: nix::unistd::getgid().as_raw(),
        created_ms: now_ms(),
        image: a.image,
        task,
        resources: Resources {
            cpus: a.cpus,
            mem_bytes: parse_size(&a.mem)?,
            time_limit_secs: a.time,
            ..Resources::default()
        },
        env: a
            .env
            .iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect(),
    };
    let fd = open_dir_nofollow(&dir)?;
    write_record_at(&fd, &dir, &spec)?;
    println!("{}", dir.display());
    Ok(())
}

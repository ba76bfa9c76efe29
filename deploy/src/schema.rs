//! The cluster's settings: one table of every `DELEGATE_*` setting of
//! build_cluster.sh with its TOML key, type, default and meaning, and the
//! one way they are resolved: the environment (a non-empty value) over the
//! settings file (`cluster.toml`, keys by section) over the default.
//!
//! build_cluster.sh evaluates `delegate-deploy settings --shell` once at
//! start; the shipped cluster.toml and docs/configuration.md's settings
//! table are printed from this table too (`--example`, `--markdown`) and a
//! test keeps both equal to what is in the repository.

use crate::settings::{is_image, is_safe_path, is_slurm_time, is_unix_name};

/// What a setting holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole number in `min..=max`.
    Count(u64, u64),
    /// 0 or 1 (true/false in the file).
    Flag,
    /// A size such as 512M or 4G.
    Size,
    /// A size, or empty for the documented computed default.
    SizeOrEmpty,
    /// A size, or 0 for none.
    SizeOrZero,
    /// A duration such as 90s, 10m, 1h.
    Duration,
    /// A Slurm time such as 02:00:00.
    SlurmTime,
    /// An absolute path of safe bytes.
    Path,
    /// A path, or empty.
    PathOrEmpty,
    /// A Docker image name.
    Image,
    /// A Unix-style name (a-z 0-9 _ -).
    Name,
    /// A swarm stack's name: a-z 0-9 -, starting with a letter (its
    /// services are `<name>_<service>`).
    StackName,
    /// An absolute path Docker can bind (`src:dst`): A-Z a-z 0-9 . _ / -,
    /// no `..`, no trailing `/`.
    MountPath,
    /// A name, or empty.
    NameOrEmpty,
    /// "name:id".
    NameId,
    /// Space-separated "name:uid" pairs.
    Accounts,
    /// Space-separated names (may be empty).
    Names,
    /// A positive number of CPUs (2, 0.5).
    Cpus,
    /// An http(s) URL.
    Url,
    /// Free text on one line.
    Text,
}

/// Where a default comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
    Lit(&'static str),
    /// The machine's cores.
    Nproc,
    /// The machine's cores times this.
    NprocTimes(u64),
    /// Another setting's value (resolved before this one) with a suffix.
    Ref(&'static str, &'static str),
}

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The environment name build_cluster.sh uses (`DELEGATE_STACK_WORKERS`).
    pub env: &'static str,
    /// Its key in the settings file (`stack.workers`).
    pub key: &'static str,
    pub kind: Kind,
    pub default: DefaultValue,
    pub doc: &'static str,
}

const fn s(env: &'static str, key: &'static str, kind: Kind, default: DefaultValue, doc: &'static str) -> Setting {
    Setting { env, key, kind, default, doc }
}

use DefaultValue::{Lit, Nproc, NprocTimes, Ref};

/// Every setting, grouped by the file's sections, in resolution order.
#[rustfmt::skip]
pub const SETTINGS: &[Setting] = &[
    // [stack]
    s("DELEGATE_STACK_NAME", "stack.name", Kind::StackName, Lit("delegate"),
      "Swarm stack name; prefixes every service, network, config and secret."),
    s("DELEGATE_STACK_WORKERS", "stack.workers", Kind::Count(1, 999), Lit("2"),
      "Number of worker nodes (Slurm nodes worker1..workerN); `--workers N` wins."),
    s("DELEGATE_STACK_DIR", "stack.dir", Kind::MountPath, Lit("/srv/delegate-stack"),
      "Host directory for everything the stack keeps: the munge key (secrets/), generated files (generated/), and the shared home (home/)."),
    s("DELEGATE_STACK_HOME", "stack.home", Kind::MountPath, Ref("DELEGATE_STACK_DIR", "/home"),
      "The users' shared home. It is mounted at the SAME absolute path in the user node, the workers and (through sandbox-runner's bind mount, resolved by the host's Docker engine) the sandboxes, so a job directory has one path everywhere. On real machines: an NFS export mounted at this path on every node (docs/instructors.md, real machines)."),
    s("DELEGATE_STACK_STAGING", "stack.staging", Kind::MountPath, Lit("/run/delegate-stack"),
      "The workers' staging directories on the host (one subdirectory per worker, bound into it at /run/delegate/jobs): the root agent pins each running job directory there and the host's Docker engine mounts it into the sandbox from there. `deploy` makes it a shared mount point (mount --bind D D; mount --make-rshared D) so the workers' mounts propagate to the host; `down` unmounts it. On real machines every worker host needs the same (docs/instructors.md, real machines)."),
    s("DELEGATE_STACK_FIRST_JOB_ID", "stack.first_job_id", Kind::Count(1, 2_000_000_000), Lit("30000000"),
      "Slurm job ids of this cluster start here: the sandbox containers of every cluster on one Docker engine carry the label delegate.slurm-job=<id>, and the epilog removes leftovers by that label. A disjoint id range keeps the stack's epilog from ever touching a container of another cluster (the single-machine --local one) on the same engine."),
    s("DELEGATE_STACK_PLACEMENT", "stack.placement", Kind::Flag, Lit("0"),
      "1: place services by node labels (real machines): workerN on the machine `build_cluster.sh machine add` labelled delegate.worker=N, the user node on the node labelled delegate.role=user (deploy labels the manager when none is), head and database on a manager; 0: anywhere (one machine)."),
    s("DELEGATE_STACK_SLOTS", "stack.slots", Kind::Count(1, 999), Lit("16"),
      "With placement: Slurm knows workers 1..slots (at least `workers`) from the deploy on, each waiting (State=FUTURE, not shown by sinfo) until the machine `machine add` numbered so runs it, so that adding a machine to a running course restarts nothing; a number above it needs `update`. Without placement: unused."),
    s("DELEGATE_SLURMD_TIMEOUT", "stack.slurmd_timeout", Kind::Count(10, 3600), Lit("60"),
      "Seconds a node's slurmd may not answer before Slurm sets the node DOWN and queues its calls with retries again (SlurmdTimeout; Slurm asks every third of it): how soon a call on a dead machine runs elsewhere."),
    s("DELEGATE_STACK_WAIT", "stack.wait", Kind::Count(10, 86_400), Lit("180"),
      "Seconds to wait for the stack's services / the Slurm nodes to come up."),
    // [workers]
    s("DELEGATE_STACK_WORKER_CPUS", "workers.cpus", Kind::Count(1, 100_000), Nproc,
      "CPUs Slurm believes each worker has; must not exceed what slurmd detects (else Slurm drains the node \"Low CPUs\")."),
    s("DELEGATE_STACK_WORKER_MEM_MB", "workers.mem_mb", Kind::Count(64, 1 << 40), Lit("1024"),
      "Memory (MB) Slurm believes each worker has; must not exceed what slurmd detects."),
    s("DELEGATE_STACK_WORKER_GPUS", "workers.gpus", Kind::Count(0, 64), Lit("0"),
      "GPUs per worker (gres.conf: /dev/nvidia0..N-1); 0 = no GPUs."),
    s("DELEGATE_STACK_WORKER_SCRATCH", "workers.scratch", Kind::Size, Lit("256M"),
      "Size of each worker's /tmp and /var/tmp (tmpfs, in the worker's memory): what a student can leave there with sbcast during a job is bounded by it, and the epilog removes it after the job."),
    s("DELEGATE_STACK_MAX_CPUS", "workers.max_cpus", Kind::Count(1, 100_000), Ref("DELEGATE_STACK_WORKER_CPUS", ""),
      "The workers' site policy: max_cpus of one job."),
    s("DELEGATE_STACK_MAX_MEM", "workers.max_mem", Kind::Size, Ref("DELEGATE_STACK_WORKER_MEM_MB", "M"),
      "The workers' site policy: max_mem of one job."),
    s("DELEGATE_STACK_MAX_TIME", "workers.max_time", Kind::Duration, Lit("1h"),
      "The workers' site policy: max_time of one job."),
    s("DELEGATE_STACK_MAX_PIDS", "workers.max_pids", Kind::Count(16, 10_000_000), Lit("512"),
      "The workers' site policy: max_pids of one sandbox."),
    s("DELEGATE_STACK_TMP_SIZE", "workers.tmp_size", Kind::Size, Lit("256M"),
      "The workers' site policy: the sandbox's private /tmp."),
    // [images]
    s("DELEGATE_BASE_IMAGE", "images.base", Kind::Image, Lit("delegate-base:bookworm"),
      "Base of every image: a registry image (debian:bookworm-slim) in a real deployment; when absent and not pullable, built with debootstrap."),
    s("DELEGATE_BASE_SUITE", "images.base_suite", Kind::Name, Lit("bookworm"),
      "The Debian suite debootstrap builds that base from."),
    s("DELEGATE_DEBIAN_MIRROR", "images.debian_mirror", Kind::Url, Lit("http://deb.debian.org/debian"),
      "The mirror debootstrap uses."),
    s("DELEGATE_SANDBOX_IMAGE", "images.sandbox", Kind::Image, Lit("delegate-sandbox:latest"),
      "The image jobs run in (docker/sandbox.Dockerfile), on the workers' engines."),
    s("DELEGATE_SANDBOX_CFIDDLE", "images.sandbox_cfiddle", Kind::Flag, Lit("1"),
      "Whether the sandbox image has CFiddle (python/requirements-cfiddle.txt's pins): false for a base whose Python those pins have no wheels for (Debian 13's 3.13); delegate.cfiddle's jobs then end with \"No module named 'cfiddle'\" in the sandbox."),
    s("DELEGATE_CLUSTER_IMAGE", "images.cluster", Kind::Image, Lit("delegate-cluster:latest"),
      "Head and workers (munge, slurmctld/slurmd, Docker CLI, sandbox-runner)."),
    s("DELEGATE_USER_IMAGE", "images.user", Kind::Image, Lit("delegate-user:latest"),
      "User node (Python, the delegate wheel, JupyterLab)."),
    s("DELEGATE_DB_IMAGE", "images.db", Kind::Image, Lit("delegate-db:latest"),
      "The stack's database (Debian's MariaDB in an image built here; its data on the volume <stack>-accounting-db, which `down` keeps)."),
    // [hub]
    s("DELEGATE_JUPYTER_PORT", "hub.port", Kind::Count(1, 65535), Lit("8888"),
      "Students log in at https://<user node's host>:PORT/ with their course account and get their own JupyterLab, as their own uid; the port published on the host that runs the user node."),
    s("DELEGATE_HUB_TLS_CERT", "hub.tls_cert", Kind::PathOrEmpty, Lit(""),
      "The hub's certificate (PEM on this host). Empty: a self-signed one for this host's name is generated once into <stack dir>/secrets/hub-tls.{crt,key} (browsers warn until it is trusted or replaced)."),
    s("DELEGATE_HUB_TLS_KEY", "hub.tls_key", Kind::PathOrEmpty, Lit(""),
      "The hub certificate's key (PEM on this host)."),
    s("DELEGATE_HUB_MEM_LIMIT", "hub.mem_limit", Kind::Size, Lit("2G"),
      "Address space per process of each student's server (set before it switches to the student's uid)."),
    s("DELEGATE_HUB_NPROC_LIMIT", "hub.nproc_limit", Kind::Count(16, 1_000_000), Lit("256"),
      "Processes of one student on the user node."),
    s("DELEGATE_HUB_STUDENT_MEM", "hub.student_mem", Kind::Size, Lit("2G"),
      "Memory of each student on the user node, for their server and everything it starts (past it the kernel kills a process of theirs, not another student's)."),
    s("DELEGATE_HUB_STUDENT_CPUS", "hub.student_cpus", Kind::Cpus, Lit("1"),
      "CPUs of each student on the user node (a cap; under contention the students share the node equally)."),
    s("DELEGATE_HUB_IDLE_TIMEOUT", "hub.idle_timeout", Kind::Count(60, 10_000_000), Lit("3600"),
      "Servers without activity for this many seconds are stopped (jupyterhub-idle-culler; the student's files stay, a new login restarts it)."),
    s("DELEGATE_RPC_RATE", "hub.rpc_rate", Kind::Count(0, 999_999), Lit("20"),
      "New connections per second to slurmctld and slurmdbd from the user node, per student, beyond a burst of rpc_burst (dropped, the client's TCP retries back off), so one student's loop of squeue cannot slow everyone's submissions; 0: no limit. Admins are not limited."),
    s("DELEGATE_RPC_BURST", "hub.rpc_burst", Kind::Count(0, 999_999), Lit("60"),
      "The burst of rpc_rate."),
    s("DELEGATE_RPC_CONNS", "hub.rpc_conns", Kind::Count(0, 999_999), Lit("8"),
      "Connections to slurmctld/slurmdbd one student may hold open at once (slurmctld serves 256 at once); 0: no limit."),
    s("DELEGATE_USER_NODE_CPUS", "hub.user_node_cpus", Kind::Cpus, Nproc,
      "CPUs of the whole user node (the hub and every student's server)."),
    s("DELEGATE_USER_NODE_MEM", "hub.user_node_mem", Kind::Size, Lit("8G"),
      "Memory of the whole user node."),
    s("DELEGATE_USER_NODE_SCRATCH", "hub.user_node_scratch", Kind::Size, Lit("1G"),
      "Size of the user node's /tmp and /var/tmp (tmpfs, in memory: what a student leaves there counts against their own memory, and all of it together cannot fill the host's disk)."),
    s("DELEGATE_JUPYTER_TOKEN", "hub.jupyter_token", Kind::Text, Lit(""),
      "Unused since the hub (kept for old settings files)."),
    s("DELEGATE_JUPYTER_USER", "hub.jupyter_user", Kind::Text, Lit(""),
      "Unused since the hub (kept for old settings files)."),
    // [accounts]
    s("DELEGATE_STACK_USERS", "accounts.stack_users", Kind::Accounts, Lit("student:3000"),
      "The stack's fixed accounts, \"name:uid\" pairs: each gets the same uid/gid on the user node and every worker and a home (0700) in the shared home. The course's students come from the roster instead (`--stack accounts add --csv`)."),
    s("DELEGATE_STACK_TEST_USERS", "accounts.stack_test_users", Kind::Accounts, Lit("dlg-test1:3901 dlg-test2:3902"),
      "The two accounts `build_cluster.sh test` uses (not hub logins)."),
    s("DELEGATE_STACK_ROSTER_FIRST_UID", "accounts.stack_roster_first_uid", Kind::Count(1000, 4_000_000_000), Lit("4000"),
      "The stack's roster gives each new account the first free uid from this one (pick a range free on the NFS server); every account gets an initial hub password, written once to <stack dir>/secrets/initial-passwords (root only)."),
    s("DELEGATE_ROSTER_FIRST_UID", "accounts.roster_first_uid", Kind::Count(1000, 4_000_000_000), Lit("3000"),
      "The single machine's roster (`accounts add --csv`): the lowest uid it gives a new student."),
    s("DELEGATE_ROSTER_HOME_BASE", "accounts.roster_home_base", Kind::Path, Lit("/home"),
      "Where the single machine's roster makes new students' homes."),
    s("DELEGATE_HOME_QUOTA", "accounts.home_quota", Kind::SizeOrZero, Lit("5G"),
      "Each new home's quota (a btrfs subvolume with a qgroup limit, or setquota where ext4/xfs quotas are on); 0: none."),
    // [lockdown]
    s("DELEGATE_ADMIN_GROUP", "lockdown.admin_group", Kind::Name, Lit("delegate-admin"),
      "The single machine's group whose members keep full Slurm (salloc, srun, any batch script, steps) beside root and SlurmUser, and see every process."),
    s("DELEGATE_STACK_ADMIN_GROUP", "lockdown.stack_admin_group", Kind::NameId, Lit("delegate-admin:3990"),
      "The stack's admin group, \"name:gid\", created with this gid on every node."),
    s("DELEGATE_STACK_ADMINS", "lockdown.stack_admins", Kind::Names, Lit(""),
      "Accounts (of stack_users) in the stack's admin group; the roster's instructors are added. Empty: only root."),
    s("DELEGATE_PARTITIONS", "lockdown.partitions", Kind::Names, Lit(""),
      "delegate's Slurm partitions on a cluster whose other partitions run plain Slurm jobs (the site policy's partitions): only they and their nodes are locked down, and the client submits to the first. Empty: the whole cluster is delegate's."),
    s("DELEGATE_SPANK_PLUGIN", "lockdown.spank_plugin", Kind::Path, Lit("/usr/local/lib/delegate/delegate_lockdown.so"),
      "Where the SPANK plugin is installed."),
    s("DELEGATE_HIDEPID", "lockdown.hidepid", Kind::Flag, Lit("1"),
      "1: the single machine's /proc is remounted hidepid=invisible (students see only their own processes)."),
    // [local]
    s("DELEGATE_MAX_CPUS", "local.max_cpus", Kind::Count(1, 100_000), Nproc,
      "max_cpus of a new site policy (never written over an existing file)."),
    s("DELEGATE_MAX_MEM", "local.max_mem", Kind::SizeOrEmpty, Lit(""),
      "max_mem of a new site policy; empty: 3/4 of the machine's memory."),
    s("DELEGATE_MAX_TIME", "local.max_time", Kind::Duration, Lit("1h"),
      "max_time of a new site policy."),
    s("DELEGATE_MAX_PIDS", "local.max_pids", Kind::Count(16, 10_000_000), Lit("512"),
      "max_pids of a new site policy."),
    s("DELEGATE_TMP_SIZE", "local.tmp_size", Kind::Size, Lit("256M"),
      "tmp_size of a new site policy."),
    s("DELEGATE_LOCAL_GPUS", "local.gpus", Kind::Text, Lit("auto"),
      "The node's GPUs: auto (the machine's NVIDIA GPUs, else none), nvidia, a device file expression, none, or standin:N (test scaffolding)."),
    s("DELEGATE_ACCOUNTING", "local.accounting", Kind::Flag, Lit("1"),
      "0: the single machine records no jobs (no slurmdbd, MariaDB or associations; priority by age, `delegate admin usage` has nothing to read): the offline bundle's GPU check (docs/ml.md)."),
    s("DELEGATE_PREFIX", "local.prefix", Kind::Path, Lit("/usr/local/bin"),
      "Where delegate, sandbox-runner and sandbox-agent are installed."),
    s("DELEGATE_STATE_DIR", "local.state_dir", Kind::Path, Lit("/var/lib/delegate"),
      "State (Slurm's spool and state, the database)."),
    s("DELEGATE_LOG_DIR", "local.log_dir", Kind::Path, Lit("/var/log/delegate"),
      "Logs (0711, each log 0640 group adm)."),
    s("DELEGATE_CACHE_DIR", "local.cache_dir", Kind::Path, Lit("/var/cache/delegate"),
      "Caches (downloaded wheels)."),
    s("DELEGATE_RUN_DIR", "local.run_dir", Kind::Path, Lit("/run/delegate"),
      "Runtime files (pid files, the agent's socket)."),
    s("DELEGATE_AGENT_SOCKET", "local.agent_socket", Kind::Path, Lit("/run/delegate/agent.sock"),
      "The root agent's socket (the policy's agent_socket must name it)."),
    s("DELEGATE_POLICY_FILE", "local.policy_file", Kind::Path, Lit("/etc/delegate/policy.toml"),
      "The site policy."),
    s("DELEGATE_DEMO_USER", "local.demo_user", Kind::NameOrEmpty, Lit(""),
      "Who runs the demo job at the end of --local up; empty: $SUDO_USER when it is a real user, else delegate-demo (created when missing)."),
    s("DELEGATE_DEMO_UID", "local.demo_uid", Kind::Count(1000, 4_000_000_000), Lit("2000"),
      "The uid of a demo user created here, when free."),
    s("DELEGATE_SKIP_DEMO", "local.skip_demo", Kind::Flag, Lit("0"),
      "1: no demo job."),
    s("DELEGATE_WAIT", "local.wait", Kind::Count(5, 86_400), Lit("90"),
      "Seconds to wait for a daemon or the node to become ready."),

    // [accounting]
    s("DELEGATE_DB_NAME", "accounting.db_name", Kind::Name, Lit("delegate_acct_db"),
      "slurmdbd's database."),
    s("DELEGATE_DB_DIR", "accounting.db_dir", Kind::Path, Ref("DELEGATE_STATE_DIR", "/mariadb"),
      "MariaDB's data directory (single machine)."),
    s("DELEGATE_DB_PORT", "accounting.db_port", Kind::Count(1, 65535), Lit("3306"),
      "MariaDB's port (single machine: on 127.0.0.1)."),
    s("DELEGATE_DBD_PORT", "accounting.dbd_port", Kind::Count(1, 65535), Lit("6819"),
      "slurmdbd's port."),
    s("DELEGATE_COURSE_ACCOUNT", "accounting.course_account", Kind::Name, Lit("course"),
      "The Slurm account every student's association is in."),
    s("DELEGATE_STUDENT_QOS", "accounting.student_qos", Kind::Name, Lit("student"),
      "The students' Slurm QOS."),
    s("DELEGATE_QOS_MAX_SUBMIT", "accounting.qos_max_submit", Kind::Count(1, 1_000_000), Lit("1000"),
      "Jobs (array tasks count one each) a student may have queued or running at once; at least the client's largest array (1000) so one map of any size is never refused."),
    s("DELEGATE_QOS_MAX_RUNNING", "accounting.qos_max_running", Kind::Count(1, 1_000_000), Lit("12"),
      "Jobs running at once per student (each holds a whole node)."),
    s("DELEGATE_QOS_MAX_CPU_RUN_MINS", "accounting.qos_max_cpu_run_mins", Kind::Count(1, 1 << 40), NprocTimes(1440),
      "CPU-minutes (time limit x CPUs) of a student's running jobs together; more stay pending. Default: the machine's cores x 12 x 120."),
    // [elastic]
    s("DELEGATE_ELASTIC", "elastic.enabled", Kind::Flag, Lit("0"),
      "1: Slurm's power saving starts workers when jobs wait and stops them after `idle` seconds without a job; the stack then has `max` workers (workers and --workers are ignored), worker1..`min` always run, the others are CLOUD nodes powered down until a job needs them (docs/elastic.md)."),
    s("DELEGATE_ELASTIC_MIN", "elastic.min", Kind::Count(0, 999), Lit("0"),
      "Workers that always run."),
    s("DELEGATE_ELASTIC_MAX", "elastic.max", Kind::Count(1, 999), Lit("2"),
      "Workers in all."),
    s("DELEGATE_ELASTIC_IDLE", "elastic.idle", Kind::Count(10, 10_000_000), Lit("600"),
      "Seconds without a job before a worker is stopped (SuspendTime)."),
    s("DELEGATE_ELASTIC_RESUME_TIMEOUT", "elastic.resume_timeout", Kind::Count(30, 86_400), Lit("180"),
      "Seconds a started worker has to register with slurmctld (ResumeTimeout); after it the node is DOWN with the reason and its jobs end with it."),
    s("DELEGATE_POWER_HOOK", "elastic.power_hook", Kind::PathOrEmpty, Lit(""),
      "Real machines: a script on this host that powers nodes on and off, called as SlurmUser on the head as `HOOK resume|suspend NODE...` (wake-on-LAN, IPMI, a cloud CLI); it replaces the stack's power service. Empty: the power service."),
];

impl Kind {
    /// Whether `v` is a value of this kind; else what it must be.
    pub fn check(self, v: &str) -> Result<(), String> {
        let ok = match self {
            Kind::Count(min, max) => v.len() <= 20 && v.parse::<u64>().is_ok_and(|n| (min..=max).contains(&n)),
            Kind::Flag => v == "0" || v == "1",
            Kind::Size => is_size(v),
            Kind::SizeOrEmpty => v.is_empty() || is_size(v),
            Kind::SizeOrZero => v == "0" || is_size(v),
            Kind::Duration => is_plain(v) && delegate_protocol::units::parse_duration(v).is_ok_and(|s| s > 0),
            Kind::SlurmTime => is_slurm_time(v),
            Kind::Path => is_safe_path(v),
            Kind::PathOrEmpty => v.is_empty() || is_safe_path(v),
            Kind::Image => is_image(v),
            Kind::Name => is_unix_name(v),
            Kind::StackName => {
                v.len() <= 40
                    && v.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
                    && v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            }
            Kind::MountPath => {
                is_safe_path(v)
                    && v.len() > 1
                    && !v.ends_with('/')
                    && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b))
            }
            Kind::NameOrEmpty => v.is_empty() || is_unix_name(v),
            Kind::NameId => v.split_once(':').is_some_and(|(n, id)| is_unix_name(n) && is_id(id)),
            Kind::Accounts => v.split(' ').filter(|w| !w.is_empty()).all(|w| Kind::NameId.check(w).is_ok()),
            Kind::Names => v.split(' ').filter(|w| !w.is_empty()).all(is_unix_name),
            Kind::Cpus => is_cpus(v),
            Kind::Url => {
                (v.starts_with("http://") || v.starts_with("https://"))
                    && v.len() <= 1024
                    && v.bytes().all(|b| b.is_ascii_graphic() && !b"\"'`\\$".contains(&b))
            }
            Kind::Text => v.len() <= 4096 && !v.chars().any(char::is_control),
        };
        if ok {
            Ok(())
        } else {
            Err(self.want().to_owned())
        }
    }

    /// What a value of this kind looks like, for errors and the docs.
    pub fn want(self) -> &'static str {
        match self {
            Kind::Count(..) => "a whole number in its range",
            Kind::Flag => "0 or 1 (false or true)",
            Kind::Size => "a size such as 512M or 4G",
            Kind::SizeOrEmpty => "a size such as 512M or 4G, or empty",
            Kind::SizeOrZero => "a size such as 512M or 4G, or 0",
            Kind::Duration => "a duration such as 90s, 10m or 1h",
            Kind::SlurmTime => "a Slurm time such as 02:00:00 or 1-00:00:00",
            Kind::Path => "an absolute path of A-Z a-z 0-9 . _ / + @ = , : -",
            Kind::PathOrEmpty => "an absolute path of A-Z a-z 0-9 . _ / + @ = , : -, or empty",
            Kind::Image => "a Docker image name such as delegate-sandbox:latest",
            Kind::Name => "a name of a-z 0-9 _ - starting with a letter or _",
            Kind::StackName => "a name of a-z 0-9 - starting with a letter, at most 40 bytes",
            Kind::MountPath => "an absolute path of A-Z a-z 0-9 . _ / -, without '..' or a trailing /",
            Kind::NameOrEmpty => "a name of a-z 0-9 _ -, or empty",
            Kind::NameId => "name:number",
            Kind::Accounts => "space-separated name:uid pairs",
            Kind::Names => "space-separated names",
            Kind::Cpus => "a number of CPUs such as 2 or 0.5",
            Kind::Url => "an http:// or https:// URL",
            Kind::Text => "one line of text",
        }
    }
}

fn is_plain(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric())
}

fn is_size(v: &str) -> bool {
    is_plain(v) && delegate_protocol::units::parse_size(v).is_ok_and(|b| b > 0)
}

fn is_id(v: &str) -> bool {
    !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()) && v.parse::<u32>().is_ok()
}

/// A positive decimal number of CPUs (Docker's `cpus`: 2, 0.5).
pub fn is_cpus(s: &str) -> bool {
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (s, None),
    };
    !whole.is_empty()
        && s.len() <= 12
        && whole.bytes().all(|b| b.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
        && s.bytes().any(|b| (b'1'..=b'9').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_is_named_once_and_its_literal_default_is_valid() {
        let mut envs: Vec<&str> = SETTINGS.iter().map(|s| s.env).collect();
        let mut keys: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
        envs.sort_unstable();
        keys.sort_unstable();
        let (ne, nk) = (envs.len(), keys.len());
        envs.dedup();
        keys.dedup();
        assert_eq!((envs.len(), keys.len()), (ne, nk), "a name or key twice");
        for s in SETTINGS {
            assert!(s.env.starts_with("DELEGATE_"), "{}", s.env);
            assert!(
                s.key.split_once('.').is_some_and(|(a, b)| is_unix_name(a) && is_unix_name(b)),
                "{}",
                s.key
            );
            if let Lit(v) = s.default {
                s.kind
                    .check(v)
                    .unwrap_or_else(|w| panic!("{}: default '{v}' is not {w}", s.env));
            }
            if let Ref(other, _) = s.default {
                let before = SETTINGS.iter().take_while(|x| x.env != s.env).any(|x| x.env == other);
                assert!(before, "{} refers to {other}, which is not resolved before it", s.env);
            }
            assert!(!s.doc.is_empty() && !s.doc.contains('\n'), "{}", s.env);
        }
    }

    #[test]
    fn kinds() {
        let want = |w: &str| Err(w.to_owned());
        assert_eq!(Kind::Count(1, 9).check("3"), Ok(()));
        assert_eq!(Kind::Count(1, 9).check("0"), want("a whole number in its range"));
        assert_eq!(Kind::Accounts.check("a:1 b:2"), Ok(()));
        assert_eq!(Kind::Accounts.check("a:1 B:2"), want("space-separated name:uid pairs"));
        assert_eq!(Kind::Accounts.check(""), Ok(()));
        assert_eq!(Kind::Url.check("http://deb.debian.org/debian"), Ok(()));
        assert_eq!(Kind::Url.check("ftp://x"), want("an http:// or https:// URL"));
        assert_eq!(Kind::Text.check("a\nb"), want("one line of text"));
        assert_eq!(Kind::SizeOrZero.check("0"), Ok(()));
        assert_eq!(Kind::Size.check("0"), want("a size such as 512M or 4G"));
        for ok in ["1", "2", "0.5", "16"] {
            assert!(is_cpus(ok), "{ok}");
        }
        for bad in ["", "0", "0.0", "1.", ".5", "-1", "1e3", "2 "] {
            assert!(!is_cpus(bad), "{bad}");
        }
    }
}

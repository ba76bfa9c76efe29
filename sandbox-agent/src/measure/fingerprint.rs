//! The machine a call runs on, read by the agent (root) from the node's
//! /proc and /sys before the sandbox starts and after it ends; the
//! student's code never touches it. What the node does not expose
//! (cpufreq in a VM, microcode, throttle counters) stays unknown.

use std::collections::BTreeSet;
use std::path::Path;

use delegate_protocol::fingerprint::{Fingerprint, MAX_LIST};

/// What is read before the call (the counters to subtract, the state at
/// the start).
pub struct Before {
    cores: Vec<u32>,
    siblings: Vec<u32>,
    busy_cores: Option<u64>,
    busy_siblings: Option<u64>,
    cur_khz: Option<u64>,
    throttle: Option<u64>,
    others: BTreeSet<String>,
    /// The uid of the call's student (their own tasks are named).
    caller: u32,
}

impl Before {
    /// Nothing known (the reading itself failed).
    pub fn unknown(caller: u32) -> Before {
        Before {
            cores: Vec::new(),
            siblings: Vec::new(),
            busy_cores: None,
            busy_siblings: None,
            cur_khz: None,
            throttle: None,
            others: BTreeSet::new(),
            caller,
        }
    }
}

/// `0-3,5` (a kernel CPU list) as numbers; None when malformed.
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 4096 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

fn read(root: &Path, rel: &str) -> Option<String> {
    let path = root.join(rel.trim_start_matches('/'));
    let mut s = String::new();
    use std::io::Read;
    std::fs::File::open(path).ok()?.take(1 << 20).read_to_string(&mut s).ok()?;
    Some(s)
}

fn read_trim(root: &Path, rel: &str) -> Option<String> {
    read(root, rel).map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

/// The /proc/cpuinfo block of processor `cpu`: (key, value) pairs.
pub fn cpuinfo_block(text: &str, cpu: u32) -> Vec<(String, String)> {
    text.split("\n\n")
        .map(|block| {
            block
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect::<Vec<_>>()
        })
        .find(|kv| kv.iter().any(|(k, v)| k == "processor" && v.parse() == Ok(cpu)))
        .unwrap_or_default()
}

/// Busy time (jiffies: user, nice, system, irq, softirq, steal) of `cores`
/// summed, from /proc/stat; None when a core is missing.
pub fn busy_jiffies(stat: &str, cores: &[u32]) -> Option<u64> {
    let mut total = 0u64;
    for c in cores {
        let name = format!("cpu{c}");
        let line = stat.lines().find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        let f: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal
        total += [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum::<u64>();
    }
    Some(total)
}

/// From a /proc/<pid>/stat line: the command name, the parent pid and the
/// CPU it last ran on.
pub fn task_cpu(stat: &str) -> Option<(String, i64, u32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    // rest[0] is field 3 (state): ppid is field 4, processor field 39.
    Some((comm, rest.get(1)?.parse().ok()?, rest.get(36)?.parse().ok()?))
}

/// What the fingerprint names a task of `owner` by, for a call of `caller`:
/// root's, a system account's (below Debian's UID_MIN, or nobody) and the
/// caller's own by their command name; another student's never (security
/// round 4, item 5: a renamed process of another student showed in the
/// attacker's `delegate result` while `ps` hid it).
pub fn shown_name(comm: &str, owner: u32, caller: u32) -> String {
    const FIRST_USER_UID: u32 = 1000;
    const NOBODY: u32 = 65534;
    if owner < FIRST_USER_UID || owner == NOBODY || owner == caller {
        comm.chars().take(32).collect()
    } else {
        ANOTHER_USER.to_owned()
    }
}

/// How another user's task shows in `others_seen`.
pub const ANOTHER_USER: &str = "another user's process";

/// Names of the tasks (not kernel threads, not `skip`) that last ran on
/// `cores`, as `proc` shows them (bounded; see [`shown_name`]).
fn others_on(proc: &Path, cores: &[u32], skip: &BTreeSet<i32>, caller: u32) -> BTreeSet<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(proc) else {
        return out;
    };
    for e in entries.flatten().take(100_000) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if skip.contains(&pid) {
            continue;
        }
        let Some((comm, ppid, cpu)) = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(task_cpu)
        else {
            continue;
        };
        // Kernel threads: kthreadd (pid 2) and its children.
        if pid == 2 || ppid == 2 || !cores.contains(&cpu) {
            continue;
        }
        // The task's owner: its /proc directory's (unknown: not shown by name).
        let owner = std::fs::metadata(e.path()).map_or(u32::MAX, |m| m.uid());
        if out.len() < MAX_LIST {
            out.insert(shown_name(&comm, owner, caller));
        }
    }
    out
}

fn throttle(root: &Path, cores: &[u32]) -> Option<u64> {
    cores
        .iter()
        .map(|c| {
            read_trim(
                root,
                &format!("sys/devices/system/cpu/cpu{c}/thermal_throttle/core_throttle_count"),
            )?
            .parse::<u64>()
            .ok()
        })
        .sum()
}

fn first(cores: &[u32]) -> u32 {
    cores.first().copied().unwrap_or(0)
}

/// The state before the call on `cores`; `proc` shows the node's tasks,
/// `skip` the pids not to count (the agent's own).
pub fn before(root: &Path, proc: &Path, cores: &[u32], skip: &BTreeSet<i32>, caller: u32) -> Before {
    let cores: Vec<u32> = cores.iter().copied().take(MAX_LIST).collect();
    let mut siblings = BTreeSet::new();
    for c in &cores {
        let list = read(root, &format!("sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"));
        siblings.extend(list.as_deref().and_then(parse_cpu_list).unwrap_or_default());
    }
    let siblings: Vec<u32> = siblings.into_iter().filter(|s| !cores.contains(s)).take(MAX_LIST).collect();
    let stat = read(root, "proc/stat").unwrap_or_default();
    Before {
        busy_cores: busy_jiffies(&stat, &cores),
        busy_siblings: if siblings.is_empty() {
            Some(0)
        } else {
            busy_jiffies(&stat, &siblings)
        },
        cur_khz: read_trim(
            root,
            &format!("sys/devices/system/cpu/cpu{}/cpufreq/scaling_cur_freq", first(&cores)),
        )
        .and_then(|s| s.parse().ok()),
        throttle: throttle(root, &cores),
        others: others_on(proc, &cores, skip, caller),
        caller,
        cores,
        siblings,
    }
}

/// Boost on/off: the cpufreq `boost` switch, or intel_pstate's no_turbo.
fn boost(root: &Path) -> Option<bool> {
    if let Some(v) = read_trim(root, "sys/devices/system/cpu/cpufreq/boost") {
        return Some(v == "1");
    }
    read_trim(root, "sys/devices/system/cpu/intel_pstate/no_turbo").map(|v| v == "0")
}

/// Boot parameters that bear on timing.
pub fn timing_params(cmdline: &str) -> Vec<String> {
    const KEEP: &[&str] = &[
        "isolcpus=",
        "nohz_full=",
        "rcu_nocbs=",
        "mitigations=",
        "intel_pstate=",
        "amd_pstate=",
        "processor.max_cstate=",
        "intel_idle.max_cstate=",
        "idle=",
        "nosmt",
        "nohz=",
        "irqaffinity=",
    ];
    cmdline
        .split_whitespace()
        .filter(|p| KEEP.iter().any(|k| p.starts_with(k)))
        .take(MAX_LIST)
        .map(|p| p.chars().take(200).collect())
        .collect()
}

/// Ticks per second of /proc/stat.
pub(crate) fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// The fingerprint of the call, from `b` and the node now.
#[allow(clippy::too_many_arguments)]
pub fn after(
    root: &Path,
    proc: &Path,
    b: Before,
    skip: &BTreeSet<i32>,
    node: &str,
    perf_mode: &str,
    image_id: Option<String>,
    hardware_counters: Option<bool>,
) -> Fingerprint {
    let cpu = first(&b.cores);
    let info = read(root, "proc/cpuinfo").map(|t| cpuinfo_block(&t, cpu)).unwrap_or_default();
    let get = |k: &str| {
        info.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.chars().take(200).collect::<String>())
    };
    let num = |k: &str| get(k).and_then(|v| v.parse().ok());
    let stat = read(root, "proc/stat").unwrap_or_default();
    let ms = |j: u64| j * 1000 / clock_ticks();
    let delta = |now: Option<u64>, then: Option<u64>| Some(ms(now?.saturating_sub(then?)));
    let freq = |f: &str| read_trim(root, &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/{f}"));
    let mut others = b.others;
    others.extend(others_on(proc, &b.cores, skip, b.caller));
    Fingerprint {
        node: node.to_owned(),
        cpu_vendor: get("vendor_id"),
        cpu_model: get("model name"),
        cpu_family: num("cpu family"),
        cpu_model_number: num("model"),
        cpu_stepping: num("stepping"),
        microcode: get("microcode"),
        siblings_busy_ms: if b.siblings.is_empty() {
            Some(0)
        } else {
            delta(busy_jiffies(&stat, &b.siblings), b.busy_siblings)
        },
        cores_busy_ms: delta(busy_jiffies(&stat, &b.cores), b.busy_cores),
        others_seen: others.into_iter().take(MAX_LIST).collect(),
        scaling_driver: freq("scaling_driver"),
        governor: freq("scaling_governor"),
        boost: boost(root),
        min_khz: freq("scaling_min_freq").and_then(|s| s.parse().ok()),
        max_khz: freq("scaling_max_freq").and_then(|s| s.parse().ok()),
        cur_khz_start: b.cur_khz,
        cur_khz_end: freq("scaling_cur_freq").and_then(|s| s.parse().ok()),
        throttle_start: b.throttle,
        throttle_end: throttle(root, &b.cores),
        kernel: read_trim(root, "proc/sys/kernel/osrelease"),
        boot_params: read(root, "proc/cmdline").map(|c| timing_params(&c)).unwrap_or_default(),
        image_id,
        perf_mode: perf_mode.to_owned(),
        hardware_counters,
        tuning: Vec::new(),
        gpus: Vec::new(),
        taken_ms: delegate_protocol::now_ms(),
        cores: b.cores,
        smt_siblings: b.siblings,
    }
}

/// Whether this node counts hardware events (CPU cycles) for a process of
/// its own; None when the probe itself fails in an unexpected way.
pub fn hardware_counters() -> Option<bool> {
    static ONCE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ONCE.get_or_init(|| {
        // struct perf_event_attr: type (u32), size (u32), config (u64), ...
        // flags at byte 40: disabled (bit 0), exclude_kernel (bit 5), exclude_hv (bit 6).
        let mut attr = [0u8; 128];
        attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
        let flags: u64 = 1 | (1 << 5) | (1 << 6);
        attr[40..48].copy_from_slice(&flags.to_ne_bytes());
        // type PERF_TYPE_HARDWARE (0), config PERF_COUNT_HW_CPU_CYCLES (0).
        // SAFETY: attr is a valid perf_event_attr of the size it declares;
        // the returned descriptor is closed below.
        let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0) };
        if fd >= 0 {
            // SAFETY: fd is the descriptor perf_event_open returned.
            unsafe { libc::close(fd as i32) };
            return Some(true);
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) => Some(false),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_stat_lines_and_cpuinfo_blocks() {
        assert_eq!(parse_cpu_list("0-2,5\n"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        let stat = "cpu  1 1 1 1 1 1 1 1 0 0\ncpu0 10 1 2 100 7 3 4 5 0 0\ncpu1 1 0 0 9 0 0 0 0 0 0\n";
        assert_eq!(busy_jiffies(stat, &[0]), Some(10 + 1 + 2 + 3 + 4 + 5));
        assert_eq!(busy_jiffies(stat, &[0, 1]), Some(26));
        assert_eq!(busy_jiffies(stat, &[7]), None);
        let info = "processor\t: 0\nmodel name\t: A\n\nprocessor\t: 1\nmodel name\t: B\nstepping\t: 3\n";
        let b = cpuinfo_block(info, 1);
        assert!(b.contains(&("model name".into(), "B".into())) && b.contains(&("stepping".into(), "3".into())));
        let t = "42 (a b) c) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 5 1 1 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0";
        assert_eq!(task_cpu(t), Some(("a b) c".into(), 7, 3)));
        assert_eq!(
            timing_params("ro quiet isolcpus=2,3 mitigations=off root=/dev/x"),
            ["isolcpus=2,3", "mitigations=off"]
        );
    }

    /// Against this machine's own /proc and /sys: the model name and the
    /// kernel are what they say; a field the node lacks is unknown.
    #[test]
    fn the_fingerprint_says_what_this_node_says() {
        let root = Path::new("/");
        let skip = BTreeSet::new();
        let b = before(root, Path::new("/proc"), &[0], &skip, 4242);
        let f = after(root, Path::new("/proc"), b, &skip, "n", "seccomp", None, hardware_counters());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned());
        assert_eq!(f.cpu_model, model);
        assert_eq!(
            f.kernel.as_deref(),
            Some(std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim())
        );
        let gov = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").ok();
        assert_eq!(f.governor, gov.map(|g| g.trim().to_owned()));
        assert_eq!(f.cores, [0]);
        assert!(f.cores_busy_ms.is_some());
    }

    #[test]
    fn another_users_tasks_are_not_named() {
        assert_eq!(shown_name("sshd", 0, 2000), "sshd");
        assert_eq!(shown_name("munged", 105, 2000), "munged");
        assert_eq!(shown_name("nobody-task", 65534, 2000), "nobody-task");
        assert_eq!(shown_name("my-own", 2000, 2000), "my-own");
        assert_eq!(shown_name("exam-keygen-v", 2001, 2000), ANOTHER_USER);
        assert_eq!(shown_name("x", u32::MAX, 2000), ANOTHER_USER);
        assert_eq!(shown_name(&"a".repeat(40), 0, 1).len(), 32);
    }
}

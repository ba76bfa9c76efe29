//! delegate's own seccomp profile, in the JSON format the Docker engine
//! accepts for `--security-opt seccomp=<json>`.
//!
//! Used when the engine rejects `CAP_PERFMON` by name (Docker before 24):
//! the engine's default profile only allows `perf_event_open` to containers
//! holding CAP_SYS_ADMIN/CAP_PERFMON, so instead of adding a capability we
//! replace the profile with this one, which allows `perf_event_open` to
//! everybody and is otherwise an explicit allowlist of ordinary syscalls.
//! Written from scratch for delegate (not derived from moby's default
//! profile): everything not listed fails with EPERM.
//!
//! Deliberately absent (and so denied): mounting and file-system contexts,
//! namespaces (`unshare`, `setns`, namespace flags of `clone`), `chroot`,
//! `pivot_root`, tracing other processes (`ptrace`, `process_vm_*`,
//! `kcmp`, `process_madvise`), kernel modules, `kexec_*`, `reboot`, swap,
//! setting clocks, `acct`, `bpf`, the kernel keyring, `userfaultfd`,
//! `iopl`/`ioperm`/`modify_ldt`, file handles, quotas, `syslog`, host and
//! domain names, `vhangup`, `fanotify`, `io_uring`, NUMA policy changes,
//! `uselib`, `_sysctl`, `vm86`, `nfsservctl`, and obsolete module calls.

use serde_json::{json, Value};

/// `CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID
/// | CLONE_NEWNET | CLONE_NEWCGROUP`.
pub const CLONE_NAMESPACE_FLAGS: u64 = 0x7E02_0000;
/// `ENOSYS`: returned for `clone3` so that glibc falls back to `clone`,
/// whose flags (unlike clone3's, which live in memory) can be filtered.
const ENOSYS: u32 = 38;

/// Ordinary syscalls a program may need, grouped by what they are for.
/// Names unknown on an architecture are ignored by the engine.
#[rustfmt::skip] // grouped by purpose, several names a line
pub const ALLOWED: &[&str] = &[
    // --- file descriptors and file I/O
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
    "preadv2", "pwritev2", "open", "openat", "openat2", "creat", "close", "close_range",
    "dup", "dup2", "dup3", "lseek", "_llseek", "fcntl", "fcntl64", "ioctl", "flock",
    "fsync", "fdatasync", "sync", "syncfs", "sync_file_range", "sync_file_range2",
    "arm_sync_file_range", "fadvise64", "fadvise64_64", "arm_fadvise64_64",
    "readahead", "fallocate", "truncate", "truncate64", "ftruncate", "ftruncate64",
    "sendfile", "sendfile64", "splice", "tee", "vmsplice", "copy_file_range",
    "pipe", "pipe2", "memfd_create",
    // --- file metadata and directories
    "stat", "fstat", "lstat", "stat64", "fstat64", "lstat64", "newfstatat", "fstatat64",
    "statx", "statfs", "fstatfs", "statfs64", "fstatfs64", "access", "faccessat",
    "faccessat2", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir",
    "mkdirat", "rmdir", "rename", "renameat", "renameat2", "link", "linkat", "unlink",
    "unlinkat", "symlink", "symlinkat", "readlink", "readlinkat", "chmod", "fchmod",
    "fchmodat", "chown", "fchown", "lchown", "fchownat", "chown32", "fchown32",
    "lchown32", "umask", "mknod", "mknodat", "utime", "utimes", "futimesat",
    "utimensat", "utimensat_time64", "setxattr", "lsetxattr", "fsetxattr", "getxattr",
    "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr", "removexattr",
    "lremovexattr", "fremovexattr",
    // --- polling and event notification
    "poll", "ppoll", "ppoll_time64", "select", "_newselect", "pselect6",
    "pselect6_time64", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "signalfd", "signalfd4",
    "timerfd_create", "timerfd_settime", "timerfd_gettime", "timerfd_settime64",
    "timerfd_gettime64", "inotify_init", "inotify_init1", "inotify_add_watch",
    "inotify_rm_watch",
    // --- asynchronous I/O (libaio; not io_uring)
    "io_setup", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64",
    "io_submit", "io_cancel",
    // --- memory
    "brk", "mmap", "mmap2", "munmap", "mremap", "mprotect", "msync", "mincore",
    "madvise", "mlock", "mlock2", "munlock", "mlockall", "munlockall",
    "remap_file_pages", "get_mempolicy", "membarrier", "pkey_alloc", "pkey_free",
    "pkey_mprotect",
    // --- processes and threads (clone is allowed separately, with a filter)
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
    "waitpid", "set_tid_address", "set_robust_list", "get_robust_list", "rseq",
    "futex", "futex_time64", "futex_waitv", "arch_prctl", "set_thread_area",
    "get_thread_area", "set_tls", "cacheflush", "breakpoint", "prctl", "seccomp",
    "capget", "capset", "landlock_create_ruleset", "landlock_add_rule",
    "landlock_restrict_self", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "restart_syscall",
    // --- identity (without capabilities these can only drop or keep ids)
    "getpid", "getppid", "gettid", "getuid", "geteuid", "getgid", "getegid",
    "getuid32", "geteuid32", "getgid32", "getegid32", "getresuid", "getresgid",
    "getresuid32", "getresgid32", "getgroups", "getgroups32", "setuid", "setgid",
    "setuid32", "setgid32", "setreuid", "setregid", "setreuid32", "setregid32",
    "setresuid", "setresgid", "setresuid32", "setresgid32", "setfsuid", "setfsgid",
    "setfsuid32", "setfsgid32", "setgroups", "setgroups32", "getpgid", "setpgid",
    "getpgrp", "getsid", "setsid",
    // --- scheduling, priorities and limits
    "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam",
    "sched_setparam", "sched_getscheduler", "sched_setscheduler", "sched_getattr",
    "sched_setattr", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "sched_rr_get_interval_time64", "getpriority",
    "setpriority", "ioprio_get", "ioprio_set", "getrlimit", "ugetrlimit", "setrlimit",
    "prlimit64", "getrusage", "getcpu",
    // --- signals
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending",
    "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_sigsuspend", "rt_sigqueueinfo",
    "rt_tgsigqueueinfo", "sigaction", "sigprocmask", "sigreturn", "sigsuspend",
    "sigpending", "signal", "sigaltstack", "kill", "tkill", "tgkill", "pause", "alarm",
    "getitimer", "setitimer",
    // --- time (reading clocks and sleeping; setting clocks is denied)
    "time", "gettimeofday", "clock_gettime", "clock_gettime64", "clock_getres",
    "clock_getres_time64", "clock_nanosleep", "clock_nanosleep_time64", "nanosleep",
    "times", "timer_create", "timer_settime", "timer_settime64", "timer_gettime",
    "timer_gettime64", "timer_getoverrun", "timer_delete",
    // --- system information
    "uname", "sysinfo", "getrandom",
    // --- System V and POSIX IPC (the container has a private IPC namespace)
    "ipc", "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop",
    "semtimedop_time64", "semctl", "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open",
    "mq_unlink", "mq_timedsend", "mq_timedsend_time64", "mq_timedreceive",
    "mq_timedreceive_time64", "mq_notify", "mq_getsetattr",
    // --- sockets (the container has no network; local sockets still work)
    "socket", "socketpair", "socketcall", "connect", "accept", "accept4", "bind",
    "listen", "shutdown", "getsockname", "getpeername", "setsockopt", "getsockopt",
    "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg",
    "recvmmsg_time64", "send", "recv",
    // --- performance counters: the reason this profile exists
    "perf_event_open",
];

/// Syscalls that must never be in the allowlist (checked by the tests and
/// by [`profile`] in debug builds).
#[rustfmt::skip] // several names a line
pub const DENIED: &[&str] = &[
    "mount", "umount", "umount2", "fsopen", "fsmount", "fsconfig", "move_mount",
    "open_tree", "fspick", "mount_setattr", "pivot_root", "chroot", "unshare", "setns",
    "clone3", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "process_madvise", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "settimeofday", "clock_settime",
    "clock_settime64", "clock_adjtime", "clock_adjtime64", "adjtimex", "stime", "acct",
    "bpf", "keyctl", "add_key", "request_key", "userfaultfd", "iopl", "ioperm",
    "modify_ldt", "open_by_handle_at", "name_to_handle_at", "quotactl", "quotactl_fd",
    "lookup_dcookie", "syslog", "sethostname", "setdomainname", "vhangup",
    "fanotify_init", "fanotify_mark", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "mbind", "set_mempolicy", "set_mempolicy_home_node",
    "migrate_pages", "move_pages", "uselib", "_sysctl", "vm86", "vm86old",
    "nfsservctl", "create_module", "get_kernel_syms", "query_module", "memfd_secret",
    "personality",
];

/// Personality values a program may set: PER_LINUX, PER_LINUX32,
/// UNAME26, UNAME26|PER_LINUX32, and 0xffffffff (query).
pub const PERSONALITY_ALLOWED: &[u64] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

fn allow(names: &[&str]) -> Value {
    json!({ "names": names, "action": "SCMP_ACT_ALLOW" })
}

/// The profile as a JSON value.
pub fn profile() -> Value {
    debug_assert!(ALLOWED.iter().all(|n| !DENIED.contains(n)));
    let mut rules = vec![allow(ALLOWED)];
    // clone: allowed only without namespace flags (flags are argument 0 on
    // x86 and arm; (flags & NS_FLAGS) == 0).
    rules.push(json!({
        "names": ["clone"],
        "action": "SCMP_ACT_ALLOW",
        "args": [{
            "index": 0,
            "value": CLONE_NAMESPACE_FLAGS,
            "valueTwo": 0,
            "op": "SCMP_CMP_MASKED_EQ"
        }]
    }));
    // clone3: ENOSYS so that the C library falls back to clone.
    rules.push(json!({
        "names": ["clone3"],
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": ENOSYS
    }));
    // personality: a few harmless values only (one rule each: args AND).
    for v in PERSONALITY_ALLOWED {
        rules.push(json!({
            "names": ["personality"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{ "index": 0, "value": v, "valueTwo": 0, "op": "SCMP_CMP_EQ" }]
        }));
    }
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "archMap": [
            {
                "architecture": "SCMP_ARCH_X86_64",
                "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]
            },
            {
                "architecture": "SCMP_ARCH_AARCH64",
                "subArchitectures": ["SCMP_ARCH_ARM"]
            }
        ],
        "syscalls": rules
    })
}

/// The profile as compact JSON, for `security_opt: seccomp=<json>`.
pub fn profile_json() -> String {
    profile().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules that unconditionally allow `name`.
    fn unconditional(p: &Value, name: &str) -> bool {
        p["syscalls"].as_array().into_iter().flatten().any(|r| {
            r["action"] == "SCMP_ACT_ALLOW"
                && r.get("args").is_none()
                && r["names"].as_array().into_iter().flatten().any(|n| n == name)
        })
    }

    fn rules_for<'a>(p: &'a Value, name: &str) -> Vec<&'a Value> {
        p["syscalls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["names"].as_array().into_iter().flatten().any(|n| n == name))
            .collect()
    }

    #[test]
    fn perf_event_open_is_allowed() {
        assert!(unconditional(&profile(), "perf_event_open"));
    }

    #[test]
    fn dangerous_syscalls_are_denied() {
        let p = profile();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(p["defaultErrnoRet"], 1);
        for name in [
            "mount",
            "umount2",
            "unshare",
            "setns",
            "ptrace",
            "bpf",
            "keyctl",
            "pivot_root",
            "chroot",
            "init_module",
            "kexec_load",
            "io_uring_setup",
            "process_vm_readv",
            "userfaultfd",
            "open_by_handle_at",
            "fsopen",
        ] {
            assert!(rules_for(&p, name).is_empty(), "{name} must not appear in any rule");
        }
        for name in DENIED {
            assert!(!unconditional(&p, name), "{name} is allowed unconditionally");
        }
    }

    #[test]
    fn clone_is_filtered_and_clone3_is_enosys() {
        let p = profile();
        let clone = rules_for(&p, "clone");
        assert_eq!(clone.len(), 1);
        assert_eq!(clone[0]["args"][0]["op"], "SCMP_CMP_MASKED_EQ");
        assert_eq!(clone[0]["args"][0]["value"], 0x7E02_0000u64);
        assert_eq!(clone[0]["args"][0]["valueTwo"], 0);
        let clone3 = rules_for(&p, "clone3");
        assert_eq!(clone3.len(), 1);
        assert_eq!(clone3[0]["action"], "SCMP_ACT_ERRNO");
        assert_eq!(clone3[0]["errnoRet"], 38);
    }

    #[test]
    fn personality_only_with_known_values() {
        let p = profile();
        let rules = rules_for(&p, "personality");
        assert_eq!(rules.len(), PERSONALITY_ALLOWED.len());
        assert!(rules.iter().all(|r| r["args"][0]["op"] == "SCMP_CMP_EQ"));
    }

    #[test]
    fn lists_are_disjoint_and_unique() {
        let mut seen = std::collections::HashSet::new();
        for n in ALLOWED {
            assert!(seen.insert(*n), "{n} listed twice");
            assert!(!DENIED.contains(n), "{n} is both allowed and denied");
        }
    }

    #[test]
    fn architectures() {
        let p = profile();
        let s = p["archMap"].to_string();
        for a in [
            "SCMP_ARCH_X86_64",
            "SCMP_ARCH_X86",
            "SCMP_ARCH_X32",
            "SCMP_ARCH_AARCH64",
            "SCMP_ARCH_ARM",
        ] {
            assert!(s.contains(&format!("\"{a}\"")), "{a}");
        }
        serde_json::from_str::<Value>(&profile_json()).expect("the profile is JSON");
    }
}

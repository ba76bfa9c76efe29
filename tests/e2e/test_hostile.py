"""Hostile jobs (issue 5): what a curious or careless student can try inside
the sandbox. Each case must fail safely — the job gets a clear outcome, the
host is untouched — and the node stays usable for the next job.

Most kernel-level attempts run in ONE probe job (a python3 script printing
`name=RESULT` lines: OK, or the errno name), read once per module; each case
is its own test so the report (docs/robustness.md) can name it.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from conftest import RUNNER, containers_with_label, sh

import testlib

PROBE = r"""
import ctypes, errno, os, socket, subprocess, time
libc = ctypes.CDLL(None, use_errno=True)
NR = {'x86_64': dict(finit_module=313, init_module=175, ptrace=101, unshare=272, clock_settime=227,
                     settimeofday=164, mknodat=259, reboot=169),
      'aarch64': dict(finit_module=273, init_module=105, ptrace=117, unshare=97, clock_settime=112,
                      settimeofday=170, mknodat=33, reboot=142)}[os.uname().machine]
def out(name, value): print(f'{name}={value}', flush=True)
def call(name, fn):
    ctypes.set_errno(0)
    rc = fn()
    out(name, 'OK' if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), '?'))
def sc(name, *a): return lambda: libc.syscall(NR[name], *a)
def try_os(name, fn):
    try: fn(); out(name, 'OK')
    except OSError as e: out(name, errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__)
os.makedirs('/tmp/m', exist_ok=True)
call('mount', lambda: libc.mount(b'none', b'/tmp/m', b'tmpfs', 0, None))
call('unshare', sc('unshare', 0x10000000 | 0x00020000))          # CLONE_NEWUSER | CLONE_NEWNS
fd = os.open('/dev/null', os.O_RDONLY)
call('finit_module', sc('finit_module', fd, b'', 0))
call('init_module', sc('init_module', None, 0, b''))
class TS(ctypes.Structure): _fields_ = [('s', ctypes.c_long), ('ns', ctypes.c_long)]
ts = TS(int(time.time()) + 86400 * 365, 0)
call('clock_settime', sc('clock_settime', 0, ctypes.byref(ts)))
call('settimeofday', sc('settimeofday', ctypes.byref(ts), None))
call('reboot', sc('reboot', 0xfee1dead, 672274793, 0x4321fedc, None))  # LINUX_REBOOT_CMD_POWER_OFF
child = subprocess.Popen(['sleep', '30'])
call('ptrace_child', sc('ptrace', 16, child.pid, None, None))    # PTRACE_ATTACH
call('ptrace_pid1', sc('ptrace', 16, 1, None, None))
child.kill()
comms = set()
for p in os.listdir('/proc'):
    if p.isdigit():
        try: comms.add(open(f'/proc/{p}/comm').read().strip())
        except OSError: pass
out('visible_processes', ','.join(sorted(comms)))
def sock(name, *a, connect=None):
    def f():
        s = socket.socket(*a)
        if connect:
            s.settimeout(2); s.connect(connect)
    try_os(name, f)
sock('raw_icmp', socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
sock('raw_packet', socket.AF_PACKET, socket.SOCK_RAW, 0)
sock('tcp_internet', socket.AF_INET, socket.SOCK_STREAM, connect=('1.1.1.1', 80))
sock('tcp_docker_gateway', socket.AF_INET, socket.SOCK_STREAM, connect=('172.17.0.1', 22))
sock('tcp6_internet', socket.AF_INET6, socket.SOCK_STREAM, connect=('2606:4700:4700::1111', 80))
sock('docker_socket', socket.AF_UNIX, socket.SOCK_STREAM, connect='/var/run/docker.sock')
sock('munge_socket', socket.AF_UNIX, socket.SOCK_STREAM, connect='/run/munge/munge.socket.2')
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('8.8.8.8', 53))
try_os('udp_internet', udp)
out('interfaces', ','.join(sorted(os.listdir('/sys/class/net'))))
st = dict(ln.split(':', 1) for ln in open('/proc/self/status'))
for k in ('NoNewPrivs', 'CapEff', 'CapPrm', 'CapBnd', 'CapAmb'):
    out(k, st[k].strip())
suid = subprocess.run(['find', '/', '-xdev', '-perm', '/6000', '-type', 'f'], capture_output=True, text=True).stdout.split()
out('setuid_files', ','.join(suid))
out('dev', ','.join(sorted(os.listdir('/dev'))))
call('mknod', sc('mknodat', -100, b'/tmp/sda', 0o60600, os.makedev(8, 0)))
for d in ('mem', 'kmsg', 'sda', 'vda', 'kvm', 'fuse'):
    try_os('open_dev_' + d, lambda: open('/dev/' + d, 'rb'))
try_os('sysrq', lambda: open('/proc/sysrq-trigger', 'w').write('h'))
try_os('sysctl', lambda: open('/proc/sys/kernel/hostname', 'w').write('x'))
for d in ('/etc', '/usr/bin', '/home', '/var', '/root'):
    try_os('write_' + d.replace('/', '_'), lambda: open(d + '/.x', 'w'))
out('home', ','.join(os.listdir('/home')) if os.path.isdir('/home') else '')
out('DONE', 1)
"""


@pytest.fixture(scope="module")
def probe():
    """Runs the probe once (as delegate-alice) and returns {name: result}."""
    from conftest import User

    alice = User("delegate-alice")
    r = alice.run("submit", "--wait", "--", "python3", "-c", PROBE, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    res = dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln)
    assert res.get("DONE") == "1", r.stdout
    return res


def node_usable(user):
    """The next job runs normally."""
    r = user.run("submit", "--wait", "--", "echo", "next-job-ok", timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("next-job-ok"), (r.stdout, r.stderr)
    assert "delegate" in sh("sinfo", "-h", "-o", "%P %t").stdout
    state = sh("sinfo", "-h", "-o", "%t").stdout.split()[0]
    assert not any(bad in state for bad in ("down", "drain", "fail", "unk")), sh("sinfo").stdout


def last_job(user) -> dict:
    r = user.run("list", "--json")
    jobs = json.loads(r.stdout)
    return jobs[-1]


# ---------------------------------------------------------------------------
# Resource exhaustion
# ---------------------------------------------------------------------------

FORK_BOMB = r"""
import errno, os
n = 0
while n < 5000:
    try:
        pid = os.fork()
    except OSError as e:
        print('fork-stopped', errno.errorcode.get(e.errno), n, flush=True); break
    if pid == 0:
        os.execv('/bin/sleep', ['sleep', '4711'])
    n += 1
else:
    print('NO LIMIT', flush=True)
"""


def test_fork_bomb_hits_the_pids_limit(alice):
    r = alice.run("submit", "--wait", "--", "python3", "-c", FORK_BOMB, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    line = r.stdout.strip().splitlines()[-1].split()
    assert line[:2] == ["fork-stopped", "EAGAIN"], r.stdout
    assert int(line[2]) < 512  # policy max_pids = 512
    # Its 500 sleeping children went with the container.
    assert subprocess.run(["pgrep", "-f", "sleep 4711"], capture_output=True).returncode == 1
    node_usable(alice)


def test_shell_fork_bomb_is_ended_by_the_time_limit(alice):
    # The classic one: it never exits by itself; the pids limit holds it, the
    # time limit ends it, and nothing is left behind. The main shell execs
    # its sleep: a fork for it could fail once the bomb holds every pid, and
    # dash then exits 2 by itself ("Cannot fork"; seen in CI).
    job = alice.submit("sh", "-c", "b(){ b|b& }; b; exec sleep 100", opts=("--time", "4s"))
    st = alice.wait(job, timeout=120)
    assert st["state"] == "timed-out", st
    assert containers_with_label(job) == []
    assert subprocess.run(["pgrep", "-u", str(alice.uid), "-x", "sh"], capture_output=True).returncode == 1
    node_usable(alice)


HOG = "b = []\nwhile True: b.append(bytearray(8 << 20))"


@pytest.mark.parametrize(
    "cmd,expect",
    [
        (["python3", "-c", HOG], "killed: out of memory (limit 64M)"),
        (["sh", "-c", f"python3 -c '{HOG}'"], "killed: out of memory (limit 64M)"),
        (
            ["sh", "-c", f"python3 -c '{HOG}'; echo survived"],
            "a process in the sandbox was killed: out of memory (limit 64M); the main process exited with code 0",
        ),
    ],
    ids=["main-process", "exec-from-shell", "child-main-survives"],
)
def test_memory_hog_is_killed_and_outcome_says_out_of_memory(alice, cmd, expect):
    job = alice.submit(*cmd, opts=("--mem", "64M"))
    st = alice.wait(job)
    assert st["state"] == "failed", st
    assert st["oom_killed"] is True, st
    assert st["reason"] == expect, st
    assert containers_with_label(job) == []
    node_usable(alice)


def test_filling_tmp_stops_at_its_size_limit(alice):
    r = alice.run(
        "submit",
        "--wait",
        "--",
        "sh",
        "-c",
        "head -c 400M /dev/zero > /tmp/fill; echo rc=$?; du -m /tmp/fill",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "No space left on device" in r.stderr
    out = r.stdout.split()
    assert out[0] == "rc=1" and int(out[1]) <= 256, r.stdout  # policy tmp_size = 256M
    # /tmp was private to that container: the next job starts with an empty one.
    r = alice.run("submit", "--wait", "--", "sh", "-c", "ls -A /tmp | wc -l", timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stdout


def test_background_process_is_removed_with_the_container(alice):
    job = alice.submit(
        "sh", "-c", "setsid sleep 4712 >/dev/null 2>&1 & nohup sleep 4712 >/dev/null 2>&1 & echo main-done"
    )
    st = alice.wait(job)
    assert st["state"] == "completed", st
    assert containers_with_label(job) == []
    assert subprocess.run(["pgrep", "-f", "sleep 4712"], capture_output=True).returncode == 1
    node_usable(alice)


# ---------------------------------------------------------------------------
# Kernel interfaces (one probe job)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["mount", "unshare"])
def test_no_mount_and_no_new_namespaces(probe, call):
    assert probe[call] == "EPERM", probe


@pytest.mark.parametrize("call", ["finit_module", "init_module"])
def test_no_kernel_module_loading(probe, call):
    assert probe[call] == "EPERM", probe


@pytest.mark.parametrize("call", ["clock_settime", "settimeofday"])
def test_no_clock_change(probe, call):
    assert probe[call] == "EPERM", probe


def test_no_reboot(probe):
    assert probe["reboot"] == "EPERM", probe


def test_no_ptrace_and_no_host_process_visible(probe):
    assert probe["ptrace_child"] == "EPERM" and probe["ptrace_pid1"] == "EPERM", probe
    visible = set(probe["visible_processes"].split(","))
    host = {
        "slurmd",
        "slurmctld",
        "slurmstepd",
        "dockerd",
        "containerd",
        "munged",
        "sandbox-runner",
        "systemd",
        "init",
        "sshd",
    }
    assert not (visible & host), visible
    assert visible <= {"python3", "sleep", "find"}, visible


@pytest.mark.parametrize("kind", ["raw_icmp", "raw_packet"])
def test_no_raw_sockets(probe, kind):
    assert probe[kind] == "EPERM", probe


@pytest.mark.parametrize("kind", ["tcp_internet", "tcp_docker_gateway", "tcp6_internet", "udp_internet"])
def test_no_network_at_all(probe, kind):
    # Only the loopback interface exists (network mode none).
    assert probe["interfaces"] == "lo", probe
    assert probe[kind] in ("ENETUNREACH", "EHOSTUNREACH", "EADDRNOTAVAIL", "EAFNOSUPPORT"), probe


@pytest.mark.parametrize("kind", ["docker_socket", "munge_socket"])
def test_no_host_sockets(probe, kind):
    assert probe[kind] == "ENOENT", probe


def test_no_new_privileges_and_no_setuid_binaries(probe):
    assert probe["NoNewPrivs"] == "1", probe
    # No capability at all, not even in the bounding set: a setuid binary
    # could not gain one, and the image has none anyway (stripped at build).
    for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert int(probe[k], 16) == 0, (k, probe[k])
    assert probe["setuid_files"] == "", probe


def test_only_the_default_device_nodes(probe):
    assert set(probe["dev"].split(",")) <= {
        "core",
        "fd",
        "full",
        "mqueue",
        "null",
        "ptmx",
        "pts",
        "random",
        "shm",
        "stderr",
        "stdin",
        "stdout",
        "tty",
        "urandom",
        "zero",
    }, probe["dev"]
    assert probe["mknod"] == "EPERM", probe
    for d in ("mem", "kmsg", "sda", "vda", "kvm", "fuse"):
        assert probe["open_dev_" + d] in ("ENOENT", "EPERM", "EACCES"), (d, probe)


def test_no_kernel_tunables_and_read_only_image(probe):
    assert probe["sysrq"] in ("ENOENT", "EROFS", "EACCES", "EPERM"), probe
    assert probe["sysctl"] in ("EROFS", "EACCES", "EPERM"), probe
    for d in ("_etc", "_usr_bin", "_home", "_var", "_root"):
        assert probe["write_" + d] in ("EROFS", "EACCES", "EPERM"), (d, probe)


# ---------------------------------------------------------------------------
# Other users
# ---------------------------------------------------------------------------


def test_cannot_read_another_users_job_dir(alice, bob):
    secret = alice.submit("sh", "-c", "echo alice-secret > /job/answer; echo alice-secret")
    assert alice.wait(secret)["state"] == "completed"
    alice_dir = alice.job_dir(secret)
    # From bob's sandbox: alice's home is simply not there.
    r = bob.run(
        "submit",
        "--wait",
        "--",
        "sh",
        "-c",
        f"ls -A /home; cat {alice_dir}/answer {alice_dir}/stdout; echo rc=$?",
        timeout=120,
    )
    assert "alice-secret" not in r.stdout + r.stderr
    assert "No such file or directory" in r.stderr, r.stderr
    # From bob's shell on the host: the job root is private (0700).
    r = bob.as_user("cat", str(alice_dir / "answer"), check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    # Bob running the (setgid docker) runner on alice's directory: refused, nothing created.
    t0 = float(int(time.time()) + 1)  # after alice's own container's events
    time.sleep(t0 - time.time() + 0.05)
    r = bob.as_user(RUNNER, str(alice_dir), check=False)
    assert r.returncode != 0 and "alice-secret" not in r.stdout + r.stderr, r
    assert "refused" in r.stderr, r.stderr
    from conftest import containers_created_since

    assert containers_created_since(secret, t0) == []
    # ... and cannot make it write as root either: alice's outcome is untouched.
    assert alice.status(secret)["state"] == "completed"


# ---------------------------------------------------------------------------
# Bad input to the runner (a held job, tampered with before the runner sees it)
# ---------------------------------------------------------------------------


def _release_refused(user, job, t0, expect):
    user.as_user("scontrol", "release", (user.job_dir(job) / "slurm-id").read_text().strip())
    st = user.wait(job, timeout=120)
    assert st["state"] == "failed" and st.get("refused") is True, st
    assert expect in st["reason"], st
    from conftest import containers_created_since

    assert containers_created_since(job, t0) == []
    return st


def test_spec_with_extra_fields_is_refused(alice):
    # The spec has no field for an image outside the allowlist's checks,
    # capabilities, host mounts, devices or privileged mode: a forged spec
    # carrying anything beyond its known fields is refused whole (see also
    # protocol::proptests::any_trailing_bytes_are_refused).
    job, d, t0 = alice.held()
    with open(d / "spec", "ab") as f:
        f.write(b"\x01privileged\x01CAP_SYS_ADMIN/:/host")
    _release_refused(alice, job, t0, "trailing bytes")


def test_spec_with_garbage_body_is_refused(alice):
    job, d, t0 = alice.held()
    spec = bytearray((d / "spec").read_bytes())
    spec[8:] = b"\xff" * (len(spec) - 8)
    (d / "spec").write_bytes(bytes(spec))
    _release_refused(alice, job, t0, "could not be decoded")


def test_huge_payload_is_refused(alice):
    job, d, t0 = alice.held()
    # Sparse: 256 MiB + 1 byte without writing them.
    alice.as_user("truncate", "-s", str(256 * 1024 * 1024 + 1), str(d / "payload"))
    _release_refused(alice, job, t0, "more than the limit")


@pytest.mark.parametrize("name", ["evil", "..hidden", "stdout"])
def test_unexpected_files_in_the_job_dir_are_refused(alice, name):
    job, d, t0 = alice.held()
    alice.as_user("touch", str(d / name))
    _release_refused(alice, job, t0, "unexpected file")


@pytest.mark.parametrize("name", ["outcome", "started"])
def test_forged_runner_records_are_refused(alice, name):
    # A student forging the runner's own records in their own job dir: the
    # runner refuses to run the job (no container), and the client never
    # takes the forged bytes for a record: it names the bad file.
    job, d, t0 = alice.held()
    alice.as_user("sh", "-c", f"printf 'completed, exit 0' > {d / name}")
    sid = (d / "slurm-id").read_text().strip()
    alice.as_user("scontrol", "release", sid)
    # (the runner ran, and refused, before the job left Slurm's queue)
    testlib.wait_until(
        f"Slurm job {sid} gone from the queue",
        lambda: not sh("squeue", "-h", "-j", sid, "-o", "%i", check=False).stdout.strip(),
        120,
        0.5,
    )
    r = alice.run("wait", "--json", "--timeout", "60s", job, timeout=90)
    if r.returncode == 0:
        (st,) = json.loads(r.stdout) if r.stdout.lstrip().startswith("[") else [json.loads(r.stdout)]
        assert st["state"] == "failed" and st["refused"] is True and "unexpected file" in st["reason"], st
    else:
        assert r.stderr.startswith("delegate: error:") and f"{name} is not a delegate file" in r.stderr, (
            r.stderr
        )
    from conftest import containers_created_since

    assert containers_created_since(job, t0) == []

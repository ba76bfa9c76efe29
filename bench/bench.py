#!/usr/bin/env python3
"""delegate's benchmark: every figure of issue 6 side by side in one run.

Started by bench/run.sh (read that first); three phases:

  bench.py root   OUT.json        as root: the floors (docker run --rm, sbatch of
                                  the same container run on an idle node, a raw
                                  Slurm array), sandbox-runner's own cost and
                                  peak memory, the CPU loop on the bare node
  bench.py user   OUT.json        as an ordinary account in the admin group (non-root;
                                  run.sh): delegate and submitit
                                  (single call, maps), Slurm queries while
                                  N futures wait, the CPU loop in the sandbox
  bench.py fidelity OUT.json     as that account: only the CPU loop rounds
                                  (bare node and sandbox alternately), printed
  bench.py report OUT.json A B    merges, prints the table of ratios, writes
                                  the JSON and a PNG of the latency distributions

Benchmarks print figures; nothing here asserts on time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

IMAGE = os.environ.get("BENCH_IMAGE", "delegate-sandbox:latest")
PARTITION = os.environ.get("BENCH_PARTITION", "delegate")
RUNNER = os.environ.get("DELEGATE_RUNNER", "/usr/local/bin/sandbox-runner")
AGENT_SOCKET = "/run/delegate/agent.sock"  # the policy's default agent_socket
DELEGATE_CLI = os.environ.get("BENCH_DELEGATE_CLI", "/usr/local/bin/delegate")
QUICK = os.environ.get("BENCH_QUICK") == "1"
SKIP_200 = os.environ.get("BENCH_SKIP_200") == "1"
USER = os.environ.get("BENCH_USER", "delegate-bench")
REPS = 3 if QUICK else int(os.environ.get("BENCH_REPS", "10"))  # cheap figures
SREPS = 3 if QUICK else int(os.environ.get("BENCH_SLURM_REPS", "6"))  # each waits for an idle node
LOOP_N = 200_000 if QUICK else 2_000_000  # iterations of the CPU-bound loop
LOOP_K = 5 if QUICK else 15  # timings of it per side
# bare/sandbox alternations (run.sh's tuning comparison runs one at a time)
FIDELITY_ROUNDS = int(os.environ.get("BENCH_FIDELITY_ROUNDS", "3" if QUICK else "5"))
ROUND_K = max(1, LOOP_K // FIDELITY_ROUNDS) if QUICK else 5  # timings per side per round

# The CPU-bound loop, timed the same way on both sides (same Python 3.11).
LOOP_SRC = """
import time
def loop(n, k):
    out = []
    for _ in range(k):
        t = time.perf_counter()
        s = 0
        for i in range(n):
            s += i * i
        out.append(time.perf_counter() - t)
    return out
"""

# The same measurement in C (issue 18): a loop built with gcc -O2 where it
# runs (in the job directory inside the sandbox), timed by the wall clock
# and by a perf_event_open task-clock counter read inside the call (the
# software event a sandbox may open: PERF_COUNT_SW_TASK_CLOCK, user space).
C_LOOP_N = 20_000_000 if QUICK else 200_000_000
C_LOOP_SRC = r"""
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    long n = atol(argv[1]);
    int k = atoi(argv[2]);
    if (k < 1 || k > 100) return 2;
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_SOFTWARE;
    a.size = sizeof a;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.disabled = 1;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    double wall[100], task[100];
    for (int j = 0; j < k; j++) {
        volatile unsigned long s = 0;
        long long c = 0;
        if (fd >= 0) { ioctl(fd, PERF_EVENT_IOC_RESET, 0); ioctl(fd, PERF_EVENT_IOC_ENABLE, 0); }
        double t0 = now();
        for (long i = 0; i < n; i++) s += (unsigned long)i * (unsigned long)i;
        double t1 = now();
        if (fd >= 0) { ioctl(fd, PERF_EVENT_IOC_DISABLE, 0); if (read(fd, &c, sizeof c) != sizeof c) c = -1; }
        wall[j] = t1 - t0;
        task[j] = fd >= 0 && c >= 0 ? c * 1e-9 : -1;
    }
    printf("{\"wall\": [");
    for (int j = 0; j < k; j++) printf("%s%.6f", j ? ", " : "", wall[j]);
    printf("], \"task_clock\": [");
    for (int j = 0; j < k; j++) printf("%s%.6f", j ? ", " : "", task[j]);
    printf("]}\n");
    return 0;
}
"""


def c_loop_in(directory: str, n: int, k: int) -> dict:
    """Builds the C loop in `directory` and runs it there: the sandbox's side
    (sent as a delegate call: `directory` is then the job directory)."""
    import json as _json
    import os as _os
    import subprocess as _sp

    src, exe = _os.path.join(directory, "loop.c"), _os.path.join(directory, "loop")
    with open(src, "w") as f:
        f.write(C_LOOP_SRC)
    _sp.run(["gcc", "-O2", "-o", exe, src], check=True, capture_output=True)
    out = _sp.run([exe, str(n), str(k)], check=True, capture_output=True, text=True).stdout
    return _json.loads(out)


def sandbox_c_loop(n: int, k: int) -> dict:
    import os as _os

    return c_loop_in(_os.getcwd(), n, k)


def log(*a):
    print("[bench %s]" % time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def stats(xs):
    xs = sorted(float(x) for x in xs)
    if not xs:
        return {"n": 0}
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "min": xs[0],
        "max": xs[-1],
        "q1": q[0],
        "q3": q[2],
        "mean": statistics.fmean(xs),
        "stdev": statistics.stdev(xs) if len(xs) >= 2 else 0.0,
        "samples": xs,
    }


def sh(*cmd, check=True, **kw):
    """Runs a command; a failure is retried twice (the machine is shared:
    another engineer's image build or test run can make one docker call fail)."""
    for attempt in range(3):
        p = subprocess.run(list(cmd), check=False, capture_output=True, text=True, **kw)
        if p.returncode == 0 or not check:
            return p
        log(
            "%s failed (exit %d): %s%s"
            % (" ".join(cmd[:3]), p.returncode, p.stderr.strip()[-300:], "; retrying" if attempt < 2 else "")
        )
        time.sleep(1)
    raise subprocess.CalledProcessError(p.returncode, cmd, p.stdout, p.stderr)


def slurm_busy() -> bool:
    """Any job of the partition not over yet (but held ones, which never
    start by themselves), or the node not idle."""
    q = sh("squeue", "-h", "-p", PARTITION, "-t", "PD,R,CG,CF,S", "-o", "%i %r", check=False).stdout
    if any(ln.split()[1:2] not in (["JobHeldUser"], ["JobHeldAdmin"]) for ln in q.splitlines() if ln.strip()):
        return True
    st = sh("sinfo", "-h", "-p", PARTITION, "-o", "%T", check=False).stdout.split()
    return any(s.rstrip("*~#") not in ("idle",) for s in st)


IDLE_WAIT = float(os.environ.get("BENCH_IDLE_WAIT", "300"))


def wait_idle(limit=None, settle=1.0):
    """Until the partition is idle (other engineers' tests share the node)."""
    limit = IDLE_WAIT if limit is None else limit
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if not slurm_busy():
            time.sleep(settle)
            if not slurm_busy():
                return True
        time.sleep(0.2)
    log("the partition did not become idle within %.0f s (other users' jobs)" % limit)
    return False


def squeue_gone(jid: str) -> bool:
    out = sh("squeue", "-h", "-j", jid, "-t", "PD,R,CG,CF,S", "-o", "%i", check=False).stdout
    return not out.strip()


def sbatch_until_gone(wrap: str, extra=()) -> float:
    """Submit → gone from the queue, polling squeue every 20 ms."""
    t = time.perf_counter()
    jid = (
        sh("sbatch", "--parsable", "-p", PARTITION, "--exclusive", "-o", "/dev/null", *extra, "--wrap", wrap)
        .stdout.strip()
        .split(";")[0]
    )
    while not squeue_gone(jid):
        time.sleep(0.02)
    return time.perf_counter() - t


# --- root phase -----------------------------------------------------------


def docker_run_cmd(extra=()):
    return ["docker", "run", "--rm", "--network", "none", *extra, IMAGE, "true"]


def root_phase(out: str):
    res = {}
    pw = __import__("pwd").getpwnam(USER)
    uid, gid = pw.pw_uid, pw.pw_gid
    # 1. bare docker run --rm of the sandbox image (plain, and with the
    #    sandbox's own settings minus the seccomp profile and the job mount).
    sandboxish = [
        "--read-only",
        "--tmpfs",
        "/tmp:rw,nosuid,nodev,size=256m",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--pids-limit",
        "512",
        "--ipc",
        "private",
        "--log-driver",
        "none",
        "--user",
        "%d:%d" % (uid, gid),
        "--memory",
        "1g",
        "--cpus",
        "1",
    ]
    log("docker run --rm x%d" % REPS)
    plain, like = [], []
    for _ in range(REPS):
        t = time.perf_counter()
        sh(*docker_run_cmd())
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        sh(*docker_run_cmd(sandboxish))
        like.append(time.perf_counter() - t)
    res["docker_run"] = stats(plain)
    res["docker_run_sandbox_flags"] = stats(like)

    # 2. the floor: sbatch of the same container run, submit → gone, idle node.
    wrap = " ".join(docker_run_cmd())
    log("sbatch floor x%d (waiting for an idle node before each)" % SREPS)
    floor, floor_wait, floor_true = [], [], []
    for _ in range(SREPS):
        if wait_idle():  # a sample behind other users' jobs is not the floor
            floor.append(sbatch_until_gone(wrap))
    for _ in range(max(2, SREPS // 2)):
        wait_idle()
        t = time.perf_counter()
        sh("sbatch", "--wait", "-Q", "-p", PARTITION, "--exclusive", "-o", "/dev/null", "--wrap", wrap)
        floor_wait.append(time.perf_counter() - t)
        wait_idle()
        floor_true.append(sbatch_until_gone("true"))
    res["floor_sbatch_docker"] = stats(floor)
    res["floor_sbatch_wait_docker"] = stats(floor_wait)
    res["floor_sbatch_true"] = stats(floor_true)

    # 3. a raw Slurm array of 20 exclusive `true`: node turnover alone.
    wait_idle()
    log("raw sbatch --array=0-19 --exclusive true")
    t = time.perf_counter()
    jid = (
        sh(
            "sbatch",
            "--parsable",
            "-p",
            PARTITION,
            "--exclusive",
            "-o",
            "/dev/null",
            "--array=0-19",
            "--wrap",
            "true",
        )
        .stdout.strip()
        .split(";")[0]
    )
    while not squeue_gone(jid):
        time.sleep(0.05)
    res["raw_array20_true"] = {"seconds": time.perf_counter() - t}

    # 4. sandbox-runner's own cost: the runner (as the student, via setpriv,
    #    which execs) on a job directory of `true`, interleaved with docker
    #    run --rm of the same container. Peak memory from GNU time's %M: its
    #    child is a fork of the small `time`, not of this Python (a forked
    #    child's maxrss starts at its parent's size and survives exec).
    log("sandbox-runner vs docker run --rm x%d" % REPS)
    runner_t, runner_rss, ref_t = [], [], []
    # With the root agent (docs/security.md) the runner starts a sandbox only
    # as the batch task of a running Slurm job: run by hand it is refused, and
    # timing that refusal would be a false figure. Its cost is then inside
    # the single-call and map figures, which go through the whole path.
    if os.path.exists(AGENT_SOCKET):
        log("sandbox-runner by hand: refused outside a batch step (root agent); runner row skipped")
        res["runner_skipped"] = "the runner starts sandboxes only as a Slurm batch task (root agent)"
    for _ in range(0 if "runner_skipped" in res else REPS):
        o = sh(
            "runuser",
            "-u",
            USER,
            "--",
            DELEGATE_CLI,
            "--json",
            "submit",
            "--hold",
            "--time",
            "1m",
            "--",
            "true",
        )
        job = json.loads(o.stdout)
        sh("scancel", str(job["slurm_id"]), check=False)  # held: never starts by Slurm
        with tempfile.NamedTemporaryFile("r") as tf:
            t = time.perf_counter()
            subprocess.run(
                [
                    "/usr/bin/time",
                    "-f",
                    "%M",
                    "-o",
                    tf.name,
                    "setpriv",
                    "--reuid",
                    str(uid),
                    "--regid",
                    str(gid),
                    "--init-groups",
                    RUNNER,
                    job["dir"],
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            runner_t.append(time.perf_counter() - t)
            runner_rss.append(int(tf.read().split()[-1]))  # KiB
        t = time.perf_counter()
        sh(*docker_run_cmd([*sandboxish, "-v", "%s:/job" % job["dir"], "-w", "/job"]))
        ref_t.append(time.perf_counter() - t)
        if os.environ.get("BENCH_KEEP_JOBS") != "1":
            import shutil

            shutil.rmtree(job["dir"], ignore_errors=True)
            if os.path.exists(job["dir"] + ".log"):
                os.unlink(job["dir"] + ".log")
    res["runner"] = stats(runner_t)
    res["runner_peak_rss_kib"] = stats(runner_rss)
    res["runner_docker_ref"] = stats(ref_t)
    res["runner_over_docker_ms"] = [1000 * (a - b) for a, b in zip(runner_t, ref_t)]

    res["loop_params"] = {"n": LOOP_N, "rounds": FIDELITY_ROUNDS, "k_per_round": ROUND_K}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


# --- user phase -----------------------------------------------------------


def cpu_idle(seconds=1.0) -> float:
    """Fraction of the machine's CPU time that was idle over `seconds`."""

    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)

    i0, t0 = sample()
    time.sleep(seconds)
    i1, t1 = sample()
    return (i1 - i0) / max(1, t1 - t0)


def wait_quiet(limit=120.0, idle=0.9):
    """Until the machine is quiet (≥ 90 % idle over a second): the engine
    and Slurm keep working for a while after the figures before (container
    removal, epilogs), which a timing on the node would pick up."""
    end = time.monotonic() + limit
    while True:
        f = cpu_idle()
        if f >= idle or time.monotonic() > end:
            if f < idle:
                log("the machine did not become quiet (%.0f %% idle)" % (100 * f))
            return f


def bare_loop(k):
    """The fidelity loop on the bare node: the host's python3 (Debian's
    3.11, the same build as the sandbox image's) on the node held
    exclusively through Slurm, as the sandbox's loop is."""
    code = LOOP_SRC + "\nimport json; print(json.dumps(loop(%d, %d)))" % (LOOP_N, k)
    printed = sh(
        "srun", "--exclusive", "-p", PARTITION, "-n", "1", "-t", "5", "/usr/bin/python3", "-c", code
    ).stdout
    return json.loads(printed.strip().splitlines()[-1])


def bare_c_loop(k, build_dir):
    """The C loop on the bare node: built once with the host's gcc in a
    directory of the bench user's, run through `srun --exclusive`."""
    exe = os.path.join(build_dir, "loop")
    if not os.path.exists(exe):
        with open(os.path.join(build_dir, "loop.c"), "w") as f:
            f.write(C_LOOP_SRC)
        sh("gcc", "-O2", "-o", exe, os.path.join(build_dir, "loop.c"))
    printed = sh(
        "srun", "--exclusive", "-p", PARTITION, "-n", "1", "-t", "5", exe, str(C_LOOP_N), str(k)
    ).stdout
    return json.loads(printed.strip().splitlines()[-1])


def rss_mib() -> float:
    """This process's resident memory (MiB)."""
    with open("/proc/self/status") as f:
        lines = f.read().splitlines()
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def trivial(x):
    return x


def cleanup(ids):
    """Removes the job directories (and Slurm logs beside them) this run
    created — only those: other users of the account may be running tests."""
    import shutil

    from delegate import _core

    for jid in ids:
        try:
            d = _core.job_dir(jid)
        except Exception:  # noqa: BLE001
            continue
        shutil.rmtree(d, ignore_errors=True)
        for suffix in (".log", ".array.log"):
            try:
                os.unlink(d + suffix)
            except OSError:
                pass


def machine_of(fut) -> dict | None:
    """The fingerprint fields a round's figures depend on (the machine the
    sandbox ran on: its class, cores, governor, boost, other tasks seen)."""
    f = getattr(fut, "fingerprint", None)
    if not f:
        return None
    keep = ("node", "cpu_model", "microcode", "cores", "smt_siblings", "siblings_busy_ms", "others_seen",
            "governor", "boost", "cur_khz_start", "cur_khz_end", "tuning", "perf_mode", "hardware_counters")  # fmt: skip
    return {k: f.get(k) for k in keep}


def fidelity_rounds(delegate, created: list) -> dict:
    """The same loop, same Python, alternately on the bare node and in the
    sandbox, FIDELITY_ROUNDS times, each on a quiet machine (this VM's speed
    drifts between phases ~1.7x apart that last seconds to minutes;
    alternating exposes both sides to them, and the minimum is the timing
    least disturbed by them)."""
    wait_idle()
    log("CPU loop: bare node and sandbox alternately, %d rounds" % FIDELITY_ROUNDS)
    ns = {}
    exec(LOOP_SRC, ns)
    remote_loop = delegate.remote(time="5m")(ns["loop"])
    remote_c = delegate.remote(time="5m")(sandbox_c_loop)
    import tempfile

    build_dir = tempfile.mkdtemp(prefix=".bench-c-", dir=os.path.expanduser("~"))
    bare, sandbox, quiet, rounds = [], [], [], []
    c = {"wall": ([], []), "task_clock": ([], [])}
    c_rounds = []
    for _ in range(FIDELITY_ROUNDS):
        quiet.append(wait_quiet())
        b = bare_loop(ROUND_K)
        quiet.append(wait_quiet())
        fu = remote_loop.submit(LOOP_N, ROUND_K)
        sb = fu.result()
        created.append(fu.job_id)
        bare += b
        sandbox += sb
        rounds.append({"bare_median": statistics.median(b), "sandbox_median": statistics.median(sb),
                       "machine": machine_of(fu)})  # fmt: skip
        log(
            "  round %d: Python bare median %.4f s, sandbox median %.4f s (sandbox/bare %.3f)"
            % (len(rounds), rounds[-1]["bare_median"], rounds[-1]["sandbox_median"],
               rounds[-1]["sandbox_median"] / rounds[-1]["bare_median"])
        )  # fmt: skip
        # The C loop, wall clock and task-clock, alternately too.
        quiet.append(wait_quiet())
        cb = bare_c_loop(ROUND_K, build_dir)
        quiet.append(wait_quiet())
        fu = remote_c.submit(C_LOOP_N, ROUND_K)
        cs = fu.result()
        created.append(fu.job_id)
        rd = {}
        for key in ("wall", "task_clock"):
            xb = [x for x in cb[key] if x > 0]
            xs = [x for x in cs[key] if x > 0]
            c[key][0].extend(xb)
            c[key][1].extend(xs)
            if xb and xs:
                rd[key] = {"bare_median": statistics.median(xb), "sandbox_median": statistics.median(xs)}
        c_rounds.append(rd)
        log(
            "  round %d: C %s"
            % (len(rounds), "; ".join(
                "%s bare %.4f s, sandbox %.4f s (%.3f)"
                % (key, v["bare_median"], v["sandbox_median"], v["sandbox_median"] / v["bare_median"])
                for key, v in rd.items()) or "no readings")
        )  # fmt: skip
    import shutil

    shutil.rmtree(build_dir, ignore_errors=True)
    res = {
        "loop_bare": stats(bare),
        "loop_sandbox": stats(sandbox),
        "loop_rounds": rounds,
        "loop_idle_before": quiet,
        "c_loop_params": {"n": C_LOOP_N},
        "c_loop_rounds": c_rounds,
    }
    for key, (xb, xs) in c.items():
        if xb and xs:
            res["c_%s_bare" % key] = stats(xb)
            res["c_%s_sandbox" % key] = stats(xs)
    return res


def fidelity_summary(res: dict) -> list:
    """One line per measurement: sandbox/bare on medians and minimums, and
    both spreads (the goal: <= 1.01 on both, sandbox spread <= bare's)."""

    def iqr(x):
        return 100 * (x["q3"] - x["q1"]) / x["median"]

    lines = []
    for name, b, sb in (
        ("Python loop, wall", "loop_bare", "loop_sandbox"),
        ("C loop, wall", "c_wall_bare", "c_wall_sandbox"),
        ("C loop, task-clock (perf_event_open)", "c_task_clock_bare", "c_task_clock_sandbox"),
    ):
        x, y = res.get(b, {}), res.get(sb, {})
        if not (x.get("n") and y.get("n")):
            lines.append("%s: no readings" % name)
            continue
        lines.append(
            "%s: sandbox/bare medians %.3f, minimums %.3f; spread (IQR) bare %.1f%%, sandbox %.1f%%"
            % (name, y["median"] / x["median"], y["min"] / x["min"], iqr(x), iqr(y))
        )
    return lines


def fidelity_phase(out: str):
    """Only the fidelity rounds (bench/run.sh --fidelity), printed."""
    import delegate

    created = []
    res = fidelity_rounds(delegate, created)
    for line in fidelity_summary(res):
        log(line)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    cleanup(created)


# Spreads (IQR, % of the median) closer than this are the same spread.
MATERIAL_IQR = 5


def tuning_summary(blocks: dict) -> dict:
    """The tuning comparison (bench/run.sh --fidelity): BLOCKS maps "on"
    and "off" (the policy's pin_cpus and tune_cpus) to fidelity results of
    blocks that alternated in one run. Per setting the pooled spread (IQR)
    of the C loop's task clock and wall time, bare and in the sandbox, and
    the verdict: the tuning is the cause when the sandbox spreads over 1.5x
    and MATERIAL_IQR points wider with it than without it while the bare
    node's spread, measured in the same blocks, does not; the machine's
    own speed phases when the bare node spreads that much too; else
    neither (a steady machine)."""

    def iqr(xs):
        s = stats(xs)
        return 100 * (s["q3"] - s["q1"]) / s["median"] if s.get("n") else float("nan")

    out = {}
    for setting, results in blocks.items():
        row = {}
        for key in ("c_task_clock", "c_wall"):
            bare = [x for r in results for x in r.get(key + "_bare", {}).get("samples", [])]
            sand = [x for r in results for x in r.get(key + "_sandbox", {}).get("samples", [])]
            if bare and sand:
                row[key] = {"bare_iqr": iqr(bare), "sandbox_iqr": iqr(sand),
                            "medians": statistics.median(sand) / statistics.median(bare),
                            "minimums": min(sand) / min(bare), "n": len(sand)}  # fmt: skip
        out[setting] = row
    on, off = out.get("on", {}).get("c_task_clock"), out.get("off", {}).get("c_task_clock")
    if not (on and off):
        out["verdict"] = "no verdict: a setting has no task-clock readings"
        return out
    said = "the sandbox spreads %.1f%% with the tuning and %.1f%% without it, the bare node %.1f%% and %.1f%%" % (
        on["sandbox_iqr"], off["sandbox_iqr"], on["bare_iqr"], off["bare_iqr"])  # fmt: skip
    wider = (
        on["sandbox_iqr"] > 1.5 * off["sandbox_iqr"] and on["sandbox_iqr"] - off["sandbox_iqr"] > MATERIAL_IQR
    )
    if wider and on["bare_iqr"] <= 1.5 * off["bare_iqr"]:
        out["verdict"] = "ours, the tuning: " + said
    elif max(on["bare_iqr"], off["bare_iqr"]) > MATERIAL_IQR:
        out["verdict"] = "the machine's speed phases, not the tuning: " + said
    else:
        out["verdict"] = (
            "neither in this run: the machine was steady and the tuning changes the spread by less than"
            " %d points (%s)" % (MATERIAL_IQR, said)
        )
    return out


def tuning_phase(out: str, files: list[str]):
    """bench/run.sh --fidelity's report: FILES are fidelity blocks named
    ...-on-N.json / ...-off-N.json."""
    blocks: dict[str, list] = {"on": [], "off": []}
    for f in files:
        setting = "on" if "-on-" in os.path.basename(f) else "off"
        with open(f) as fh:
            blocks[setting].append(json.load(fh))
    res = tuning_summary(blocks)
    for setting in ("on", "off"):
        for key, v in res.get(setting, {}).items():
            log(
                "tuning %s, %s: sandbox/bare medians %.3f, minimums %.3f; IQR bare %.1f%%, sandbox %.1f%% (n=%d)"
                % (setting, key, v["medians"], v["minimums"], v["bare_iqr"], v["sandbox_iqr"], v["n"])
            )
    log("verdict: " + res["verdict"])
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)


def user_phase(out: str):
    import delegate
    from delegate import _core

    res = {}
    created = []

    # 1. a single trivial delegate call, submit → result, on an idle node.
    log("delegate single call x%d" % SREPS)
    f = delegate.remote(time="2m")(trivial)
    single = []
    for i in range(SREPS):
        if not wait_idle():
            continue
        t = time.perf_counter()
        fu = f.submit(i)
        assert fu.result(timeout=300) == i
        single.append(time.perf_counter() - t)
        created.append(fu.job_id)
    res["delegate_single"] = stats(single)

    # 2. delegate maps (one sbatch each): the calls share one exclusive
    # allocation (the default), and -- the baseline, same run -- one Slurm
    # job per call (DELEGATE_CALLS_PER_ALLOCATION=1: a job array).
    sizes = [20] + ([] if (QUICK or SKIP_200) else [200])
    variants = (
        [(n, "") for n in sizes] + [(20, "_per_call")] + ([] if (QUICK or SKIP_200) else [(200, "_per_call")])
    )
    for n, variant in variants:
        wait_idle()
        log("delegate map of %d%s" % (n, " (one Slurm job per call)" if variant else ""))
        if variant:
            os.environ["DELEGATE_CALLS_PER_ALLOCATION"] = "1"
        s0, q0 = _core.sbatch_count(), _core.squeue_count()
        t = time.perf_counter()
        try:
            with delegate.Executor(time="2m") as ex:
                got = list(ex.map(trivial, range(n)))
                created.extend(fu.job_id for fu in ex._futures)
        finally:
            os.environ.pop("DELEGATE_CALLS_PER_ALLOCATION", None)
        dt = time.perf_counter() - t
        assert got == list(range(n))
        res["delegate_map%d%s" % (n, variant)] = {
            "seconds": dt,
            "sbatch": _core.sbatch_count() - s0,
            "squeue": _core.squeue_count() - q0,
        }

    # 3. Slurm queries while N futures wait: squeue calls per interval.
    window = 6.0 if QUICK else 10.0
    res["squeue_while_waiting"] = {}
    for n in [10, 1000] if QUICK else [1, 100, 1000]:
        wait_idle()
        log("squeue calls while %d futures wait (%.0f s window)" % (n, window))
        from delegate import _cancel_futures, _submit_many

        # One array of n calls that each sleep 60 s: the first runs, the
        # others stay pending (exclusive node), and all n futures wait.
        # The caller side at scale: pickling, n job directories, one
        # sbatch; and what n waiting futures cost in memory (issue 18).
        rss0 = rss_mib()
        t_submit = time.perf_counter()
        futs = _submit_many(time.sleep, [((60,), {})] * n, {"time": "2m"})
        submit_s = time.perf_counter() - t_submit
        time.sleep(1.0)
        q0, t0 = _core.squeue_count(), time.monotonic()
        time.sleep(window)
        q, dt = _core.squeue_count() - q0, time.monotonic() - t0
        rss1 = rss_mib()
        _cancel_futures(futs)  # one scancel
        created.extend(fu.job_id for fu in futs)
        res["squeue_while_waiting"][str(n)] = {
            "squeue": q,
            "seconds": dt,
            "per_2s": 2 * q / dt,
            "submit_seconds": submit_s,
            "futures_rss_mib": rss1 - rss0,
        }
        time.sleep(2)

    # 4. measurement fidelity (fidelity_rounds).
    res.update(fidelity_rounds(delegate, created))

    # 5. submitit (its own venv: this one), same cluster, exclusive.
    res.update(submitit_rounds())
    res["counters"] = {"sbatch": _core.sbatch_count(), "squeue": _core.squeue_count()}
    if os.environ.get("BENCH_KEEP_JOBS") != "1":
        time.sleep(2)
        cleanup(created)
        log("removed the %d job directories of this run (BENCH_KEEP_JOBS=1 keeps them)" % len(created))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def submitit_rounds() -> dict:
    """submitit's single call and map_array of 20 on the same cluster. A
    failed sample is recorded (``submitit_failed``) and the run goes on.

    The time limit is 5 minutes, not 2: submitit asks Slurm for
    ``--signal=USR2@90`` (its default signal delay, to checkpoint before the
    time limit), and Slurm may send that signal "up to 60 seconds earlier
    than specified" (sbatch(1)); with a 2-minute limit that is at once, and
    an array task died of SIGUSR2 80 ms after its launch (issue 32). The
    signal came from slurmctld on submitit's request, not from delegate's
    gate, plugin, epilog or agent."""
    out: dict = {"submitit_failed": []}
    try:
        import submitit
    except ImportError:
        log("submitit is not installed in this venv; skipped")
        return {}
    out["submitit_version"] = submitit.__version__
    folder = os.path.join(os.path.expanduser("~"), ".delegate-bench", "submitit")
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(
        timeout_min=5, slurm_partition=PARTITION, slurm_additional_parameters={"exclusive": True}
    )
    log("submitit single call x%d" % SREPS)
    ss = []
    for i in range(SREPS):
        if not wait_idle():
            continue
        t = time.perf_counter()
        try:
            ok = ex.submit(trivial, i).result() == i
        except Exception as e:  # noqa: BLE001 - a failed sample is recorded, the run goes on
            out["submitit_failed"].append({"sample": "single %d" % i, "error": repr(e)[:400]})
            continue
        if ok:
            ss.append(time.perf_counter() - t)
    if ss:
        out["submitit_single"] = stats(ss)
    wait_idle()
    log("submitit map_array of 20")
    t = time.perf_counter()
    jobs = ex.map_array(trivial, range(20))
    failed = []
    for k, j in enumerate(jobs):
        try:
            if j.result() != k:
                failed.append({"sample": "map_array task %d" % k, "error": "wrong result"})
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            failed.append({"sample": "map_array task %d" % k, "error": repr(e)[:400]})
    out["submitit_failed"] += failed
    if not failed:
        out["submitit_map20"] = {"seconds": time.perf_counter() - t}
    for f in out["submitit_failed"]:
        log("submitit sample FAILED (recorded): %s: %s" % (f["sample"], f["error"]))
    return out


# --- report ---------------------------------------------------------------


def med(d, k):
    v = d.get(k) or {}
    return v.get("median", v.get("seconds"))


def report(out: str, root_json: str, user_json: str):
    with open(root_json) as f:
        r = json.load(f)
    with open(user_json) as f:
        u = json.load(f)
    allres = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": os.uname().nodename,
        "quick": QUICK,
        "reps": REPS,
        "slurm_reps": SREPS,
        "load_average": os.getloadavg(),
        **r,
        **u,
    }
    floor = med(r, "floor_sbatch_docker")
    rows = []

    def row(name, value, ref=None, refname="", goal=""):
        ratio = "" if (value is None or not ref) else "%.2fx %s" % (value / ref, refname)
        rows.append((name, "-" if value is None else "%.3f s" % value, ratio, goal))

    row("docker run --rm (bare)", med(r, "docker_run"))
    row("sbatch+docker run, submit→gone (floor)", floor)
    row("sbatch --wait + docker run", med(r, "floor_sbatch_wait_docker"), floor, "floor")
    row("sbatch of true, submit→gone", med(r, "floor_sbatch_true"), floor, "floor")
    row("delegate single call", med(u, "delegate_single"), floor, "floor", "≤ 1.2x floor")
    row("submitit single call", med(u, "submitit_single"), floor, "floor")
    row("  delegate vs submitit (single)", med(u, "delegate_single"), med(u, "submitit_single"), "submitit")
    row("raw sbatch --array of 20 true", med(r, "raw_array20_true"))
    row("delegate map 20 (one Slurm job per call)", med(u, "delegate_map20_per_call"))
    row("delegate map 20", med(u, "delegate_map20"), med(u, "delegate_map20_per_call"), "per call", "≤ 8 s")
    row("submitit map_array 20", med(u, "submitit_map20"))
    row("  delegate vs submitit (map 20)", med(u, "delegate_map20"), med(u, "submitit_map20"), "submitit")
    if "delegate_map200" in u:
        row("delegate map 200 (one Slurm job per call)", med(u, "delegate_map200_per_call"))
        row(
            "delegate map 200",
            med(u, "delegate_map200"),
            med(u, "delegate_map200_per_call"),
            "per call",
            "≤ 60 s",
        )
    if "runner_skipped" in r:
        row("sandbox-runner (true job): skipped, " + r["runner_skipped"], None)
    else:
        row("sandbox-runner (true job)", med(r, "runner"), med(r, "runner_docker_ref"), "docker run")
        row("docker run --rm, sandbox flags", med(r, "runner_docker_ref"))
    over = statistics.median(r["runner_over_docker_ms"]) if r.get("runner_over_docker_ms") else None
    lb, ls = u.get("loop_bare", {}), u.get("loop_sandbox", {})
    print(
        "\n delegate benchmark, %s (%s, reps=%d/%d%s, load average %.2f)"
        % (allres["date"], allres["host"], REPS, SREPS, ", quick" if QUICK else "", allres["load_average"][0])
    )
    w = max(len(x[0]) for x in rows) + 2
    print(" %-*s %10s  %-22s %s" % (w, "figure (median)", "value", "ratio", "goal"))
    print(" " + "-" * (w + 50))
    for name, v, ratio, goal in rows:
        print(" %-*s %10s  %-22s %s" % (w, name, v, ratio, goal))
    print(" " + "-" * (w + 50))
    if over is not None:
        print(
            " sandbox-runner over docker run --rm: median %+.0f ms (goal ≤ 20 ms); peak RSS %.1f MiB"
            % (over, r["runner_peak_rss_kib"]["max"] / 1024)
        )
    for n, q in sorted(u.get("squeue_while_waiting", {}).items(), key=lambda kv: int(kv[0])):
        print(
            " squeue while %5s futures wait: %d in %.1f s = %.2f per 2 s (goal: constant in N)"
            % (n, q["squeue"], q["seconds"], q["per_2s"])
        )
        if "submit_seconds" in q:
            print(
                "   submitting those %s calls (pickling, job directories, one sbatch): %.2f s (goal for 1000: <= 1 s);"
                " the waiting futures: %+.1f MiB" % (n, q["submit_seconds"], q["futures_rss_mib"])
            )
    for f in u.get("submitit_failed", []):
        print(" submitit sample FAILED (recorded, the run went on): %s: %s" % (f["sample"], f["error"]))
    machines = {
        json.dumps(rd.get("machine"), sort_keys=True) for rd in u.get("loop_rounds", []) if rd.get("machine")
    }
    if len(machines) > 1:
        print(
            " NOTE: the fidelity rounds ran on %d different machine states (see loop_rounds[].machine)"
            % len(machines)
        )
    for m in ("delegate_map20", "delegate_map20_per_call", "delegate_map200", "delegate_map200_per_call"):
        if m in u:
            print(" %s: %d sbatch, %d squeue" % (m, u[m]["sbatch"], u[m]["squeue"]))
    for i, rd in enumerate(u.get("loop_rounds", []), 1):
        print(
            " CPU loop round %d: bare median %.4f s, sandbox median %.4f s (sandbox/bare %.3f)"
            % (i, rd["bare_median"], rd["sandbox_median"], rd["sandbox_median"] / rd["bare_median"])
        )
    if lb.get("n") and ls.get("n"):

        def spread(s):
            return 100 * (s["q3"] - s["q1"]) / s["median"]

        print(
            " CPU loop (%d iterations): bare median %.4f s (IQR %.1f%%, min %.4f max %.4f); "
            "sandbox median %.4f s (IQR %.1f%%, min %.4f max %.4f); sandbox/bare %.3f (medians), %.3f (minimums)"
            % (
                r["loop_params"]["n"],
                lb["median"],
                spread(lb),
                lb["min"],
                lb["max"],
                ls["median"],
                spread(ls),
                ls["min"],
                ls["max"],
                ls["median"] / lb["median"],
                ls["min"] / lb["min"],
            )
        )
    if u.get("c_loop_rounds"):
        for i, rd in enumerate(u["c_loop_rounds"], 1):
            print(
                " C loop round %d: %s"
                % (i, "; ".join(
                    "%s sandbox/bare %.3f" % (key, v["sandbox_median"] / v["bare_median"]) for key, v in rd.items()))
            )  # fmt: skip
        for line in fidelity_summary(u):
            print(" " + line)
    allres["table"] = [list(x) for x in rows]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(allres, f, indent=1)
    print(" wrote %s" % os.path.join(out, "results.json"))
    try:
        plot(allres, os.path.join(out, "latency.png"))
        print(" wrote %s" % os.path.join(out, "latency.png"))
    except ImportError as e:
        print(" no plot (%s)" % e)


def plot(d, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [
        ("docker run --rm", "docker_run"),
        ("docker run\n(sandbox flags)", "runner_docker_ref"),
        ("sandbox-runner", "runner"),
        ("sbatch+docker\n(floor)", "floor_sbatch_docker"),
        ("delegate\nsingle", "delegate_single"),
        ("submitit\nsingle", "submitit_single"),
    ]
    series = [(n, d[k]["samples"]) for n, k in series if d.get(k, {}).get("samples")]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(16, 5), gridspec_kw={"width_ratios": [3, 1.3, 1.3]})
    a1.boxplot([s for _, s in series], showfliers=True)
    a1.set_xticks(range(1, len(series) + 1), [n for n, _ in series])
    for i, (_, s) in enumerate(series, 1):
        a1.plot([i] * len(s), s, "o", alpha=0.4, ms=4)
    a1.set_ylabel("seconds (submit → result / gone)")
    a1.set_title("single-call latency distributions")
    a1.tick_params(axis="x", labelsize=8)
    maps = [
        (n, d[k]["seconds"])
        for n, k in (
            ("delegate\nmap 20", "delegate_map20"),
            ("delegate map 20,\njob per call", "delegate_map20_per_call"),
            ("submitit\nmap_array 20", "submitit_map20"),
            ("raw array\n20 true", "raw_array20_true"),
            ("delegate\nmap 200", "delegate_map200"),
            ("delegate map 200,\njob per call", "delegate_map200_per_call"),
        )
        if k in d
    ]
    a2.bar([n for n, _ in maps], [v for _, v in maps], color="tab:orange")
    a2.set_ylabel("seconds until all results")
    a2.set_title("maps (one exclusive node)")
    a2.tick_params(axis="x", labelsize=7, labelrotation=60)
    loops = [
        (n, d[k]["samples"])
        for n, k in (("bare node", "loop_bare"), ("sandbox", "loop_sandbox"))
        if d.get(k, {}).get("samples")
    ]
    if loops:
        a3.boxplot([s for _, s in loops])
        a3.set_xticks(range(1, len(loops) + 1), [n for n, _ in loops])
        a3.set_title("CPU loop timings (fidelity)")
        a3.set_ylabel("seconds")
    fig.suptitle("delegate benchmark %s" % d["date"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "root":
        root_phase(sys.argv[2])
    elif cmd == "user":
        user_phase(sys.argv[2])
    elif cmd == "fidelity":
        fidelity_phase(sys.argv[2])
    elif cmd == "tuning":
        tuning_phase(sys.argv[2], sys.argv[3:])
    elif cmd == "report":
        report(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)

#!/bin/bash
# tests/run.sh -- THE test command: checks the repo's lint and format policy,
# sets up the single-machine cluster and runs every test against it. Run as
# root from anywhere:  tests/run.sh
#   1. tests/lint.sh                (cargo fmt --check, cargo clippy -D
#                                    warnings, shellcheck, ruff check, ruff
#                                    format --check; see there)
#   2. cargo test --workspace --release   (unit and property tests), the
#                                    job gate's Lua tests on Lua 5.1 and 5.4,
#                                    maturin build + pip install of python/,
#                                    pytest -v tests/unit (the package's and
#                                    the harness's pure tests): with stage 1
#                                    the fast tier, no cluster
#   3. ./build_cluster.sh --local   (packages, Slurm, Docker, build, images;
#                                    idempotent, fast when already up)
#   4. pytest -v tests/e2e          (end-to-end, in a venv)
#   5. pytest -v tests/python       (the package as students, on the cluster)
#   6. pytest -v tests/site         (a site's own Slurm 24.11 on Debian 13,
#                                    delegate's packages installed into it)
#   6b. pytest -v tests/bundle      (the offline bundle for a bare GPU
#                                    machine, installed and checked on a
#                                    clean Debian 13 without network)
#   7. pytest -v tests/cluster      (the multi-node stack: deploy, test, down)
#                                   6, 6b and 7 but its worker machines'
#                                   suite run beside 4 and 5 (the side
#                                   lane: below), awaited after 5
#   7b. tests/cluster/test_machines.py alone, after the side lane (the
#                                    stack on worker machines, their faults;
#                                    it restarts this host's engine)
#   8. pytest -v tests/acceptance   (the course's day one on the stack, two
#                                    students in a real browser; screenshots
#                                    in $DELEGATE_ARTIFACTS/acceptance)
# Extra arguments are passed to pytest (e.g. tests/run.sh -k cancel -x).
# The venv ($DELEGATE_VENV, default /var/lib/delegate/venv) gets
# tests/requirements.txt when it exists (pip -r syntax, so it may name the
# Python package: ./python), else just pytest; it is made in stage 1 (ruff
# runs from it) and brought up to date in stage 2, and updated only
# when the requirements change (tests/venv.sh).
# Environment, for a local run only (CI sets neither):
#   DELEGATE_SKIP_LINT=1    skip stage 1
#   DELEGATE_SKIP_STACK=1   skip stages 6, 6b, 7 and 8
# Exits non-zero on the first failing stage.
set -euo pipefail

REPO=$(cd "$(dirname "$(readlink -f -- "${BASH_SOURCE[0]}")")/.." && pwd)
VENV=${DELEGATE_VENV:-/var/lib/delegate/venv}
export PATH="$HOME/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
T0=$SECONDS
STAGE_T0=
STAGE=
# Each stage's time, one "SECONDS  STAGE" line per stage and the total,
# kept where CI keeps its artifacts (tests/README.md: each stage's budget).
ARTIFACTS=${DELEGATE_ARTIFACTS:-/var/lib/delegate/artifacts}
TIMES=$ARTIFACTS/test-times.txt
# Each pytest stage's JUnit report (every test's time), beside the table.
JUNIT=$ARTIFACTS/junit
mkdir -p "$JUNIT"
rm -f "$JUNIT"/*.xml
printf '# tests/run.sh %s, commit %s\n' "$(date -u +%FT%TZ)" \
    "$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)" >"$TIMES"

# Records the last stage's time ($1: a mark after it, e.g. FAILED).
stage_done() {
    [[ -n $STAGE ]] || return 0
    printf '\033[1m--- %s: %ds\033[0m\n' "$STAGE" "$((SECONDS - STAGE_T0))"
    printf '%6d  %s%s\n' "$((SECONDS - STAGE_T0))" "$STAGE" "${1:+  $1}" >>"$TIMES"
    if [[ -f $STAGE_REPORT ]]; then
        "$VENV/bin/python" "$REPO/tests/slowest.py" "$STAGE_REPORT" 8 >>"$TIMES" || true
    fi
    STAGE=''
    STAGE_REPORT=''
}
# stage_slowest NAME: the table lists the slowest tests of the stage's
# report ($JUNIT/NAME.xml) under the stage's time.
STAGE_REPORT=
stage_slowest() { STAGE_REPORT=$JUNIT/$1.xml; }
# Prints every stage's time and the total, and keeps them in $TIMES.
stage_table() {
    printf '%6d  total\n' "$((SECONDS - T0))" >>"$TIMES"
    printf '\n\033[1m=== each stage'"'"'s time (kept in %s)\033[0m\n' "$TIMES"
    cat "$TIMES"
}
# Prints a header with the elapsed time, and the duration of the last stage.
section() {
    stage_done
    STAGE=$*
    STAGE_T0=$SECONDS
    printf '\n\033[1;34m=== [%4ds] %s\033[0m\n' "$((SECONDS - T0))" "$*"
}
fail() {
    side_lane_stop
    stage_done FAILED
    stage_table
    printf '\n\033[1;31m=== FAILED after %ds: %s\033[0m\n' "$((SECONDS - T0))" "$*" >&2
    exit 1
}

# The side lane: the stages with a Slurm of their own in containers of
# their own (6. site/, 6b. bundle/, then 7. cluster/ but for its worker
# machines' suite) share nothing with the single-machine cluster, whose one
# node stages 4 and 5 wait on, one job at a time, with the CPU mostly idle
# (load average 0.2-0.7 through stage 4): they run beside those two, their
# output kept in $SIDE_LOG and printed when they are awaited (after stage
# 5), their times added to the table. What they share with stages 4-5 is
# the engine (each checks only its own containers and networks; each
# node's epilog sweeps only its own) and the CPU. The worker machines'
# suite (7b) restarts this host's engine: it runs after, alone, then 8.
SIDE_PID=
SIDE_LOG=$ARTIFACTS/side-lane.log
# The e2e test that restarts this host's Docker engine (stage 4b, alone).
ENGINE_RESTART_TEST=tests/e2e/test_faults.py::test_docker_engine_restarted_mid_job
SIDE_TIMES=$ARTIFACTS/side-lane-times.txt
# side_lane_start ARGS...: the side lane's stages, in the background (their
# own process group: a failure elsewhere stops them all).
side_lane_start() {
    [[ ${DELEGATE_SKIP_STACK:-0} != 1 ]] || return 0
    : >"$SIDE_TIMES"
    set -m
    {
        side_stage site "6. site/ (beside 4-5)" tests/site "$@" \
            && side_stage bundle "6b. bundle/ (beside 4-5)" tests/bundle "$@" \
            && side_stage cluster "7. cluster/ but test_machines.py (beside 4-5)" \
                "tests/cluster --ignore=tests/cluster/test_machines.py" "$@"
    } >"$SIDE_LOG" 2>&1 </dev/null &
    SIDE_PID=$!
    set +m
    echo "the side lane (site/, bundle/, cluster/ but its machines) runs beside stages 4-5: its log in $SIDE_LOG"
}
# side_stage NAME WHAT TARGETS ARGS...: one pytest stage of the side lane
# (TARGETS: pytest's paths and options, split on spaces; its JUnit report
# NAME.xml); its time and slowest tests go to $SIDE_TIMES.
side_stage() {
    local name=$1 what=$2 t0=$SECONDS rc mark='' targets
    read -r -a targets <<<"$3"
    shift 3
    set +e
    "$VENV/bin/python" -m pytest -v --durations=10 --junitxml="$JUNIT/$name.xml" "${targets[@]}" "$@"
    rc=$?
    set -e
    ((rc == 0 || (rc == 5 && $# > 0))) || mark='  FAILED'
    printf '%6d  %s%s\n' "$((SECONDS - t0))" "$what" "$mark" >>"$SIDE_TIMES"
    "$VENV/bin/python" "$REPO/tests/slowest.py" "$JUNIT/$name.xml" 8 >>"$SIDE_TIMES" || true
    [[ -z $mark ]]
}
# side_lane_wait: waits for the side lane, prints its log, keeps its times;
# fails the run when one of its stages failed.
side_lane_wait() {
    [[ -n $SIDE_PID ]] || return 0
    section "the side lane (site/, bundle/, cluster/ but its machines, run beside stages 4-5): what is left of it"
    local rc=0
    wait "$SIDE_PID" || rc=$?
    SIDE_PID=
    cat "$SIDE_LOG"
    cat "$SIDE_TIMES" >>"$TIMES"
    ((rc == 0)) || fail "the side lane: site, bundle or cluster stack tests (pytest's report above)"
}
# side_lane_stop: the side lane stopped (a failing run), its log's end shown.
side_lane_stop() {
    [[ -n $SIDE_PID ]] || return 0
    kill -- "-$SIDE_PID" 2>/dev/null || true
    wait "$SIDE_PID" 2>/dev/null || true
    SIDE_PID=
    printf '\n--- the side lane, stopped (the end of %s):\n' "$SIDE_LOG"
    tail -n 30 "$SIDE_LOG" || true
}

cd "$REPO"
[[ $(id -u) -eq 0 ]] || fail "tests/run.sh must run as root (it sets up Slurm and Docker)"
# shellcheck source=venv.sh
source "$REPO/tests/venv.sh"

# cargo's build kept outside the clone: CI runs each time from a clean
# clone, where building every dependency again costs it minutes (a fresh
# machine builds them once). One cache per clone's path (cargo rebuilds
# the clone's own crates, all newer than it); caches of other paths left
# unused for 3 days are removed. A clone with its own target/, or a
# CARGO_TARGET_DIR, is left as it is.
if [[ ! -e $REPO/target && ! -L $REPO/target && -z ${CARGO_TARGET_DIR:-} ]]; then
    cargo_cache=${DELEGATE_CARGO_CACHE:-/var/lib/delegate/cargo-target}
    key=$(printf '%s' "$REPO" | sha256sum | cut -c1-12)
    mkdir -p "$cargo_cache/$key" || fail "cannot make cargo's build cache $cargo_cache/$key"
    find "$cargo_cache" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -mtime +3 -exec rm -rf {} + || true
    touch "$cargo_cache/$key"
    ln -s "$cargo_cache/$key" "$REPO/target" || fail "cannot link $REPO/target to cargo's build cache"
    echo "cargo's build: $REPO/target -> $cargo_cache/$key (kept between clean clones)"
fi

section "lint: cargo fmt, cargo clippy, shellcheck, ruff (tests/lint.sh)"
if [[ ${DELEGATE_SKIP_LINT:-0} == 1 ]]; then
    echo "WARNING: DELEGATE_SKIP_LINT=1: lint stage skipped" >&2
else
    # lint.sh makes or updates the venv itself (ruff is in it).
    DELEGATE_VENV=$VENV tests/lint.sh || fail "lint (tests/lint.sh; fix the findings above)"
fi

# The fast tier: nothing above or here needs the cluster or root's daemons
# (unit and property tests, the golden files, the gate's Lua tests).
section "cargo test --workspace --release (unit tests)"
cargo test --workspace --release || fail "unit tests"

section "the job gate's Lua tests (Lua 5.1: Debian's Slurm 22.05 and 24.11; Lua 5.4: a Slurm built with a newer Lua)"
for lua in lua5.1 lua5.4; do
    if ! command -v "$lua" >/dev/null; then
        [[ $(id -u) -eq 0 ]] || fail "$lua is not installed (apt-get install $lua)"
        apt-get install -y -q "$lua" >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q "$lua" >/dev/null; } \
            || fail "apt-get install $lua"
    fi
    out=$("$lua" tests/lua/job_submit_test.lua 2>&1) \
        || { grep -v '^ok' <<<"$out"; fail "the job gate's Lua tests on $lua"; }
    echo "$lua: ${out##*$'\n'}"
done

section "Python package: maturin build, install, pytest -v tests/unit (no cluster)"
# Made by the lint stage already, unless it was skipped; the test
# requirements are installed only when they changed (or on a new venv).
ensure_venv "$VENV" "$REPO/tests/requirements.txt" || fail "the test venv $VENV"
# The wheel is built with maturin into the test venv (readable by the test
# students of stage 5: jobs are submitted as delegate-alice, never as root).
"$VENV/bin/python" -c 'import maturin' 2>/dev/null \
    || "$VENV/bin/pip" install -q "maturin>=1.8,<2" || fail "pip install maturin"
wheels=$(mktemp -d)
"$VENV/bin/maturin" build --release -q -m python/Cargo.toml -i "$VENV/bin/python" -o "$wheels" \
    || fail "maturin build of the Python package"
{ "$VENV/bin/pip" install -q --force-reinstall --no-deps "$wheels"/delegate-*.whl \
    && "$VENV/bin/pip" install -q "$wheels"/delegate-*.whl; } || fail "pip install of the delegate wheel"
rm -rf "$wheels"
chmod -R a+rX "$VENV"
"$VENV/bin/python" -m pytest -v --durations=10 --junitxml="$JUNIT/unit.xml" tests/unit || fail "the fast tier's Python tests (tests/unit)"

section "build_cluster.sh --local (set up and start the cluster)"
# Two stand-in GPUs (test scaffolding: tests/e2e/test_gpu.py runs without
# real GPUs); a plain `--local` gives the machine's real GPUs or none.
DELEGATE_LOCAL_GPUS=${DELEGATE_LOCAL_GPUS:-standin:2} ./build_cluster.sh --local up || fail "build_cluster.sh --local"

section "pytest -v tests/e2e (end-to-end tests)"
# The home over a caching network filesystem (tests/e2e/test_network_home.py):
# sshd serves it, sshfs (FUSE) mounts it on the caller's side. The worker
# machines' home (tests/machines/machines.sh, stage 7): GlusterFS's FUSE
# client mounts it on this host, the manager.
for pkg in openssh-server:/usr/sbin/sshd sshfs:/usr/bin/sshfs glusterfs-client:/sbin/mount.glusterfs; do
    if [[ ! -x ${pkg#*:} ]]; then
        [[ $(id -u) -eq 0 ]] || fail "${pkg%%:*} is not installed (apt-get install ${pkg%%:*})"
        apt-get install -y -q "${pkg%%:*}" >/dev/null \
            || { apt-get update -q >/dev/null && apt-get install -y -q "${pkg%%:*}" >/dev/null; } \
            || fail "apt-get install ${pkg%%:*}"
    fi
done
# (the test venv: made or updated in stage 2; the packages above are in)
side_lane_start "$@"
if [[ -d tests/e2e ]]; then
    set +e
    # (but the one test that restarts this host's engine, which the side
    # lane's stacks use too: it runs after the side lane, 4b below)
    "$VENV/bin/python" -m pytest -v --durations=10 --junitxml="$JUNIT/e2e.xml" tests/e2e \
        --deselect "$ENGINE_RESTART_TEST" "$@"
    rc=$?
    set -e
    stage_slowest e2e
    # 5 = no tests collected: a pass only when extra arguments (-k ...)
    # deselected them all; the suite itself is never empty.
    if ((rc == 5 && $# > 0)); then
        echo "WARNING: pytest collected no tests in tests/e2e (deselected by: $*)" >&2
    elif ((rc != 0)); then
        fail "end-to-end tests (pytest exit $rc)"
    fi
else
    echo "WARNING: no tests/e2e directory; end-to-end tests skipped" >&2
fi

section "Python package: pytest -v tests/python (as students, on the cluster)"
set +e
"$VENV/bin/python" -m pytest -v --durations=10 --junitxml="$JUNIT/python.xml" tests/python "$@"
rc=$?
set -e
stage_slowest python
((rc == 0)) || fail "Python package tests (pytest exit $rc)"

# stack_stage DIR WHAT ARGS...: pytest DIR (a stage on the multi-node stack),
# unless DELEGATE_SKIP_STACK=1; exit 5 (no test collected) is a pass only when
# extra arguments (-k ...) deselected them all.
stack_stage() {
    local dir=$1 what=$2 rc
    shift 2
    if [[ ${DELEGATE_SKIP_STACK:-0} == 1 ]]; then
        echo "WARNING: DELEGATE_SKIP_STACK=1: $what skipped" >&2
        return 0
    fi
    set +e
    # (the ten slowest steps are printed: where the CI's minutes go)
    "$VENV/bin/python" -m pytest -v --durations=10 --junitxml="$JUNIT/$(basename "$dir" .py).xml" "$dir" "$@"
    rc=$?
    set -e
    stage_slowest "$(basename "$dir" .py)"
    ((rc == 0 || (rc == 5 && $# > 0))) || fail "$what (pytest exit $rc)"
}

# 6., 6b. and 7. (the side lane, begun with stage 4): a site's own Slurm,
# tests/site (tests/site/site.sh: Debian 13's Slurm 24.11 in three
# containers, general + course partitions, the site's own job_submit.lua,
# epilog and plugstack.conf; delegate's Debian packages installed and the
# site admin's lines added; a student, a researcher, an admin), then the
# offline bundle, tests/bundle (`./build_cluster.sh bundle`: Slurm, munge,
# Docker's engine, their libraries, delegate's packages: one file for a GPU
# machine without network; then its install half and the GPU check as a
# student on a clean Debian 13 container on an internal network, one
# stand-in GPU), then the multi-node deployment as containers on this
# machine (head, 2 workers, user node with JupyterLab; images reused when
# present), elastic workers included, but for the worker machines' suite.
side_lane_wait

section "4b. the engine restarted mid-job: pytest -v $ENGINE_RESTART_TEST (alone)"
set +e
"$VENV/bin/python" -m pytest -v --junitxml="$JUNIT/e2e-engine.xml" "$ENGINE_RESTART_TEST" "$@"
rc=$?
set -e
((rc == 0 || (rc == 5 && $# > 0))) || fail "the engine-restart test (pytest exit $rc)"

section "cluster stack on worker machines: pytest -v tests/cluster/test_machines.py"
# The stack's workers on the emulated worker machines (tests/machines: own
# Docker engines, the home over GlusterFS), their faults: machines killed,
# cut off, stopped; this host's engine restarted (hence alone, after the
# side lane).
stack_stage tests/cluster/test_machines.py "the worker machines' tests" "$@"

section "acceptance: pytest -v tests/acceptance (the course's day one, in a browser, on worker machines)"
# The instructor joins two worker machines (tests/machines: own Docker
# engines, the home over GlusterFS) -> deploy -> roster right after -> the
# instructor's test -> two students in JupyterHub (chromium + Playwright)
# -> down. Screenshots of every step:
# ${DELEGATE_ARTIFACTS:-/var/lib/delegate/artifacts}/acceptance-machines
# (DELEGATE_ACCEPTANCE_MACHINES=0: the same day on this machine alone, in
# acceptance/).
DELEGATE_ACCEPTANCE_MACHINES=${DELEGATE_ACCEPTANCE_MACHINES:-1} \
    stack_stage tests/acceptance "acceptance suite" "$@"

stage_done
stage_table
printf '\n\033[1;32m=== all tests passed: total %ds\033[0m\n' "$((SECONDS - T0))"

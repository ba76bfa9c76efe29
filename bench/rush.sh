#!/bin/bash
# bench/rush.sh -- the deadline rush, measured on a stack of its own (issues 12, 53).
#
#   bench/rush.sh [--students N] [--workers N] [--flood N] [--window S] [--seed N] [--keep]
#                 [--machines [--kill-at S]] [--hub SECONDS]
#
# Deploys a swarm stack (build_cluster.sh deploy) named $DELEGATE_STACK_NAME
# (default delegate-rush, its own directories, port and job ids, so it lives
# beside any other stack) with N light workers (default 12; one CPU each),
# then adds N students (default 215) and one flooder with the instructor's
# own roster command (`build_cluster.sh --stack accounts add --csv`, timed),
# measures the engine's own container lifecycle on this machine (as many
# `docker run --rm` of the sandbox image at once as there are workers: the
# floor's second half), and runs two phases with the same seed's schedule:
#   quiet   each student, at a moment of the window (default 180 s): a map of
#           10 Python calls of 1 s, awaited, then one to three single calls
#           of 1-3 s (one through delegate.Executor, the others from Python
#           or the CLI), each awaited (bench/rush.py)
#   rush    the same, while the flooder submits --flood calls (default
#           2000, `true`, in submissions of 100) as the window opens
# and prints: every call completed exactly once (state and the call's own
# token), the drain against the floor of the same run, per student the time
# to their first and last result (p50/p95/max) and the first against the
# round-robin bound, Jain's index of the students' slowdowns, the node time
# idle while work waited (sacct), slurmctld's RPC rate (sdiag), the
# manager's CPU and memory peak, the client's memory per student, and the
# rush/quiet ratios (the flooder's delay on the others). Results (rush.json
# and, with matplotlib in the bench venv of bench/run.sh, rush.png) go to
# bench/results/. With --machines the workers are the emulated worker
# machines instead (tests/machines: m1 and m2, each its own Docker engine,
# the home over GlusterFS with its caches), joined with the instructor's
# `machine add` and deployed with placement, one worker on each; with
# --kill-at S, m1 is killed S seconds after the rush phase's window opens
# (as a machine dies: its container killed on the machines' engine) and
# the figures count the calls that ran again on the other machine, against
# a floor with one worker fewer from then on. With --hub S, the first
# student (r001), S seconds into the rush's window, logs in to JupyterHub
# in chromium and runs the README's CFiddle example from a notebook
# (bench/rush_in_hub.py), while an instructor (rprof, added to the
# roster) has the rush page open: the lines the cell showed while it
# waited, the page's text and the screenshots go to
# $DELEGATE_ARTIFACTS/rush-hub. `down` at the end
# unless --keep. Run as root; it takes the
# machine's CPU for a while. Benchmarks print figures; nothing asserts on
# time.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$HOME/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
STUDENTS=${RUSH_STUDENTS:-215}
WORKERS=${RUSH_WORKERS:-12}
FLOOD=${RUSH_FLOOD:-2000}
WINDOW=${RUSH_WINDOW:-180}
SEED=${RUSH_SEED:-1}
KEEP=0
MACHINES=0
KILL_AT=""
HUB_AT=""
OUT=$REPO/bench/results
while (($#)); do
    case $1 in
        --students) STUDENTS=$2; shift ;;
        --workers) WORKERS=$2; shift ;;
        --flood) FLOOD=$2; shift ;;
        --window) WINDOW=$2; shift ;;
        --seed) SEED=$2; shift ;;
        --keep) KEEP=1 ;;
        --machines) MACHINES=1 ;;
        --kill-at) KILL_AT=$2; shift ;;
        --hub) HUB_AT=$2; shift ;;
        --out) OUT=$(realpath -m "$2"); shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "bench/rush.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[[ $(id -u) -eq 0 ]] || { echo "bench/rush.sh must run as root" >&2; exit 1; }
for n in "$STUDENTS" "$WORKERS" "$FLOOD" "$WINDOW" "$SEED"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench/rush.sh: '$n' is not a positive number" >&2; exit 2; }
done
((STUDENTS <= 400)) || { echo "bench/rush.sh: at most 400 students" >&2; exit 2; }
[[ -z $KILL_AT || ( $KILL_AT =~ ^[0-9]+$ && $MACHINES == 1 ) ]] \
    || { echo "bench/rush.sh: --kill-at takes seconds, with --machines" >&2; exit 2; }
[[ -z $HUB_AT || $HUB_AT =~ ^[0-9]+$ ]] || { echo "bench/rush.sh: --hub takes seconds" >&2; exit 2; }

# The stack of the benchmark: its own name, directories, port and job ids.
export DELEGATE_STACK_NAME=${DELEGATE_STACK_NAME:-delegate-rush}
export DELEGATE_STACK_DIR=${DELEGATE_STACK_DIR:-/srv/$DELEGATE_STACK_NAME}
export DELEGATE_STACK_HOME=${DELEGATE_STACK_HOME:-$DELEGATE_STACK_DIR/home}
export DELEGATE_STACK_STAGING=${DELEGATE_STACK_STAGING:-/run/$DELEGATE_STACK_NAME}
export DELEGATE_JUPYTER_PORT=${DELEGATE_JUPYTER_PORT:-18899}
export DELEGATE_STACK_FIRST_JOB_ID=${DELEGATE_STACK_FIRST_JOB_ID:-60000000}
# Light workers: one CPU each (the calls are sleeps and echos; memory as
# cluster.toml's default, 1 GB: a call's default limit).
export DELEGATE_STACK_WORKER_CPUS=${DELEGATE_STACK_WORKER_CPUS:-1}
# The accounts, from a roster as the instructor writes it: r001..rN and the
# flooder rflood.
roster=$(mktemp /tmp/delegate-rush-roster.XXXXXX.csv)
list=""
for ((i = 1; i <= STUDENTS; i++)); do
    u=$(printf 'r%03d' "$i")
    printf '%s,Rush Student %d,\n' "$u" "$i" >>"$roster"
    list+="$u "
done
printf 'rflood,Rush Flooder,\n' >>"$roster"
# (with --hub, an instructor too: the rush page is theirs)
[[ -z $HUB_AT ]] || printf 'rprof,Rush Instructor,,instructor\n' >>"$roster"
export RUSH_STUDENTS_LIST=${list% } RUSH_FLOODER=rflood RUSH_FLOOD=$FLOOD RUSH_WORKERS=$WORKERS
export RUSH_WINDOW=$WINDOW RUSH_SEED=$SEED

cd "$REPO"
MACHINES_TOOL=$REPO/tests/machines/machines.sh
cleanup() {
    rm -f "$roster"
    if ((KEEP == 0)); then
        "$REPO/build_cluster.sh" down || true
        if ((MACHINES)); then
            "$MACHINES_TOOL" down || true
            [[ -n $(docker stack ls --format '{{.Name}}') ]] || docker swarm leave --force >/dev/null 2>&1 || true
        fi
    fi
}
trap cleanup EXIT
if ((MACHINES)); then
    # The machines as the instructor joins them (tests/cluster/stacklib.py's
    # worker_machines: the same settings), then a deploy with placement.
    [[ $(docker info -f '{{.Swarm.LocalNodeState}}') == inactive ]] \
        || { echo "bench/rush.sh: this host's engine is in a swarm already: the machines join the one deploy makes" >&2; exit 1; }
    export DELEGATE_STACK_PLACEMENT=1 DELEGATE_STACK_WORKERS=2 DELEGATE_STACK_SLOTS=3 DELEGATE_SLURMD_TIMEOUT=30
    "$MACHINES_TOOL" up
    DELEGATE_MACHINE_SSH=$("$MACHINES_TOOL" ssh)
    export DELEGATE_MACHINE_SSH
    for m in m1 m2; do
        "$REPO/build_cluster.sh" machine add "root@$("$MACHINES_TOOL" address "$m")"
    done
    WORKERS=2 RUSH_WORKERS=2
    "$REPO/build_cluster.sh" deploy
else
    "$REPO/build_cluster.sh" deploy --workers "$WORKERS"
fi
t=$SECONDS
"$REPO/build_cluster.sh" --stack accounts add --csv "$roster"
echo "rush: the roster of $(wc -l <"$roster") accounts added in $((SECONDS - t)) s"

# The engine's own container lifecycle on this machine: as many sandboxes
# of `true` at once as there are workers, three rounds.
image=$(docker image ls -q delegate-sandbox:latest | head -n1)
[[ -n $image ]] || { echo "bench/rush.sh: no delegate-sandbox:latest image" >&2; exit 1; }
t0=$(date +%s.%N)
for ((r = 0; r < 3; r++)); do
    for ((w = 0; w < WORKERS; w++)); do docker run --rm --network none "$image" true >/dev/null & done
    wait
done
RUSH_LIFECYCLE_S=$(echo "($(date +%s.%N) - $t0) * $WORKERS / (3 * $WORKERS)" | bc -l)
export RUSH_LIFECYCLE_S
printf 'rush: a sandbox lifecycle takes %.2f s of a worker with %d at once on this machine\n' "$RUSH_LIFECYCLE_S" "$WORKERS"

# The driver, readable by the students on the user node (the shared home).
install -d -m 0755 "$DELEGATE_STACK_HOME/.rush"
install -m 0644 bench/rush.py "$DELEGATE_STACK_HOME/.rush/rush.py"
export RUSH_SCRIPT=$DELEGATE_STACK_HOME/.rush/rush.py
PY=python3
VENV=${BENCH_VENV:-/var/lib/delegate/bench-venv}
[[ -x $VENV/bin/python ]] && PY=$VENV/bin/python
work=$(mktemp -d /tmp/delegate-rush.XXXXXX)
echo "rush: $STUDENTS students over ${WINDOW} s (seed $SEED), $WORKERS workers, a flooder of $FLOOD calls (results in $work, then $OUT)"
"$PY" bench/rush.py phase quiet "$work"
if [[ -n $KILL_AT ]]; then
    # m1 (worker1) dies KILL_AT seconds after the rush's window opens (the
    # students start about 15 s after the phase, rush.py's `start`).
    (
        sleep "$((15 + STUDENTS / 20 + KILL_AT))"
        "$MACHINES_TOOL" docker kill m1 >/dev/null
        printf '{"machine": "m1", "worker": "worker1", "at": %s}\n' "$(date +%s.%N)" >"$work/killed-rush.json"
        echo "rush: killed machine m1 (worker1) at $(date +%T)"
    ) &
fi
if [[ -n $HUB_AT ]]; then
    # r001 in the hub's notebook during the rush (bench/rush_in_hub.py).
    hub_out=${DELEGATE_ARTIFACTS:-/var/lib/delegate/artifacts}/rush-hub
    (
        sleep "$((15 + STUDENTS / 20 + HUB_AT))"
        "${DELEGATE_VENV:-/var/lib/delegate/venv}/bin/python" bench/rush_in_hub.py r001 "$hub_out" rprof \
            || echo "rush: r001's notebook in the hub failed (above; screenshots in $hub_out)"
    ) &
fi
"$PY" bench/rush.py phase rush "$work"
wait
"$PY" bench/rush.py report "$work"
mkdir -p "$OUT"
cp "$work"/phase-quiet.json "$work"/phase-rush.json "$work"/rush.json "$OUT/"
[[ -f $work/rush.png ]] && cp "$work/rush.png" "$OUT/rush.png"
[[ -f $work/killed-rush.json ]] && cp "$work/killed-rush.json" "$OUT/"
rm -rf "$work"
echo "rush: results in $OUT/rush.json (per call: $OUT/phase-{quiet,rush}.json)"

#!/bin/bash
# bench/rush.sh -- the deadline rush, measured on a stack of its own (issue 12).
#
#   bench/rush.sh [--students N] [--workers N] [--flood N] [--keep]
#
# Deploys a swarm stack (build_cluster.sh deploy) named $DELEGATE_STACK_NAME
# (default delegate-rush, its own directories, port and job ids, so it lives
# beside any other stack) with N light workers (default 6; one CPU each),
# N students (default 60) and one flooder as the stack's accounts (cluster.toml
# DELEGATE_STACK_USERS: deploy gives each a Unix account on every node and an
# association in the course account), then runs two phases, same students:
#   quiet   every student submits at once: a single Python call of 1-3 s, a
#           map of 10 Python calls of 1 s, or a CLI job of 1-3 s (in turn)
#   rush    the same, while the flooder submits --flood calls (default
#           1000, `true`, in submissions of 100) 5 s ahead of them
# and prints: every call completed exactly once (state and the call's own
# token in its output), the students' waits (submit -> start) p50/p95/max
# and per student, the rush/quiet ratios (the flooder's delay on the
# others), the drain time against the sum of the calls' run time divided by
# the workers, and slurmctld's RPC rate from sdiag. Results (rush.json and,
# with matplotlib in the bench venv of bench/run.sh, rush.png) go to
# bench/results/. `down` at the end unless --keep. Run as root; it takes
# the machine's CPU for a while (several minutes per phase on 2 cores).
# Benchmarks print figures; nothing asserts on time.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$HOME/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
STUDENTS=${RUSH_STUDENTS:-60}
WORKERS=${RUSH_WORKERS:-6}
FLOOD=${RUSH_FLOOD:-1000}
KEEP=0
OUT=$REPO/bench/results
while (($#)); do
    case $1 in
        --students) STUDENTS=$2; shift ;;
        --workers) WORKERS=$2; shift ;;
        --flood) FLOOD=$2; shift ;;
        --keep) KEEP=1 ;;
        --out) OUT=$(realpath -m "$2"); shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "bench/rush.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[[ $(id -u) -eq 0 ]] || { echo "bench/rush.sh must run as root" >&2; exit 1; }
for n in "$STUDENTS" "$WORKERS" "$FLOOD"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench/rush.sh: '$n' is not a positive number" >&2; exit 2; }
done
((STUDENTS <= 400)) || { echo "bench/rush.sh: at most 400 students" >&2; exit 2; }

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
# The accounts: r001..rN (uids 5001..) and the flooder rflood (uid 5999).
users=""
list=""
for ((i = 1; i <= STUDENTS; i++)); do
    u=$(printf 'r%03d' "$i")
    users+="$u:$((5000 + i)) "
    list+="$u "
done
export DELEGATE_STACK_USERS="${users}rflood:5999"
export RUSH_STUDENTS_LIST=${list% } RUSH_FLOODER=rflood RUSH_FLOOD=$FLOOD RUSH_WORKERS=$WORKERS

cd "$REPO"
"$REPO/build_cluster.sh" deploy --workers "$WORKERS"
cleanup() {
    if ((KEEP == 0)); then "$REPO/build_cluster.sh" down || true; fi
}
trap cleanup EXIT

# The driver, readable by the students on the user node (the shared home).
install -d -m 0755 "$DELEGATE_STACK_HOME/.rush"
install -m 0644 bench/rush.py "$DELEGATE_STACK_HOME/.rush/rush.py"
export RUSH_SCRIPT=$DELEGATE_STACK_HOME/.rush/rush.py
PY=python3
VENV=${BENCH_VENV:-/var/lib/delegate/bench-venv}
[[ -x $VENV/bin/python ]] && PY=$VENV/bin/python
work=$(mktemp -d /tmp/delegate-rush.XXXXXX)
echo "rush: $STUDENTS students, $WORKERS workers, a flooder of $FLOOD calls (results in $work, then $OUT)"
"$PY" bench/rush.py phase quiet "$work"
"$PY" bench/rush.py phase rush "$work"
"$PY" bench/rush.py report "$work"
mkdir -p "$OUT"
cp "$work"/phase-quiet.json "$work"/phase-rush.json "$work"/rush.json "$OUT/"
[[ -f $work/rush.png ]] && cp "$work/rush.png" "$OUT/rush.png"
rm -rf "$work"
echo "rush: results in $OUT/rush.json (per call: $OUT/phase-{quiet,rush}.json)"

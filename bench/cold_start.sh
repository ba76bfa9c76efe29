#!/bin/bash
# bench/cold_start.sh -- elastic workers' cold start (issue 17): the time
# from submit to the first result when every worker is powered down.
#
#   bench/cold_start.sh [--calls N] [--rounds N] [--keep]
#
# Deploys an elastic stack of its own (build_cluster.sh deploy with
# DELEGATE_ELASTIC=1, min 0, max 2, 30 s idle; name delegate-cold, its own
# directories, port and job ids, so it lives beside any other stack), then
# per round: waits until every worker is powered down (Slurm's POWERED_DOWN,
# no worker container), runs bench/cold_start.py on the user node as a test
# account (a map of N calls, default 4) and prints its figures: first
# result, all results, the workers used; then one "warm" map right after
# (workers still up) for comparison. `down` at the end unless --keep.
# Run as root. Benchmarks print figures; nothing asserts on time.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$HOME/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
CALLS=4
ROUNDS=1
KEEP=0
while (($#)); do
    case $1 in
        --calls) CALLS=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --keep) KEEP=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "bench/cold_start.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[[ $(id -u) -eq 0 ]] || { echo "bench/cold_start.sh must run as root" >&2; exit 1; }
for n in "$CALLS" "$ROUNDS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench/cold_start.sh: '$n' is not a positive number" >&2; exit 2; }
done

export DELEGATE_STACK_NAME=${DELEGATE_STACK_NAME:-delegate-cold}
export DELEGATE_STACK_DIR=${DELEGATE_STACK_DIR:-/srv/$DELEGATE_STACK_NAME}
export DELEGATE_STACK_HOME=${DELEGATE_STACK_HOME:-$DELEGATE_STACK_DIR/home}
export DELEGATE_STACK_STAGING=${DELEGATE_STACK_STAGING:-/run/$DELEGATE_STACK_NAME}
export DELEGATE_JUPYTER_PORT=${DELEGATE_JUPYTER_PORT:-18902}
export DELEGATE_STACK_FIRST_JOB_ID=${DELEGATE_STACK_FIRST_JOB_ID:-46000000}
export DELEGATE_ELASTIC=1 DELEGATE_ELASTIC_MIN=0 DELEGATE_ELASTIC_MAX=${DELEGATE_ELASTIC_MAX:-2}
export DELEGATE_ELASTIC_IDLE=${DELEGATE_ELASTIC_IDLE:-30} DELEGATE_ELASTIC_RESUME_TIMEOUT=${DELEGATE_ELASTIC_RESUME_TIMEOUT:-120}
STUDENT=dlg-test1   # cluster.toml DELEGATE_STACK_TEST_USERS

cd "$REPO"
"$REPO/build_cluster.sh" deploy
cleanup() {
    if ((KEEP == 0)); then "$REPO/build_cluster.sh" down || true; fi
}
trap cleanup EXIT

cid() {
    docker ps -q --filter "label=com.docker.swarm.service.name=${DELEGATE_STACK_NAME}_$1" --filter status=running | head -n1
}
# powered_down: no worker container runs and Slurm has every worker idle~.
powered_down() {
    local i
    for ((i = 1; i <= DELEGATE_ELASTIC_MAX; i++)); do [[ -z $(cid "worker$i") ]] || return 1; done
    ! docker exec "$(cid head)" sinfo -h -N -o '%T' | grep -qv '^idle~$'
}
run_map() {
    docker exec -i -u "$STUDENT" -w "$DELEGATE_STACK_HOME/$STUDENT" -e "HOME=$DELEGATE_STACK_HOME/$STUDENT" \
        "$(cid user)" /opt/delegate/venv/bin/python - "$CALLS" <"$REPO/bench/cold_start.py"
}
for ((r = 1; r <= ROUNDS; r++)); do
    t=$SECONDS
    until powered_down; do
        ((SECONDS - t < 300)) || { echo "cold_start: workers not powered down after 300 s" >&2; exit 1; }
        sleep 2
    done
    echo "cold_start: round $r: every worker powered down; a map of $CALLS calls"
    run_map | grep -v '^{'
    echo "cold_start: round $r: the same map again, workers warm"
    run_map | grep -v '^{'
done

#!/bin/bash
# bench/run.sh -- delegate's benchmark (issue 6): every figure side by side in
# one run, against the floor (bare docker run --rm; sbatch of the same
# container run, submit -> gone, on an idle node) and against submitit.
#
#   bench/run.sh [--quick] [--skip-200] [--no-build] [--out DIR]
#   bench/run.sh --fidelity [--no-build]
#
#   --quick     smoke mode: 3 repetitions, no map of 200, short windows (~2 min)
#   --skip-200  everything but the maps of 200 calls (and bench/maps.py)
#   --no-build  reuse the delegate wheel already in the bench venv
#   --out DIR   where results.json and latency.png go (default bench/results)
#   --fidelity  only the CPU loop, bare node against sandbox, in blocks of
#               one round that alternate the node's tuning on and off (the
#               policy's pin_cpus and tune_cpus, put back afterwards;
#               BENCH_TUNING_BLOCKS of each, default 8): prints the ratios,
#               each setting's spread and which of the two, the tuning or
#               the machine's speed phases, widens the sandbox's spread
#               (~4 min; writes DIR/tuning.json)
#
# Environment: BENCH_REPS (10, cheap figures), BENCH_SLURM_REPS (6, figures
# that wait for an idle node first), BENCH_IDLE_WAIT (300 s; a sample whose
# node never became idle is skipped), BENCH_KEEP_JOBS=1 (keep the job
# directories the run creates; by default it removes exactly those).
#
# Run as root on the single-machine cluster (./build_cluster.sh --local): the
# floors need the Docker socket; the delegate and submitit calls are made by
# an ordinary account ($BENCH_USER, default delegate-bench, created when
# missing). The baselines of the user phase are plain Slurm (the bare-node
# `srun` loop, submitit's own sbatch scripts), which the lockdown leaves to
# cluster admins (docs/security.md), so that account is a member of the admin
# group ($DELEGATE_ADMIN_GROUP, default delegate-admin). Its delegate calls
# take the same path as a student's but for the job gate's script check
# (about 13 us per job, 1 ms for a map of 200, in slurmctld).
# The bench venv ($BENCH_VENV, default /var/lib/delegate/bench-venv) is its
# own: delegate (wheel built with maturin from this tree), submitit and
# matplotlib from PyPI. Benchmarks print figures; nothing asserts on time,
# and this is not part of tests/run.sh.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${BENCH_VENV:-/var/lib/delegate/bench-venv}
export BENCH_USER=${BENCH_USER:-delegate-bench}
ADMIN_GROUP=${DELEGATE_ADMIN_GROUP:-delegate-admin}
SUBMITIT_VERSION=${SUBMITIT_VERSION:-1.5.4}
OUT=$REPO/bench/results
BUILD=1
FIDELITY=0
export BENCH_QUICK=0 BENCH_SKIP_200=0
export PATH="$HOME/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
while (($#)); do
    case $1 in
        --quick) BENCH_QUICK=1 ;;
        --skip-200) BENCH_SKIP_200=1 ;;
        --fidelity) FIDELITY=1 ;;
        --no-build) BUILD=0 ;;
        --out) OUT=$(realpath -m "$2"); shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "bench/run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[[ $(id -u) -eq 0 ]] || { echo "bench/run.sh must run as root" >&2; exit 1; }
cd "$REPO"

# 0. The bench account: in the admin group (plain Slurm for the baselines).
getent group "$ADMIN_GROUP" >/dev/null \
    || { echo "bench/run.sh: no group $ADMIN_GROUP (run ./build_cluster.sh --local first)" >&2; exit 1; }
if ! id -nG "$BENCH_USER" 2>/dev/null | tr ' ' '\n' | grep -qx "$ADMIN_GROUP"; then
    # Only the bench's own account is ever created or added to the group:
    # never a test student (the lockdown tests need them without it).
    [[ $BENCH_USER == delegate-bench ]] \
        || { echo "bench/run.sh: BENCH_USER=$BENCH_USER is not in $ADMIN_GROUP (the baselines need plain Slurm)" >&2; exit 1; }
    id "$BENCH_USER" >/dev/null 2>&1 \
        || useradd --create-home --shell /bin/sh --user-group --comment "delegate bench account" "$BENCH_USER"
    usermod -aG "$ADMIN_GROUP" "$BENCH_USER"
    # slurmctld's job gate re-reads /etc/group at most every 60 s.
    echo "bench: $BENCH_USER added to $ADMIN_GROUP; waiting 61 s for the job gate to see it"
    sleep 61
fi
# Accounting is enforced (slurmdbd): the bench account needs an association
# in the course account, as every student has (build_cluster.sh accounts).
# (The config is read whole first: under pipefail, grep -q closing the pipe
# early would make scontrol's SIGPIPE fail the test.)
slurm_config=$(scontrol show config 2>/dev/null || true)
if grep -q '^AccountingStorageType *= *accounting_storage/slurmdbd' <<<"$slurm_config"; then
    acct=${DELEGATE_COURSE_ACCOUNT:-course}
    [[ -n $(sacctmgr -n -P show assoc where user="$BENCH_USER" account="$acct" format=user 2>/dev/null) ]] \
        || sacctmgr -i add user "$BENCH_USER" account="$acct" defaultaccount="$acct" >/dev/null \
        || { echo "bench/run.sh: cannot give $BENCH_USER an association in $acct" >&2; exit 1; }
fi

# The course accounts the maps and the Dask graph run as (two students, not
# admins), made the instructor's way: the roster command, which leaves
# accounts already in place as they are (a fresh `--local` has none).
MAP_USER=${BENCH_MAP_USER:-delegate-load0}
OTHER_USER=${BENCH_OTHER_USER:-delegate-load1}
roster=$(mktemp)
printf 'username,full name\n%s,Bench student A\n%s,Bench student B\n' "$MAP_USER" "$OTHER_USER" >"$roster"
if ! ./build_cluster.sh accounts add --csv "$roster"; then
    rm -f "$roster"
    echo "bench/run.sh: cannot add the course accounts $MAP_USER and $OTHER_USER (build_cluster.sh's error above)" >&2
    exit 1
fi
rm -f "$roster"

# 1. The bench venv: delegate + submitit + matplotlib.
if [[ ! -x $VENV/bin/python ]]; then
    python3 -m venv "$VENV"
fi
want="submitit==$SUBMITIT_VERSION matplotlib maturin>=1.8,<2"
stamp=$VENV/.bench-requirements
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install -q $want
    printf '%s' "$want" >"$stamp"
fi
if ((BUILD)) || ! "$VENV/bin/python" -c 'import delegate' 2>/dev/null; then
    wheels=$(mktemp -d)
    "$VENV/bin/maturin" build --release -q -m python/Cargo.toml -i "$VENV/bin/python" -o "$wheels"
    "$VENV/bin/pip" install -q --force-reinstall --no-deps "$wheels"/delegate-*.whl
    "$VENV/bin/pip" install -q "$wheels"/delegate-*.whl
    rm -rf "$wheels"
fi
chmod -R a+rX "$VENV"
"$VENV/bin/python" -c 'import submitit, delegate, matplotlib; print("bench venv:", "submitit", submitit.__version__)'

# 2. The phases: root (floors, runner cost), user (delegate, submitit), report.
work=$(mktemp -d /tmp/delegate-bench.XXXXXX)
chmod 0777 "$work"
trap 'rm -rf "$work"' EXIT
cp bench/bench.py "$work/bench.py"
chmod 0644 "$work/bench.py"
# tuning true|false: the site policy's pin_cpus and tune_cpus (the agent
# reads the policy at each call).
POLICY=${DELEGATE_POLICY:-/etc/delegate/policy.toml}
tuning() { sed -i -E "s/^(pin_cpus|tune_cpus) = .*/\1 = $1/" "$POLICY"; }
if ((FIDELITY)); then
    if ! grep -q '^pin_cpus = ' "$POLICY" || ! grep -q '^tune_cpus = ' "$POLICY"; then
        echo "bench/run.sh: $POLICY does not set pin_cpus and tune_cpus" >&2
        exit 1
    fi
    cp -p "$POLICY" "$work/policy.toml"
    trap 'cp -p "$work/policy.toml" "$POLICY"; rm -rf "$work"' EXIT
    for block in $(seq "${BENCH_TUNING_BLOCKS:-8}"); do
        for setting in on off; do
            if [[ $setting == on ]]; then tuning true; else tuning false; fi
            echo "block $block: tuning $setting"
            (cd "$work" && runuser -u "$BENCH_USER" -- env BENCH_USER="$BENCH_USER" BENCH_FIDELITY_ROUNDS=1 \
                BENCH_IDLE_WAIT="${BENCH_IDLE_WAIT:-300}" "$VENV/bin/python" "$work/bench.py" fidelity \
                "$work/fidelity-$setting-$block.json")
        done
    done
    cp -p "$work/policy.toml" "$POLICY"
    mkdir -p "$OUT"
    "$VENV/bin/python" "$work/bench.py" tuning "$OUT/tuning.json" "$work"/fidelity-*.json
    echo "wrote $OUT/tuning.json"
    exit 0
fi
"$VENV/bin/python" "$work/bench.py" root "$work/root.json"
(cd "$work" && runuser -u "$BENCH_USER" -- env BENCH_QUICK="$BENCH_QUICK" BENCH_SKIP_200="$BENCH_SKIP_200" \
    BENCH_USER="$BENCH_USER" BENCH_KEEP_JOBS="${BENCH_KEEP_JOBS:-0}" BENCH_IDLE_WAIT="${BENCH_IDLE_WAIT:-300}" \
    BENCH_REPS="${BENCH_REPS:-10}" BENCH_SLURM_REPS="${BENCH_SLURM_REPS:-6}" \
    "$VENV/bin/python" "$work/bench.py" user "$work/user.json")
"$VENV/bin/python" "$work/bench.py" report "$OUT" "$work/root.json" "$work/user.json"

# 3. Maps whose allocations pull their calls (issue 42): each against its
# baseline in the same run (bench/maps.py; two course accounts, not admins).
if ((!BENCH_QUICK && !BENCH_SKIP_200)); then
    "$VENV/bin/python" bench/maps.py --out "$OUT/maps.json"
fi

# 4. A Dask graph whose tasks each run in a sandbox (issue 43): its overhead
# per task against Dask's threads and delegate's own map, in the same run
# (bench/dask_graph.py; Dask at the pins both sides install).
"$VENV/bin/pip" install -q --no-deps -r python/requirements-cfiddle.txt
"$VENV/bin/python" bench/dask_graph.py --out "$OUT/dask.json"

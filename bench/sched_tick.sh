#!/bin/bash
# bench/sched_tick.sh -- the single call against Slurm's scheduling tick
# (issue 18): one Python call at a time, submit -> result, with slurm.conf's
# backfill interval at A and at B in alternating rounds of one run.
#
#   bench/sched_tick.sh [--rounds N] [--calls N] [--a SECONDS] [--b SECONDS]
#
# Defaults: 3 rounds of 8 calls per setting, A = 5 (the value before issue
# 18), B = 1 (slurm-conf/slurm.conf.j2 now). Each call waits 1.7 s after the
# previous one's result, so the calls fall at different phases of
# slurmctld's once-a-second background loop. Run as root on the
# single-machine cluster after bench/run.sh has made its account and venv
# ($BENCH_USER, default delegate-bench; $BENCH_VENV). It edits
# /etc/slurm/slurm.conf's bf_interval and runs `scontrol reconfigure`, and
# puts the file back as it was on exit. Prints each round's times and, per
# setting, the mean, median, minimum and maximum; nothing asserts on time.
set -euo pipefail
ROUNDS=3
CALLS=8
A=5
B=1
while (($#)); do
    case $1 in
        --rounds) ROUNDS=$2; shift ;;
        --calls) CALLS=$2; shift ;;
        --a) A=$2; shift ;;
        --b) B=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "bench/sched_tick.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
for n in "$ROUNDS" "$CALLS" "$A" "$B"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench/sched_tick.sh: '$n' is not a positive number" >&2; exit 2; }
done
[[ $(id -u) -eq 0 ]] || { echo "bench/sched_tick.sh must run as root" >&2; exit 1; }
CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
VENV=${BENCH_VENV:-/var/lib/delegate/bench-venv}
USER_=${BENCH_USER:-delegate-bench}
grep -q '^SchedulerParameters=.*bf_interval=[0-9]' "$CONF" \
    || { echo "bench/sched_tick.sh: no bf_interval in $CONF's SchedulerParameters (./build_cluster.sh --local first)" >&2; exit 1; }
if [[ ! -x $VENV/bin/python ]] || ! id "$USER_" >/dev/null 2>&1; then
    echo "bench/sched_tick.sh: run bench/run.sh once first (it makes $USER_ and $VENV)" >&2
    exit 1
fi

saved=$(mktemp)
cp -p "$CONF" "$saved"
restore() { cp -p "$saved" "$CONF"; rm -f "$saved"; scontrol reconfigure || true; }
trap restore EXIT

home=$(getent passwd "$USER_" | cut -d: -f6)
# The client script and the results live in a root-owned directory, never
# in the bench account's home (root writing there would follow whatever
# link that account left in its place).
work=$(mktemp -d)
chmod 755 "$work"
trap 'restore; rm -rf "$work"' EXIT
client=$work/client.py
cat >"$client" <<'EOF'
import json, sys, time
import delegate

f = delegate.remote(time="2m")(lambda x: x)
out = []
for i in range(int(sys.argv[1])):
    time.sleep(1.7)
    t = time.perf_counter()
    if f.submit(i).result(timeout=120) != i:
        sys.exit("wrong result")
    out.append(time.perf_counter() - t)
print(json.dumps(out))
EOF
chmod 644 "$client"

results=$work/results
for round in $(seq "$ROUNDS"); do
    for bf in "$A" "$B"; do
        sed -i -E "s/^(SchedulerParameters=.*bf_interval=)[0-9]+/\1$bf/" "$CONF"
        scontrol reconfigure
        sleep 4
        times=$(cd "$home" && runuser -u "$USER_" -- "$VENV/bin/python" "$client" "$CALLS")
        echo "round $round bf_interval=$bf: $times"
        echo "$bf $times" >>"$results"
    done
done
python3 - "$results" <<'EOF'
import json, statistics, sys
by = {}
for line in open(sys.argv[1]):
    bf, times = line.split(" ", 1)
    by.setdefault(int(bf), []).extend(json.loads(times))
for bf, v in by.items():
    print(f"bf_interval={bf}: {len(v)} calls, mean {statistics.mean(v):.3f} s, "
          f"median {statistics.median(v):.3f} s, min {min(v):.3f} s, max {max(v):.3f} s")
EOF

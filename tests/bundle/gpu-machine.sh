#!/bin/bash
# tests/bundle/gpu-machine.sh BUNDLE OUTDIR [install.sh options...] -- the
# one command a lent GPU machine runs (docs/ml.md, "Tried on a real GPU";
# issue 58), rehearsed first on the clean Debian 13 machine of
# tests/bundle/test_bundle.py. As root: the machine's facts, then the
# bundle unpacked in a scratch folder and `install.sh --check` with the
# options given, under a deadline; whatever happened, the log and the
# daemons' logs and configuration are left in OUTDIR:
#   facts.txt      the machine (kernel, OS, cgroup, GPUs, driver, Python)
#   offline.log    install.sh's and gpu-check.sh's one log
#   install.out    what install.sh printed (its errors before the log too)
#   logs.tar.gz    /var/log/delegate, /etc/slurm, /etc/delegate, the engine's
#                  daemon.json
# Exits with install.sh's status (124 past the deadline).
set -uo pipefail

BUNDLE=${1:?usage: gpu-machine.sh BUNDLE OUTDIR [install.sh options]}
OUTDIR=${2:?usage: gpu-machine.sh BUNDLE OUTDIR [install.sh options]}
shift 2
DEADLINE=${DELEGATE_GPU_MACHINE_DEADLINE:-420}
mkdir -p "$OUTDIR"

facts() {
    echo "date: $(date -u '+%F %T') UTC"
    echo "kernel: $(uname -srm)"
    echo "os: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"')"
    echo "glibc: $(getconf GNU_LIBC_VERSION)"
    echo "cpus: $(nproc), memory: $(awk '/MemTotal/ { print $2 " kB" }' /proc/meminfo)"
    echo "cgroup: $(stat -fc %T /sys/fs/cgroup) ($(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null))"
    echo "pid 1: $(tr '\0' ' ' </proc/1/cmdline)"
    echo "root fs: $(stat -fc %T /)"
    echo "python3: $(command -v python3) $(python3 -V 2>&1)"
    echo "devices: $(find /dev -maxdepth 1 -name 'nvidia*' -printf '%f ')"
    echo "nvidia-smi: $(command -v nvidia-smi) -> $(readlink -f "$(command -v nvidia-smi)" 2>/dev/null)"
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,driver_version,uuid,memory.total,clocks.max.sm,mig.mode.current,ecc.mode.current \
        --format=csv 2>&1
    echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
    echo "loader knows: $(ldconfig -p 2>/dev/null | grep -Eo 'lib(cuda|nvidia-ml)\.so[^ ]*' | sort -u | tr '\n' ' ')"
    echo "nvidia-smi, clean environment: $(env -i PATH=/usr/bin:/bin nvidia-smi -L 2>&1 | head -n 2 | tr '\n' ' ')"
    local smi
    smi=$(command -v nvidia-smi) && [[ $(head -c 2 "$smi") == '#!' ]] && sed -n '1,6s/^/nvidia-smi script: /p' "$smi"
    echo "interfaces: $(find /sys/class/net -mindepth 1 -maxdepth 1 -printf '%f ')"
}

facts >"$OUTDIR/facts.txt" 2>&1
cat "$OUTDIR/facts.txt"

# Not under /tmp: a machine may mount it noexec.
work=$(mktemp -d /var/tmp/delegate-offline.XXXXXX)
tar -xf "$BUNDLE" -C "$work"
timeout "$DEADLINE" bash "$work/delegate-offline/install.sh" --check --log "$OUTDIR/offline.log" "$@" \
    >"$OUTDIR/install.out" 2>&1
rc=$?
tail -n 80 "$OUTDIR/install.out"
((rc == 124)) && echo "gpu-machine.sh: install and check ran past ${DEADLINE} s"
tar -czf "$OUTDIR/logs.tar.gz" --ignore-failed-read /var/log/delegate /etc/slurm /etc/delegate \
    /etc/docker/daemon.json 2>/dev/null
echo "gpu-machine.sh: install.sh --check exited $rc; files in $OUTDIR"
exit "$rc"

#!/bin/bash
# gpu-check.sh [--student NAME] [--log FILE] -- the offline bundle's GPU
# check (docs/ml.md, "An offline GPU check"), as a student, after
# install.sh. Every command, its output and its verdict go to stdout and
# to FILE. The node's GPUs are read from gres.conf: NVIDIA devices get the
# real checks; stand-in devices (test scaffolding) the same checks on the
# device files, with the CUDA program expected to find no driver.
#   1. delegate doctor
#   2. delegate submit --gpus 1 --wait -- nvidia-smi -L   (one GPU seen)
#   3. the same without --gpus: no GPU, NVIDIA_VISIBLE_DEVICES=void
#   4. a CUDA program in the sandbox (delegate-cuda-check: memset, a PTX
#      kernel over 1M words, copy back, every word checked)
#   5. a Python call with gpus=1 (delegate.remote), and the GPU its
#      result's fingerprint names (real GPUs: model, driver, UUID, clocks,
#      ECC and MIG modes all known)
#   6. one GPU more than the node has: refused in one sentence
#   7. slurmd's cgroup side (root): cgroup.conf's rows, and slurmd running
#      in its own scope under them (cgroup v2) or in its v1 hierarchy
# Exits 1 when a check failed, naming it on the last line.
set -uo pipefail

STUDENT=delegate-student
LOG=/var/log/delegate/offline.log
PREFIX=/opt/delegate-offline
TEE=1
while (($#)); do
    case $1 in
        --student) STUDENT=${2:?}; shift 2 ;;
        --log) LOG=${2:?}; shift 2 ;;
        # install.sh's output already goes to FILE: not a second time.
        --logged-to) LOG=${2:?}; TEE=0; shift 2 ;;
        *) echo "gpu-check.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "gpu-check.sh: run it as root (it runs the checks as $STUDENT)" >&2; exit 1; }
((TEE)) && exec > >(tee -a "$LOG") 2>&1

HOME_DIR=$(getent passwd "$STUDENT" | cut -d: -f6)
[[ -n $HOME_DIR ]] || { echo "gpu-check.sh: no account $STUDENT" >&2; exit 1; }
FILES=$(sed -n 's/^NodeName=[^ ]* Name=gpu File=//p' /etc/slurm/gres.conf 2>/dev/null)
case $FILES in
    /dev/nvidia*) KIND=nvidia ;;
    /dev/delegate-gpu*) KIND=standin ;;
    *) KIND=none ;;
esac
# How many GPUs Slurm has on this node (sinfo's gres column, gpu:N).
GPU_COUNT=$(sinfo -h -N -o '%G' 2>/dev/null | sed -n 's/^gpu:\([0-9]*\).*/\1/p' | head -n1)
GPU_COUNT=${GPU_COUNT:-0}
# What check 5 wants: a real GPU is named in full by its fingerprint; a
# stand-in is known by its device file only.
FINGERPRINT_WANT="python call: \\('0', "
[[ $KIND == nvidia ]] && FINGERPRINT_WANT="^fingerprint names the GPU: True"
FAILED=()

# The student's python3 is root's (a GPU machine's may be a virtual
# environment's, outside the system's folders), the one the image was made of.
PY_DIR=$(dirname "$(command -v python3 || echo /usr/bin/python3)")

# as_student CMD: CMD in a login shell of the student's, in their home.
as_student() {
    (cd "$HOME_DIR" && runuser -u "$STUDENT" -- env -i HOME="$HOME_DIR" USER="$STUDENT" LOGNAME="$STUDENT" \
        PATH="$PY_DIR":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        PYTHONPATH="$PREFIX/python" bash -c "$1")
}

# check N TITLE CMD PATTERN [ABSENT]: runs CMD as the student; passes when
# its output matches the extended regex PATTERN and not ABSENT.
check() {
    local n=$1 title=$2 cmd=$3 want=$4 absent=${5:-} out rc
    echo
    echo "--- $n. $title"
    echo "\$ $cmd"
    out=$(as_student "$cmd" 2>&1)
    rc=$?
    printf '%s\n(exit %d)\n' "$out" "$rc"
    if grep -Eq -- "$want" <<<"$out" && { [[ -z $absent ]] || ! grep -Eq -- "$absent" <<<"$out"; }; then
        echo "PASS $n. $title"
    else
        echo "FAIL $n. $title (wanted /$want/${absent:+, not /$absent/})"
        FAILED+=("$n")
    fi
}

# cgroup_check: check 7, as root: the rows delegate wrote into cgroup.conf,
# and slurmd running under them (cgroup v2: in the scope slurmd makes for
# itself, system.slice/<node>_slurmstepd.scope as Debian's 22.05 names it;
# v1: in its hierarchies).
cgroup_check() {
    local conf=/etc/slurm/cgroup.conf pid want rows out
    echo
    echo "--- 7. slurmd's cgroup side ($(stat -fc %T /sys/fs/cgroup))"
    # The oldest slurmd (no procps on every bare machine).
    pid=$(grep -lx slurmd /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3 | sort -n | head -n1)
    out=$(grep -Ev '^(#|$)' "$conf" 2>&1; echo "slurmd pid ${pid:-none}"
          [[ -n $pid ]] && sed 's/^/slurmd cgroup: /' "/proc/$pid/cgroup"
          find /sys/fs/cgroup/system.slice -maxdepth 2 -path '*slurmstepd.scope/*' -type d -printf 'scope holds: %P\n' 2>/dev/null)
    printf '%s\n' "$out"
    want='^slurmd cgroup: ' rows='^CgroupPlugin=cgroup/v1$'
    if [[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]]; then
        want='^slurmd cgroup: 0::/system\.slice/([^/]+_)?slurmstepd\.scope/slurmd$' rows='^CgroupPlugin=cgroup/v2$'
    fi
    if grep -Eq -- "$want" <<<"$out" && grep -Eq -- "$rows" <<<"$out"; then
        echo "PASS 7. slurmd's cgroup side"
    else
        echo "FAIL 7. slurmd's cgroup side (wanted /$rows/ and /$want/)"
        FAILED+=(7)
    fi
}

echo "=== delegate GPU check, $(date -u '+%F %T') UTC, as $STUDENT, GPUs: ${FILES:-none} ($KIND)"
if [[ $KIND == nvidia ]]; then
    echo "--- the host's GPUs (root, nvidia-smi)"
    nvidia-smi -L 2>&1 || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,mig.mode.current,ecc.mode.current --format=csv 2>&1 || true
fi

check 1 "delegate doctor" "delegate doctor" "gpus"

# shellcheck disable=SC2016 # the job's shell expands them
case $KIND in
    nvidia)
        check 2 "one GPU asked: nvidia-smi -L sees one" "delegate submit --gpus 1 --wait -- nvidia-smi -L" \
            "^GPU 0: " "^GPU 1: "
        check 3 "no GPU asked: none seen" \
            'delegate submit --wait -- sh -c '\''echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; ls /dev; nvidia-smi -L; echo smi-exit=$?'\''' \
            "NVIDIA_VISIBLE_DEVICES=void" "^nvidia[0-9]|^GPU 0:|smi-exit=0"
        check 4 "a CUDA program in the sandbox" "delegate submit --gpus 1 --wait -- delegate-cuda-check" \
            "every word right"
        ;;
    standin)
        check 2 "one GPU asked: one stand-in device seen" \
            'delegate submit --gpus 1 --wait -- sh -c '\''ls /dev; echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES'\''' \
            "CUDA_VISIBLE_DEVICES=0" "^delegate-gpu1"
        check 3 "no GPU asked: none seen" \
            'delegate submit --wait -- sh -c '\''echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; ls /dev'\''' \
            "NVIDIA_VISIBLE_DEVICES=void" "^delegate-gpu"
        check 4 "a CUDA program in the sandbox (stand-ins: no driver to find)" \
            "delegate submit --gpus 1 --wait -- delegate-cuda-check" "no NVIDIA driver library in this sandbox"
        ;;
    none)
        echo "--- no GPUs on this node: checks 2-4 and the GPU of check 5 are not run"
        ;;
esac

if [[ $KIND != none ]]; then
    check 5 "a Python call with gpus=1" "python3 - <<'PY'
import os, delegate
def seen():
    devs = sorted(n for n in os.listdir('/dev') if n.startswith(('nvidia', 'delegate-gpu')))
    return os.environ.get('CUDA_VISIBLE_DEVICES'), devs
fut = delegate.remote(seen, gpus=1, time='5m').submit()
print('python call:', fut.result(timeout=600))
gpus = (fut.fingerprint or {}).get('gpus', [])
for g in gpus:
    print('fingerprint gpu:', g)
keys = ('model', 'driver', 'uuid', 'sm_mhz', 'sm_max_mhz', 'memory_max_mhz', 'ecc', 'mig')
print('fingerprint names the GPU:', len(gpus) == 1 and all(gpus[0].get(k) not in (None, 'unknown') for k in keys))
PY" "$FINGERPRINT_WANT" "Traceback"

    # One GPU more than the node has (the site's max_gpus is the node's).
    more=$((GPU_COUNT + 1))
    # shellcheck disable=SC2016 # the student's shell expands them
    check 6 "$more GPUs asked on a node of $GPU_COUNT: refused in one sentence" \
        'out=$(delegate submit --gpus '"$more"' --wait -- true 2>&1); echo "exit=$? lines=$(printf "%s\n" "$out" | wc -l): $out"' \
        "^exit=[1-9][0-9]* lines=1: .*gpus $more is more than the site maximum of $GPU_COUNT"
fi

cgroup_check

echo
if ((${#FAILED[@]})); then
    echo "=== GPU check: FAILED: ${FAILED[*]} (log $LOG)"
    exit 1
fi
echo "=== GPU check: all passed (log $LOG)"

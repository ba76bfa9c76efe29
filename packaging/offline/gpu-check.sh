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
#      result's fingerprint names
# Exits 1 when a check failed, naming it on the last line.
set -uo pipefail

STUDENT=delegate-student
LOG=/var/log/delegate/offline.log
PREFIX=/opt/delegate-offline
while (($#)); do
    case $1 in
        --student) STUDENT=${2:?}; shift 2 ;;
        --log) LOG=${2:?}; shift 2 ;;
        *) echo "gpu-check.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "gpu-check.sh: run it as root (it runs the checks as $STUDENT)" >&2; exit 1; }
exec > >(tee -a "$LOG") 2>&1

HOME_DIR=$(getent passwd "$STUDENT" | cut -d: -f6)
[[ -n $HOME_DIR ]] || { echo "gpu-check.sh: no account $STUDENT" >&2; exit 1; }
FILES=$(sed -n 's/^NodeName=[^ ]* Name=gpu File=//p' /etc/slurm/gres.conf 2>/dev/null)
case $FILES in
    /dev/nvidia*) KIND=nvidia ;;
    /dev/delegate-gpu*) KIND=standin ;;
    *) KIND=none ;;
esac
FAILED=()

# as_student CMD: CMD in a login shell of the student's, in their home.
as_student() {
    (cd "$HOME_DIR" && runuser -u "$STUDENT" -- env -i HOME="$HOME_DIR" USER="$STUDENT" LOGNAME="$STUDENT" \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
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
for g in (fut.fingerprint or {}).get('gpus', []):
    print('fingerprint gpu:', g)
PY" "python call: \('0', " "Traceback"
fi

echo
if ((${#FAILED[@]})); then
    echo "=== GPU check: FAILED: ${FAILED[*]} (log $LOG)"
    exit 1
fi
echo "=== GPU check: all passed (log $LOG)"

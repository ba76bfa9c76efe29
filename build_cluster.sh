#!/bin/bash
# build_cluster.sh -- set up and run a delegate cluster.
#
# Modes:
#   ./build_cluster.sh --local [up]     everything on this one machine (default)
#   ./build_cluster.sh --local stop     stop the daemons this script started
#   ./build_cluster.sh --local status   show daemons, sinfo, images
#   ./build_cluster.sh --local images   build the base and sandbox images only
#   ./build_cluster.sh --local --gpu-worker [up]
#                                       the GPU worker profile: this machine's
#                                       NVIDIA GPUs (/dev/nvidia<N>) as Slurm
#                                       GRES, passed into the sandboxes
#                                       (DELEGATE_LOCAL_GPUS=nvidia; docs/ml.md, GPUs)
#   ./build_cluster.sh accounts add --csv roster.csv [--instructors]
#                                       the roster: Unix accounts (0700
#                                       homes) and their Slurm associations
#   ./build_cluster.sh accounts list | remove USER [--archive]
#   ./build_cluster.sh --stack accounts add|list|remove ...
#                                       the same for the stack (hub logins)
#   ./build_cluster.sh packages [--out DIR] [--slurm-headers DIR]
#                                       Debian packages for a Slurm cluster a
#                                       site already has (packaging/README.md)
#   ./build_cluster.sh bundle [--out FILE]
#                                       the offline bundle for a bare GPU
#                                       machine without network (docs/ml.md,
#                                       "An offline GPU check")
#   ./build_cluster.sh --help
#
#   ./build_cluster.sh deploy [--workers N]   the multi-node cluster as a
#                                             Docker swarm stack (head, N
#                                             workers, user node + JupyterLab)
#   ./build_cluster.sh status                 (the stack's, when deployed)
#   ./build_cluster.sh test                   the instructor's check
#   ./build_cluster.sh update [--workers N]   rebuild images, restart
#   ./build_cluster.sh down                   remove the stack
#   ./build_cluster.sh shell USER             a login shell as USER on the
#                                             stack's user node (their own
#                                             Slurm configuration, as on the hub)
#   ./build_cluster.sh machine add [--worker N] HOST
#                                             prepare a worker machine over
#                                             ssh and join it as worker N
#   ./build_cluster.sh machine list | remove HOST|workerN
#                                             (docs/instructors.md, real machines)
# The settings of both shapes are in cluster.toml (see there).
#
# Each mode is a set of functions named <mode>_<action> (local_up,
# local_stop, local_status; stack_deploy, stack_status, stack_test,
# stack_update, stack_down).
#
# `--local up` on a fresh Debian 12 machine, as root:
#   1. installs the missing Debian packages (Slurm, munge, Docker, build deps),
#   2. writes /etc/slurm/slurm.conf from slurm-conf/slurm.conf.j2 (only a
#      file this script wrote before is ever replaced) and the epilog,
#   3. starts munged, MariaDB, slurmdbd, slurmctld, slurmd and dockerd
#      when not running (accounting: the cluster, the course account and
#      the student QOS in slurmdbd), and waits until the node is idle,
#   4. builds the Rust workspace and installs `delegate`, `sandbox-runner`
#      (an ordinary root:root 0755 program), the root `sandbox-agent` and
#      the place helper `delegate-place`,
#   5. builds the base and sandbox images,
#   6. installs the site policy /etc/delegate/policy.toml (unless present)
#      and (re)starts the root agent sandbox-agent (the Docker socket's only
#      holder; socket $DELEGATE_AGENT_SOCKET, log /var/log/delegate/agent.log)
#      and the place helper delegate-place (as Slurm's user: it tells each
#      student where their waiting jobs stand; log place.log),
#   7. runs a demo job as a non-root user and prints `delegate doctor`.
# It is idempotent: a second run skips everything already in place.
#
# Every setting of cluster.toml can be overridden from the environment.

set -euo pipefail
# The daemons this script starts (slurmdbd, the agent, ...) must not inherit
# the descriptors of whoever runs it: a `flock <lockfile> build_cluster.sh`
# lock would stay held for as long as they run. Everything above stderr is
# closed, but bash's own descriptor of this script (255).
for _fd in "/proc/$$/fd"/*; do
    _fd=${_fd##*/}
    if ((_fd > 2 && _fd != 255)); then eval "exec $_fd>&-"; fi
done
unset _fd

# This file is the one entry point: the settings, usage, argument parsing
# and dispatch. What each mode does is in the parts beside it, sourced
# below, each with a header saying what it holds and what it needs:
#   build_cluster.d/common.sh   logging, die, wait_for, need_root, docker_ok,
#                               MARKER, the environment (PATH)
#   build_cluster.d/packages.sh which Debian packages are missing
#   build_cluster.d/bundle.sh   bundle: the offline bundle of a bare GPU machine
#   build_cluster.d/quota.sh    per-student disk limits on the shared home
#   build_cluster.d/local.sh    --local up|stop|status (local_*)
#   build_cluster.d/accounting.sh  MariaDB + slurmdbd, the course account,
#                               the student QOS, `accounts` (the roster)
#   build_cluster.d/stack.sh    deploy|update|status|down of the swarm stack
#                               (stack_*)
#   build_cluster.d/hub.sh      JupyterHub on the stack's user node, the
#                               stack's accounts (`--stack accounts`)
#   build_cluster.d/elastic.sh  elastic workers: Slurm's power saving, the
#                               power service (elastic_*)
#   build_cluster.d/stack_accounting.sh  the stack's database, slurmdbd,
#                               slurmctld's state volume, the course account
#   build_cluster.d/check.sh    test: the instructor's check of a deployed
#                               stack (stack_test and its checks)
#   build_cluster.d/registry.sh the course's image registry for worker machines
#   build_cluster.d/machines.sh machine add|list|remove: the worker machines
#   build_cluster.d/machine-prepare.sh  not sourced: what `machine add` runs
#                               on a machine over ssh

# ---------------------------------------------------------------- settings
# Every DELEGATE_* setting (both shapes) is in cluster.toml (another file:
# DELEGATE_CLUSTER_CONF=PATH), each with its default and meaning; the
# environment wins over the file. They are resolved and checked once, right
# after common.sh is sourced (settings_load: delegate-deploy settings).
# Slurm's configuration file of the single machine:
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}

# ------------------------------------------------------------------ parts
# This script's own path with every symlink resolved, so the repository and
# the parts are found when it is run through a symlink or from another
# directory.
SELF=$(readlink -f -- "${BASH_SOURCE[0]}")
REPO=$(dirname -- "$SELF")
for part in common packages bundle quota local accounting stack elastic stack_accounting hub check registry machines machine-prepare; do
    [[ -r $REPO/build_cluster.d/$part.sh ]] || {
        printf '[build_cluster ERROR] %s missing: build_cluster.sh needs its parts beside it\n' \
            "$REPO/build_cluster.d/$part.sh" >&2
        exit 1
    }
done
unset part
# shellcheck source=build_cluster.d/common.sh
source "$REPO/build_cluster.d/common.sh"
# The settings, before any part reads them (some do at source time).
settings_load
# shellcheck source=build_cluster.d/packages.sh
source "$REPO/build_cluster.d/packages.sh"
# shellcheck source=build_cluster.d/bundle.sh
source "$REPO/build_cluster.d/bundle.sh"
# shellcheck source=build_cluster.d/quota.sh
source "$REPO/build_cluster.d/quota.sh"
# shellcheck source=build_cluster.d/local.sh
source "$REPO/build_cluster.d/local.sh"
# shellcheck source=build_cluster.d/accounting.sh
source "$REPO/build_cluster.d/accounting.sh"
# shellcheck source=build_cluster.d/stack.sh
source "$REPO/build_cluster.d/stack.sh"
# shellcheck source=build_cluster.d/elastic.sh
source "$REPO/build_cluster.d/elastic.sh"
# shellcheck source=build_cluster.d/stack_accounting.sh
source "$REPO/build_cluster.d/stack_accounting.sh"
# shellcheck source=build_cluster.d/hub.sh
source "$REPO/build_cluster.d/hub.sh"
# shellcheck source=build_cluster.d/check.sh
source "$REPO/build_cluster.d/check.sh"
# shellcheck source=build_cluster.d/registry.sh
source "$REPO/build_cluster.d/registry.sh"
# shellcheck source=build_cluster.d/machines.sh
source "$REPO/build_cluster.d/machines.sh"

# ------------------------------------------------------------ usage/main
# usage: the header comment of this file, without the leading "# ", and
# every setting with its current value.
usage() {
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$SELF"
    echo "Settings (cluster.toml, or the environment; current value):"
    local v
    for v in "${!DELEGATE_@}"; do printf '  %-32s %s\n' "$v" "${!v}"; done
    printf '  %-32s %s\n' SLURM_CONF "$SLURM_CONF"
}

# main ARGS...: parse the arguments into a mode (local, stack) and an action,
# then run the function <mode>_<action> (local_up, stack_deploy, ...).
main() {
    local mode="" action=""
    # `accounts ...` (after an optional --local): its own arguments.
    [[ ${1:-} == --local ]] && [[ ${2:-} == accounts ]] && shift
    if [[ ${1:-} == --stack && ${2:-} == accounts ]]; then
        shift 2
        stack_accounts_main "$@"
        return
    fi
    if [[ ${1:-} == packages ]]; then
        shift
        exec "$REPO/packaging/build-debs.sh" "$@"
    fi
    if [[ ${1:-} == bundle ]]; then
        local out=$REPO/target/bundle/delegate-offline.tar
        if [[ ${2:-} == --out ]]; then
            out=${3:?--out needs a file}
        elif (($# > 1)); then
            die "bundle takes only --out FILE"
        fi
        bundle_pack "$out"
        return
    fi
    if [[ ${1:-} == machine ]]; then
        shift
        machines_main "$@"
        return
    fi
    if [[ ${1:-} == accounts ]]; then
        shift
        accounts_main "$@"
        return
    fi
    while (($#)); do
        case $1 in
            -h|--help|help) usage; exit 0 ;;
            --local) mode=local ;;
            --gpu-worker) export DELEGATE_LOCAL_GPUS=nvidia ;;
            --stack) mode=stack ;;
            --workers) (($# > 1)) || die "--workers needs a number"; STACK_WORKERS_ARG=$2; shift ;;
            --workers=*) STACK_WORKERS_ARG=${1#--workers=} ;;
            up|stop|status|images) action=$1 ;;
            deploy|test|update|down) action=$1; mode=${mode:-stack} ;;
            shell) (($# > 1)) || die "shell needs a user name"; action=shell; mode=${mode:-stack}
                   STACK_SHELL_USER=$2; shift ;;
            *) die "unknown argument '$1' (see --help)" ;;
        esac
        shift
    done
    # `status` without a mode: the stack's when one is deployed here.
    if [[ -z $mode && $action == status ]] && [[ $(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null) == active ]] \
        && [[ -n $(docker stack ls --format '{{.Name}}' 2>/dev/null) ]]; then
        mode=stack
    fi
    mode=${mode:-local}
    action=${action:-up}
    declare -F "${mode}_${action}" >/dev/null || die "'$action' is not an action of the $mode mode (see --help)"
    "${mode}_${action}"
}

main "$@"

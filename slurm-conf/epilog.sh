#!/bin/sh
# delegate Slurm epilog, installed as /etc/slurm/delegate-epilog.sh (root, 0755)
# by build_cluster.sh. slurmd runs it as root after every job.
#
# sandbox-runner removes its container itself; this is the safety net for
# when it could not (SIGKILL after KillWait, runner crash, node trouble):
# remove every container labelled delegate.slurm-job=$SLURM_JOB_ID.
#
# Where the site policy says so (clean_scratch = true: a worker no user logs
# into), it also removes the files the job's user left in the node's /tmp,
# /var/tmp and /dev/shm.
#
# It must never fail: a non-zero exit would drain the node. Everything is
# logged to /var/log/delegate/epilog.log and the script always exits 0.

LOG=/var/log/delegate/epilog.log
POLICY=${DELEGATE_POLICY_FILE:-/etc/delegate/policy.toml}
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

log() {
    printf '%s epilog job=%s %s\n' "$(date '+%Y-%m-%dT%H:%M:%S')" "${SLURM_JOB_ID:-?}" "$*" >>"$LOG" 2>/dev/null
}

main() {
    case "${SLURM_JOB_ID:-}" in
        ''|*[!0-9_]*) log "no valid SLURM_JOB_ID, nothing to do"; return 0 ;;
    esac
    clean_scratch
    if ! command -v docker >/dev/null 2>&1; then
        log "docker CLI not found, skipping sweep"
        return 0
    fi
    # One listing of every delegate container serves both sweeps below.
    # Bounded: a hung docker daemon must not hang the epilog forever.
    listing=$(timeout 20 docker ps -a --filter label=delegate.slurm-job \
        --format '{{.ID}} {{.Label "delegate.slurm-job"}} {{.Label "delegate.node"}}' 2>>"$LOG") || {
        log "docker ps failed (exit $?), skipping sweep"
        return 0
    }
    remove_own "$(printf '%s\n' "$listing" | awk -v j="$SLURM_JOB_ID" '$2 == j { print $1 }')"
    remove_networks
    printf '%s\n' "$listing" | awk -v j="$SLURM_JOB_ID" 'NF >= 2 && $2 != j' | sweep_orphans
    return 0
}

# The job user's files in the node's scratch directories. slurmd writes
# `sbcast --jobid=<own job> FILE /tmp/x` as the user on the node, outside any
# step (the SPANK gate never sees it) and outside the home's quota: left
# there, such files would fill a worker's disk job after job. On a worker no
# user logs into (policy clean_scratch = true) nothing of the user's may
# outlive their job there; the node is exclusive, so the job that ends is
# the only one of theirs on it. Never for root or a non-numeric uid; find
# neither follows symlinks nor crosses into other filesystems.
clean_scratch() {
    grep -q '^clean_scratch *= *true' "$POLICY" 2>/dev/null || return 0
    uid=${SLURM_JOB_UID:-}
    case "$uid" in ''|*[!0-9]*|0) log "clean_scratch: no valid SLURM_JOB_UID"; return 0 ;; esac
    for d in /tmp /var/tmp /dev/shm; do
        if [ ! -d "$d" ] || [ -L "$d" ]; then continue; fi
        n=$(timeout 60 find "$d" -xdev -mindepth 1 -depth -user "$uid" -print -delete 2>>"$LOG" | wc -l)
        [ "$n" -gt 0 ] && log "user=${SLURM_JOB_USER:-?} removed $n of uid $uid's files from $d"
    done
    return 0
}

# This job's own containers: the runner removes them itself; these are the
# ones it could not (SIGKILL after KillWait, runner crash).
remove_own() {
    ids=$1
    if [ -z "$ids" ]; then
        log "user=${SLURM_JOB_USER:-?} no leftover containers"
        return 0
    fi
    # $ids is split on purpose: one argument per container id (hex, one per
    # line; no glob characters).
    # shellcheck disable=SC2086
    if timeout 60 docker rm -f $ids >>"$LOG" 2>&1; then
        log "user=${SLURM_JOB_USER:-?} removed leftover containers:" $ids
    else
        log "user=${SLURM_JOB_USER:-?} FAILED to remove some of:" $ids
    fi
}

# Orphans: delegate containers of Slurm jobs of THIS cluster that ran on THIS
# node and have ended (the node crashed or slurmd was killed, so their own
# epilog never ran, or the engine was down when it ran). Another cluster may
# share this Docker engine (the multi-node stack on one machine): a container
# is removed only when this cluster's slurmctld still knows its job, says it
# is over, and lists this node among its nodes. Jobs forgotten by slurmctld
# (MinJobAge) are left alone, unless the container carries this node's
# name (label delegate.node, set by sandbox-agent): a container of this
# node whose job slurmctld no longer knows, or labelled "none" (an old
# runner's), is removed too. A container labelled with another node is that
# node's to sweep and is left alone. Reads "<container id> <slurm job id> [<node>]".
# Another cluster on this engine may have a node of the same name (two
# stacks' worker1): its sandboxes' /job comes from its own staging
# directory, not from this node's (policy staging_host_dir, else
# staging_dir); those are left alone.
# The job-private networks of multi-node jobs (sandbox-agent/src/sandbox/rank.rs):
# this job's, and any whose Slurm job has ended or is unknown that this
# node's agent made (its delegate.node label; an engine may serve the
# nodes of another cluster, whose jobs this Slurm does not know, and a
# network is unattached for a moment after its agent made it). The engine
# refuses to remove a network that still has a container on it.
remove_networks() {
    nets=$(timeout 20 docker network ls --filter label=delegate.network=rank \
        --format '{{.ID}} {{.Label "delegate.slurm-job"}} {{.Label "delegate.node"}}' 2>>"$LOG") || return 0
    printf '%s\n' "$nets" | while read -r nid sj nnode; do
        [ -n "$nid" ] || continue
        case "$sj" in ''|*[!0-9]*) sj="" ;; esac
        if [ "$sj" != "$SLURM_JOB_ID" ] && [ -n "$nnode" ] && [ "$nnode" != "${SLURMD_NODENAME:-}" ]; then
            continue
        fi
        if [ "$sj" != "$SLURM_JOB_ID" ] && [ -n "$sj" ]; then
            st=$(timeout 10 squeue -h -j "$sj" -o %T 2>/dev/null | head -n1)
            case "$st" in RUNNING|PENDING|CONFIGURING|COMPLETING|SUSPENDED) continue ;; esac
        fi
        if timeout 30 docker network rm "$nid" >>"$LOG" 2>&1; then
            log "removed network $nid of Slurm job ${sj:-?}"
        fi
    done
}

sweep_orphans() {
    node=${SLURMD_NODENAME:-}
    [ -n "$node" ] || return 0
    stage=$(sed -n 's/^staging_host_dir *= *"\(.*\)".*/\1/p' "$POLICY" 2>/dev/null | head -n1)
    [ -n "$stage" ] || stage=$(sed -n 's/^staging_dir *= *"\(.*\)".*/\1/p' "$POLICY" 2>/dev/null | head -n1)
    while read -r id sj cnode; do
        # Another node's container (an engine shared by several nodes: the
        # stack): that node's own epilog sweeps it. Asking slurmctld about
        # every running sandbox of the other nodes after each job cost one
        # scontrol per container per epilog (most of slurmctld's RPCs in the
        # deadline rush, docs/benchmarks.md).
        if [ -n "$cnode" ] && [ "$cnode" != "$node" ]; then
            continue
        fi
        if [ "$cnode" = "$node" ]; then
            src=$(timeout 10 docker inspect -f '{{range .Mounts}}{{if eq .Destination "/job"}}{{.Source}}{{end}}{{end}}' "$id" 2>/dev/null)
            case "$src" in
                '') ;;
                "$stage"/*) ;;
                *) continue ;;
            esac
            case "$sj" in ''|*[!0-9]*) gone=1 ;; *) gone=0 ;; esac
            if [ "$gone" = 1 ] || ! timeout 10 scontrol -o show job "$sj" >/dev/null 2>&1; then
                if timeout 60 docker rm -f "$id" >>"$LOG" 2>&1; then
                    log "removed orphan container $id of this node (Slurm job $sj unknown)"
                fi
                continue
            fi
        fi
        case "$sj" in ''|*[!0-9]*) continue ;; esac
        info=$(timeout 10 scontrol -o show job "$sj" 2>/dev/null) || continue
        state=$(printf '%s\n' "$info" | sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p')
        case "$state" in
            COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|PREEMPTED|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) ;;
            *) continue ;;
        esac
        nodes=$(printf '%s\n' "$info" | sed -n 's/.* NodeList=\([^ ]*\) .*/\1/p')
        if [ -z "$nodes" ] || [ "$nodes" = "(null)" ]; then continue; fi
        timeout 10 scontrol show hostnames "$nodes" 2>/dev/null | grep -qx "$node" || continue
        if timeout 60 docker rm -f "$id" >>"$LOG" 2>&1; then
            log "removed orphan container $id of ended Slurm job $sj ($state)"
        fi
    done
    return 0
}

mkdir -p /var/log/delegate 2>/dev/null
main
exit 0

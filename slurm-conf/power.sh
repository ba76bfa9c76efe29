#!/bin/bash
# delegate-power: elastic workers through Slurm's power saving (docs/elastic.md).
#
# slurmctld runs it, as SlurmUser, on the head, under three names (links the
# stack's entrypoint makes in /usr/local/lib/delegate/, named in slurm.conf):
#   power-resume HOSTLIST        ResumeProgram: start these workers
#   power-suspend HOSTLIST       SuspendProgram: stop these idle workers
#   power-resume-fail HOSTLIST   ResumeFailProgram: these did not register
#                                within ResumeTimeout: stop them, say why
# and, started by the head's entrypoint as SlurmUser:
#   power watch                  resumes in Slurm each worker whose start
#                                failed for want of a machine once the
#                                power service says one is back (below)
# HOSTLIST is Slurm's expression (worker[1-2]); `scontrol show hostnames`
# expands it. How a node is started or stopped:
#   - a site hook (/usr/local/lib/delegate/power-hook, cluster.toml
#     DELEGATE_POWER_HOOK) when installed: `HOOK resume|suspend NODE...`,
#     for real machines (wake-on-LAN, IPMI, a cloud CLI; docs/elastic.md);
#   - else the stack's power service: one request file per node in the
#     spool directory (a root-only host directory bound into the head and
#     into the "power" service only), answered there by `delegate-power`
#     (stack/power/), which scales the worker's swarm service to 1 or 0
#     replicas.
# A worker that cannot be started is set DOWN with the reason (the jobs that
# waited for it are requeued) and stays out of service with that reason
# until an operator resumes it: the failure is remembered in the spool
# (failed.NODE), put back when Slurm's ResumeTimeout overwrites the reason,
# and turned into a drain should Slurm's power saving (idle_on_node_suspend)
# make the DOWN node idle again. One failure ends by itself: swarm had no
# node for the worker's task ("no suitable node": its machine was off or
# cut off when Slurm asked for it). The power service watches the swarm for
# a machine that can take it again and says so in the spool (back.NODE);
# `power watch` then resumes the node, which Slurm starts when a job wants
# it.
set -uo pipefail

SPOOL=${DELEGATE_POWER_SPOOL:-/run/delegate-power}
HOOK=/usr/local/lib/delegate/power-hook
LOG=${DELEGATE_POWER_LOG:-/var/log/delegate/power.log}

log() { printf '%s [power %s] %s\n' "$(date '+%F %T')" "$ACTION" "$*" >>"$LOG" 2>/dev/null || printf '%s [power %s] %s\n' "$(date '+%F %T')" "$ACTION" "$*" >&2; }

# clean TEXT: a reason Slurm shows (printable, no quotes, bounded).
clean() { tr -c '[:alnum:] .,:;_/()=+-' ' ' <<<"$1" | tr -s ' ' | cut -c1-180; }

# node_ok NAME: a worker name of this stack's form.
node_ok() { [[ $1 =~ ^worker[1-9][0-9]{0,3}$ ]]; }

# mark_down NODE REASON: out of service with the reason; the jobs that
# waited for it are requeued (requeue_waiting); the failure is remembered
# (keep_out) until the node starts.
mark_down() {
    local reason
    reason="elastic: $(clean "$2")"
    requeue_waiting "$1"
    if ! { printf '%s\n' "$reason" >"$SPOOL/.failed.$1" && mv -f "$SPOOL/.failed.$1" "$SPOOL/failed.$1"; }; then
        log "$1: cannot remember the failure in $SPOOL"
    fi
    log "$1: DOWN: $reason"
    scontrol update "nodename=$1" state=down "reason=$reason" >>"$LOG" 2>&1 \
        || log "$1: scontrol update state=down failed"
}

# keep_out NODE: NODE is being powered down; if its last start failed
# (failed.NODE), drain it with that reason: with idle_on_node_suspend, Slurm
# makes a DOWN node idle (and startable) when it powers it down, and a worker
# that cannot start would then hold every job that lands on it for a failed
# start again. Drained, it stays out until an operator fixes the cause and
# runs `scontrol update nodename=NODE state=resume`.
#   The node's reason tells whether the DOWN was left alone: the power
# saving keeps it, an operator's `state=resume` clears it (then the failure
# is forgotten, not drained again).
keep_out() {
    local reason now
    reason=$(remembered "$1")
    [[ -n $reason ]] || return 0
    now=$(node_reason "$1")
    if [[ $now != elastic:* ]]; then
        log "$1: its failed start was cleared (reason now '$(clean "$now")'): forgotten"
        started "$1"
        return 0
    fi
    reason=$(clean "$reason")
    log "$1: its last start failed: drained until an operator resumes it"
    scontrol update "nodename=$1" state=drain "reason=elastic: $reason" >>"$LOG" 2>&1 \
        || log "$1: scontrol update state=drain failed"
}

# started NODE: NODE registered: forget an earlier failure (and that its
# machine was announced back).
started() { rm -f -- "$SPOOL/failed.$1" "$SPOOL/back.$1"; }

# remembered NODE: the reason of NODE's remembered failed start, without
# its "elastic: " ("" when none).
remembered() {
    local f="$SPOOL/failed.$1" why=""
    [[ -f $f && ! -L $f ]] && why=$(head -c 200 -- "$f" | head -n1)
    printf '%s' "${why#elastic: }"
}

# node_reason NODE: the reason Slurm shows for NODE ("none" when none).
node_reason() { sinfo -h -N -n "$1" -o %E 2>/dev/null | head -n1; }

# requeue_waiting NODE: the jobs allocated to NODE that still wait for it
# (CONFIGURING: their batch script never started, so nothing of them ran)
# may be requeued: delegate submits a call without retries --no-requeue,
# which would make the node's failure end it NODE_FAIL although it never
# started. Requeued, they run elsewhere, once (the runner runs a call again
# only when an earlier attempt started and left no outcome, within its
# retries).
requeue_waiting() {
    local j
    for j in $(squeue -h -w "$1" -t CF -o %i 2>/dev/null); do
        [[ $j =~ ^[0-9]+(_[0-9]+)?$ ]] || continue
        if scontrol update "jobid=$j" requeue=1 >>"$LOG" 2>&1; then
            log "$1: job $j waited for it: requeued when the node goes down"
        else
            log "$1: job $j: scontrol update requeue=1 failed"
        fi
    done
}

# wait_registered NODE SECONDS: NODE's slurmd registered (no longer
# powering up, "#") within SECONDS.
wait_registered() {
    local deadline=$((SECONDS + $2)) st
    while ((SECONDS < deadline)); do
        st=$(sinfo -h -N -n "$1" -o %T 2>/dev/null | head -n1)
        [[ -n $st && $st != *'#' ]] && return 0
        sleep 2
    done
    return 1
}

# resume_timeout: ResumeTimeout of slurm.conf (seconds; 60 when unset).
resume_timeout() {
    local t
    t=$(sed -n 's/^ResumeTimeout=\([0-9]*\)$/\1/p' /etc/slurm/slurm.conf | tail -n1)
    echo "${t:-60}"
}

# ask ACTION NODE...: one request per node to the power service; waits for
# every answer (up to ResumeTimeout). Prints "NODE ok|error MESSAGE" lines.
ask() {
    local action=$1 n id deadline
    shift
    local -A ids=()
    for n in "$@"; do
        id=$(date +%s%N)$RANDOM$RANDOM
        if ! { printf '%s %s\n' "$action" "$n" >"$SPOOL/.tmp$id" && mv -f "$SPOOL/.tmp$id" "$SPOOL/req.$id"; }; then
            echo "$n error cannot write a request into $SPOOL"
            continue
        fi
        ids[$n]=$id
    done
    deadline=$((SECONDS + $(resume_timeout)))
    for n in "${!ids[@]}"; do
        id=${ids[$n]}
        while [[ ! -f $SPOOL/res.$id ]] && ((SECONDS < deadline)); do sleep 0.5; done
        if [[ -f $SPOOL/res.$id ]]; then
            echo "$n $(head -c 400 "$SPOOL/res.$id" | head -n1)"
            rm -f "$SPOOL/res.$id"
        else
            rm -f "$SPOOL/req.$id"
            echo "$n error the power service did not answer (is the stack's power service running?)"
        fi
    done
}

# failed_reasons NODE...: these did not register within ResumeTimeout and
# Slurm set them DOWN, "ResumeTimeout reached": each gets the reason of its
# failed start. One already down with this program's own reason
# (power-resume saw the failure first) keeps it, it says more; Slurm's own
# timeout replaced that by "ResumeTimeout reached": the remembered one is
# put back, else the timeout is named.
failed_reasons() {
    local n why
    for n in "$@"; do
        [[ $(node_reason "$n") == elastic:* ]] && continue
        why=$(remembered "$n")
        [[ -n $why ]] || why="worker $n did not register within ResumeTimeout=$(resume_timeout)s (see build_cluster.sh status; resume it with scontrol update nodename=$n state=resume)"
        mark_down "$n" "$why"
    done
}

# slurm_side ACTION HOSTLIST: what slurmctld runs.
slurm_side() {
    local action=$1 list=$2 n rc out line
    local -a nodes=()
    local re='^[][A-Za-z0-9,-]+$'
    [[ $list =~ $re ]] || { log "refused host list '$(clean "$list")'"; return 1; }
    mapfile -t nodes < <(scontrol show hostnames "$list")
    for n in "${nodes[@]}"; do
        node_ok "$n" || { log "refused node name '$(clean "$n")'"; return 1; }
    done
    ((${#nodes[@]})) || return 0
    log "${nodes[*]}"
    # Slurm set them DOWN ("ResumeTimeout reached"): first a reason an
    # operator can act on (at once: sinfo and the doctor read it), then
    # stop what may be half up (a hook or the power service may take a
    # while).
    [[ $action == resume-fail ]] && failed_reasons "${nodes[@]}"
    if [[ -x $HOOK ]]; then
        # The site's own way of powering machines (real machines).
        local hook_action=$action
        [[ $action == resume-fail ]] && hook_action=suspend
        out=$(timeout "$(resume_timeout)" "$HOOK" "$hook_action" "${nodes[@]}" 2>&1)
        rc=$?
        log "hook $hook_action: exit $rc: $(clean "$(tail -n 3 <<<"$out")")"
        if [[ $action == resume && $rc -ne 0 ]]; then
            for n in "${nodes[@]}"; do
                mark_down "$n" "the power hook failed to start it (exit $rc): $(tail -n 1 <<<"$out")"
            done
        elif [[ $action == resume ]]; then
            # (a machine that then never registers comes back through
            # ResumeFailProgram, which remembers it again)
            for n in "${nodes[@]}"; do started "$n"; done
        fi
    else
        case $action in
            resume)
                local -a started=()
                while read -r n rc line; do
                    log "$n: $rc $line"
                    if [[ $rc == ok ]]; then
                        started+=("$n")
                    else
                        mark_down "$n" "cannot start worker $n: $line"
                    fi
                done < <(ask resume "${nodes[@]}")
                # Running is not registered: a slurmd that never registers
                # is marked down here, a little before ResumeTimeout (Slurm's
                # own timeout would end the waiting jobs NODE_FAIL).
                local until=$(($(resume_timeout) - 10))
                for n in "${started[@]}"; do
                    if wait_registered "$n" "$((until - SECONDS))"; then
                        started "$n"
                        continue
                    fi
                    ask suspend "$n" >/dev/null
                    mark_down "$n" "worker $n runs but its slurmd did not register within ResumeTimeout=$(resume_timeout)s (see its service log: build_cluster.sh status)"
                done
                ;;
            suspend)
                while read -r n rc line; do log "$n: $rc $line"; done < <(ask suspend "${nodes[@]}")
                ;;
            resume-fail)
                while read -r n rc line; do log "$n: stop after the failed resume: $rc $line"; done \
                    < <(ask suspend "${nodes[@]}")
                ;;
        esac
    fi
    if [[ $action == suspend ]]; then
        for n in "${nodes[@]}"; do keep_out "$n"; done
    fi
    return 0
}

# watch: every WATCH_EVERY seconds, each worker the power service announced
# back (back.NODE: a machine can take it again) whose failed start still
# keeps it out (its reason is this program's) is resumed in Slurm; its
# failure is forgotten. One an operator already resumed is only forgotten.
WATCH_EVERY=${DELEGATE_POWER_WATCH_EVERY:-5}
watch() {
    local f n
    log "watching $SPOOL for workers whose machine is back"
    while :; do
        for f in "$SPOOL"/back.worker*; do
            [[ -f $f && ! -L $f ]] || continue
            n=${f##*/back.}
            node_ok "$n" || { rm -f -- "$f"; continue; }
            back_in_service "$n" "$(head -c 200 -- "$f" | head -n1)" || continue
            started "$n"
        done
        sleep "$WATCH_EVERY"
    done
}

# back_in_service NODE WHY: NODE's machine is back (WHY, the power service's
# words): NODE resumed in Slurm. Not while Slurm still counts it as
# powering up ("#": the failed start is younger than ResumeTimeout): Slurm
# then ends that start itself (ResumeFailProgram keeps this program's
# reason) and powers it down, and a node resumed before would be failed
# again by that timeout, with a reason that keeps it out. Fails (to be
# tried again) until it can be resumed.
back_in_service() {
    local n=$1 why
    why=$(clean "$2")
    if [[ $(node_reason "$n") != elastic:* ]]; then
        log "$n: $why; already back in service"
        return 0
    fi
    [[ $(sinfo -h -N -n "$n" -o %T 2>/dev/null | head -n1) == *'#' ]] && return 1
    if ! scontrol update "nodename=$n" state=resume >>"$LOG" 2>&1; then
        log "$n: scontrol update state=resume failed; tried again"
        return 1
    fi
    log "$n: its start waited for a machine; $why: resumed"
}

case ${0##*/} in
    power-resume) ACTION=resume ;;
    power-suspend) ACTION=suspend ;;
    power-resume-fail) ACTION=resume-fail ;;
    *) ACTION=${1:-} ; shift || true ;;
esac
case $ACTION in
    resume | suspend | resume-fail) slurm_side "$ACTION" "${1:-}" ;;
    watch) watch ;;
    *) echo "usage: power-resume|power-suspend|power-resume-fail HOSTLIST, or power watch" >&2; exit 2 ;;
esac

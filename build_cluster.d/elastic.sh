# shellcheck shell=bash
# build_cluster.d/elastic.sh -- elastic workers of the stack (issue 17,
# docs/elastic.md): Slurm's power saving starts workers when jobs wait and
# stops them when idle. cluster.toml DELEGATE_ELASTIC=1 turns it on.
#
# What it adds to the stack (stack.sh calls these):
#   - slurm.conf (rendered by delegate-deploy, slurm-conf/slurm.conf.j2):
#     ResumeProgram/SuspendProgram/ResumeFailProgram (the head's
#     /usr/local/lib/delegate/power-*, slurm-conf/power.sh), SuspendTime,
#     ResumeTimeout; workers above DELEGATE_ELASTIC_MIN are State=CLOUD
#     (powered down until a job needs them);
#   - the "power" service (manager node, the Docker socket, root): it alone
#     scales worker services, on requests slurmctld's programs write into
#     a root/SlurmUser-only spool directory ($DELEGATE_STACK_DIR/power)
#     bound into the head and into it, nowhere else (no student reaches
#     either container);
#   - each worker service's replicas: 1 for the always-on ones, else what
#     runs now (a redeploy does not stop workers Slurm started), else 0.
# Sourced by build_cluster.sh after stack.sh; needs log, warn, die, STACK,
# STACK_GEN, the DELEGATE_* settings of cluster.toml.

# elastic_on: DELEGATE_ELASTIC=1.
elastic_on() { [[ ${DELEGATE_ELASTIC:-0} == 1 ]]; }

# elastic_load_config: with elastic on, the stack has DELEGATE_ELASTIC_MAX
# workers (and the power hook, when set, must be an executable file).
elastic_load_config() {
    # (each setting's bounds are the schema's, checked by settings_load;
    # MIN above MAX is refused when slurm.conf is rendered)
    elastic_on || return 0
    if [[ -n $DELEGATE_POWER_HOOK ]]; then
        [[ -f $DELEGATE_POWER_HOOK && -x $DELEGATE_POWER_HOOK ]] || die "DELEGATE_POWER_HOOK $DELEGATE_POWER_HOOK is not an executable file"
    fi
    [[ -n $STACK_WORKERS_ARG && $STACK_WORKERS_ARG != "$DELEGATE_ELASTIC_MAX" ]] \
        && warn "elastic workers: --workers $STACK_WORKERS_ARG ignored, the stack has DELEGATE_ELASTIC_MAX=$DELEGATE_ELASTIC_MAX"
    DELEGATE_STACK_WORKERS=$DELEGATE_ELASTIC_MAX
    ELASTIC_SPOOL=$DELEGATE_STACK_DIR/power
}

# elastic_replicas: "r1 r2 ... rN", the replicas of each worker service.
elastic_replicas() {
    local i r out=""
    for ((i = 1; i <= DELEGATE_STACK_WORKERS; i++)); do
        r=1
        if elastic_on && ((i > DELEGATE_ELASTIC_MIN)); then
            r=$(docker service inspect -f '{{.Spec.Mode.Replicated.Replicas}}' "${STACK}_worker$i" 2>/dev/null || echo 0)
            [[ $r == 1 ]] || r=0
        fi
        out+="$r "
    done
    echo "$out"
}

# elastic_generate: the power program and hook (swarm configs) and the spool.
elastic_generate() {
    install -m 0644 "$REPO/slurm-conf/power.sh" "$STACK_GEN/power.sh"
    if elastic_on && [[ -n $DELEGATE_POWER_HOOK ]]; then
        install -m 0644 "$DELEGATE_POWER_HOOK" "$STACK_GEN/power-hook"
    else
        # A swarm config may not be empty; the head's entrypoint knows this line.
        echo "# delegate: no power hook (cluster.toml DELEGATE_POWER_HOOK)" >"$STACK_GEN/power-hook"
    fi
    if elastic_on; then
        # Root's on the host; the head hands it to SlurmUser (0700).
        [[ -d $ELASTIC_SPOOL ]] || install -d -m 0700 "$ELASTIC_SPOOL"
        log "elastic workers: worker1..worker$DELEGATE_ELASTIC_MAX, $DELEGATE_ELASTIC_MIN always on, stopped after ${DELEGATE_ELASTIC_IDLE}s idle$([[ -n $DELEGATE_POWER_HOOK ]] && echo ", power hook $DELEGATE_POWER_HOOK")"
    fi
}

# elastic_always_on I: worker I runs all the time (elastic off, or I <= MIN).
elastic_always_on() { ! elastic_on || (($1 <= DELEGATE_ELASTIC_MIN)); }

# elastic_power_states: "workerN STATE" lines from slurmctld (sinfo's long
# states: idle, idle~ powered down, idle# / alloc# powering up, idle% powering
# down, down~ ...) with the meaning spelled out.
elastic_power_states() {
    local out node st what
    out=$(stack_exec head sinfo -h -N -o '%N %T %E' 2>/dev/null) || { echo "(slurmctld does not answer)"; return 0; }
    while read -r node st reason; do
        case $st in
            *~) what="POWERED_DOWN" ;;
            *#) what="POWERING_UP" ;;
            *%) what="POWERING_DOWN" ;;
            *!) what="POWER_DOWN pending" ;;
            *) what="POWERED_UP" ;;
        esac
        [[ $reason == none ]] && reason=""
        printf '%-10s %-14s %-14s %s\n' "$node" "$what" "${st%[~#%!]}" "${reason:-}"
    done < <(sort -u <<<"$out")
}

# elastic_reset_nodes: an elastic worker whose service does not run (0
# replicas: after a down, or a deploy that stopped it) but that Slurm's
# saved state (the volume <stack>-slurmctld-state) has up, powering up,
# DOWN, or powered down and not responding (which Slurm never starts) is
# powered down (POWER_DOWN_FORCE; with idle_on_node_suspend it is
# idle afterwards), so a deploy starts from "every elastic worker powered
# down". A worker kept out after a failed start (down~ or drained~ with an
# "elastic:" reason, power.sh) is resumed and its failure forgotten: a
# deploy is how an operator brings the fixed images or settings. Returns 1
# while slurmctld does not answer yet.
elastic_reset_nodes() {
    elastic_on || return 0
    local i n st r why
    for ((i = DELEGATE_ELASTIC_MIN + 1; i <= DELEGATE_ELASTIC_MAX; i++)); do
        n=worker$i
        r=$(docker service inspect -f '{{.Spec.Mode.Replicated.Replicas}}' "${STACK}_$n" 2>/dev/null)
        [[ $r == 0 ]] || continue
        st=$(stack_exec head sinfo -h -N -n "$n" -o '%T|%E' 2>/dev/null) || return 1
        [[ -n $st ]] || return 1
        why=${st#*|}
        st=${st%%|*}
        [[ $st == *% ]] && continue
        if [[ $st == idle~ ]]; then
            # Powered down, but NOT_RESPONDING from a run before the state
            # was saved (a worker that was always on in the last deploy):
            # Slurm counts it unavailable and never starts it. A forced
            # power-down clears the flag.
            stack_exec head scontrol -o show node "$n" 2>/dev/null | grep -q 'State=[^ ]*NOT_RESPONDING' || continue
            log "elastic: $n is powered down but 'not responding' in Slurm's saved state (Slurm would never start it): powered down afresh"
            stack_exec head scontrol update "nodename=$n" state=power_down_force \
                || warn "elastic: scontrol update nodename=$n state=power_down_force failed"
            continue
        fi
        if [[ $st == down~ || $st == drained~ ]]; then
            [[ $why == elastic:* ]] || continue   # an operator's own: left alone
            log "elastic: $n was kept out after a failed start ($why): resumed for this deploy"
            rm -f -- "$ELASTIC_SPOOL/failed.$n"
            stack_exec head scontrol update "nodename=$n" state=resume \
                || warn "elastic: scontrol update nodename=$n state=resume failed"
            continue
        fi
        log "elastic: $n is '$st' in Slurm's saved state but does not run: powering it down"
        stack_exec head scontrol update "nodename=$n" state=power_down_force \
            || warn "elastic: scontrol update nodename=$n state=power_down_force failed"
    done
    return 0
}

# shellcheck shell=bash
# build_cluster.d/machines.sh -- the course's worker machines, from the
# manager (docs/instructors.md, "On real machines"):
#   ./build_cluster.sh machine add [--worker N] HOST   prepare HOST over ssh
#                                  and join it to this swarm as worker N
#                                  (the next free number by default)
#   ./build_cluster.sh machine list                    the machines and
#                                  the worker each one runs
#   ./build_cluster.sh machine remove HOST|workerN     drain worker N in
#                                  Slurm (its running calls finish), then
#                                  take the machine out of the swarm
# Run on the manager, as root; HOST is what ssh takes (root@host, an alias
# of ~/.ssh/config). DELEGATE_MACHINE_SSH is the ssh command (default
# "ssh -o BatchMode=yes"). Everything on the machine is done by
# machine-prepare.sh, sent over ssh: nothing needs to be copied there first.
# From the manager rather than on each machine: the join token, the worker
# numbers and the node labels are the manager's, and the instructor has the
# checkout and cluster.toml only there.
#
# Sourced by build_cluster.sh after common.sh and stack.sh.

MACHINE_SSH=${DELEGATE_MACHINE_SSH:-ssh -o BatchMode=yes}

# machine_ssh HOST CMD...: CMD on HOST as its ssh login (root).
machine_ssh() {
    local host=$1
    shift
    # shellcheck disable=SC2086  # the ssh command is words by design
    $MACHINE_SSH "$host" "$@"
}

# machine_workers: "N NODE-ID HOSTNAME" for each swarm node labelled
# delegate.worker=N.
machine_workers() {
    local id
    for id in $(docker node ls -q); do
        # (a node removed between the list and this look is no machine)
        docker node inspect -f '{{index .Spec.Labels "delegate.worker"}} {{.ID}} {{.Description.Hostname}}' "$id" \
            2>/dev/null || true
    done | awk '$1 ~ /^[0-9]+$/' | sort -n
}

machine_add() {
    local worker="" host="" out node version boot manager token
    while (($#)); do
        case $1 in
            --worker) (($# > 1)) || die "--worker needs a number"; worker=$2; shift ;;
            -*) die "machine add: unknown option '$1'" ;;
            *) [[ -z $host ]] || die "machine add takes one host"; host=$1 ;;
        esac
        shift
    done
    [[ -n $host ]] || die "usage: ./build_cluster.sh machine add [--worker N] HOST"
    [[ $host =~ ^[A-Za-z0-9@._-]+$ ]] || die "machine add: '$host' is not a host name"
    need_root
    stack_load_config
    # The manager's address is the one it reaches the machine from: the
    # overlay network's packets from another source address are dropped.
    local ip src
    ip=$(getent ahostsv4 "${host#*@}" | awk 'NR == 1 {print $1}')
    [[ -n $ip ]] || die "machine add: cannot resolve ${host#*@}"
    src=$(ip -4 route get "$ip" 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
    stack_swarm "$src"
    manager=$(docker info -f '{{.Swarm.NodeAddr}}'):2377
    [[ -z $src || ${manager%:*} == "$src" ]] \
        || warn "this swarm's manager advertises ${manager%:*} but reaches $host from $src: the overlay network between them may not carry traffic (a swarm made for the machines: docker swarm init --advertise-addr $src)"
    token=$(docker swarm join-token -q worker)
    # Checked before the machine is touched: a machine already in this
    # swarm keeps its number, and a number is one machine's.
    # (delegate-deploy's `joining` decides the number: placement.rs)
    local known machines key rest
    known=$(machine_ssh "$host" docker info -f '{{.Swarm.NodeID}}' </dev/null 2>/dev/null) || known=""
    machines=$(mktemp -p "$BC_TMP")
    machine_workers >"$machines"
    read -r key rest < <(deploy_value joining --machines "$machines" --node "$known" --host "$host" \
        ${worker:+--worker "$worker"})
    rm -f "$machines"
    [[ $key == join ]] || die "${rest:-delegate-deploy joining gave no answer}"
    worker=$rest
    log "machine $host: preparing it as worker$worker (ssh: $MACHINE_SSH)"
    # The course's CA, for the registry the machine pulls its images from.
    local registry ca
    registry=$(registry_address)
    ca=$(base64 -w0 <"$(registry_ca)")
    out=$(machine_ssh "$host" bash -s -- "$DELEGATE_STACK_STAGING" "$worker" "$DELEGATE_STACK_HOME" \
        "$manager" "$token" "$registry" "$ca" <"$REPO/build_cluster.d/machine-prepare.sh" 2>&1) \
        || die "machine $host: $(tail -n 3 <<<"$out")"
    read -r _ node version boot < <(grep '^node ' <<<"$out" | tail -n 1)
    [[ -n ${node:-} ]] || die "machine $host: no node id in its answer: $(tail -n 3 <<<"$out")"
    wait_for 60 "machine $host in the swarm" docker node inspect "$node" >/dev/null \
        || die "machine $host: node $node does not show in this swarm"
    # (delegate.ssh: how `test`, `status` and `shell` reach its containers)
    docker node update --availability active --label-add delegate.role=worker --label-add "delegate.worker=$worker" \
        --label-add "delegate.ssh=$host" "$node" >/dev/null \
        || die "cannot label node $node"
    log "machine $host: worker$worker: in the swarm as node $node (Docker $version), staging $DELEGATE_STACK_STAGING/worker$worker a shared mount, at boot too ($boot), trusts the registry $registry"
    machine_start_worker "$worker" "$host"
}

# machine_start_worker N HOST: on a course running with placement, start
# worker N on its new machine HOST: its service (one per slot, 0 replicas
# while no machine had the number) scaled to 1; Slurm's FUTURE node N
# comes up when its slurmd registers. No configuration changes, nothing
# else restarts. Without a running course: `deploy` starts it.
machine_start_worker() {
    local n=$1 host=$2 svc=${STACK}_worker$1
    if [[ $DELEGATE_STACK_PLACEMENT != 1 || -z $(docker stack services -q "$STACK" 2>/dev/null) ]]; then
        log "machine $host: ./build_cluster.sh deploy runs worker$n there"
        return 0
    fi
    docker service inspect "$svc" >/dev/null 2>&1 \
        || die "machine $host: the course runs no service worker$n: it was deployed with fewer slots (DELEGATE_STACK_SLOTS); ./build_cluster.sh update starts it"
    docker service scale -d "$svc=1" >/dev/null || die "cannot scale $svc to 1"
    wait_for "$DELEGATE_STACK_WAIT" "worker$n up in Slurm" machine_up "$n" \
        || die "worker$n is not up in Slurm after ${DELEGATE_STACK_WAIT}s: $(docker service ps --no-trunc --format '{{.CurrentState}} {{.Error}}' "$svc" | head -n 2)"
    log "machine $host: worker$n takes calls (Slurm: $(stack_exec head sinfo -h -n "worker$n" -o %T)); nothing else restarted"
}

# machine_up N: Slurm on the head has worker N up and taking jobs.
machine_up() {
    stack_exec head sinfo -h -n "worker$1" -o %T 2>/dev/null | grep -Eqx "$STACK_NODE_UP"
}

machine_list() {
    local n id hostn state
    printf '%-8s %-16s %-26s %s\n' WORKER MACHINE NODE STATE
    while read -r n id hostn; do
        state=$(docker node inspect -f '{{.Status.State}}/{{.Spec.Availability}}' "$id" 2>/dev/null) || state=gone
        printf '%-8s %-16s %-26s %s\n' "worker$n" "$hostn" "$id" "$state"
    done < <(machine_workers)
}

# machine_idle N: Slurm runs no job on worker N.
machine_idle() { [[ -z $(stack_exec head squeue -h -w "worker$1" -o %i) ]]; }

machine_remove() {
    local what=${1:-} n id hostn
    [[ -n $what ]] || die "usage: ./build_cluster.sh machine remove HOST|workerN"
    need_root
    stack_load_config
    read -r n id hostn < <(machine_workers | awk -v w="$what" '"worker" $1 == w || $3 == w || $2 == w' | head -n 1)
    [[ -n ${id:-} ]] || die "no machine '$what' (./build_cluster.sh machine list)"
    if [[ -n $(stack_cid head) ]]; then
        log "worker$n: draining in Slurm (running calls finish; new ones go elsewhere)"
        stack_exec head scontrol update "nodename=worker$n" state=drain "reason=machine $hostn removed" \
            || die "scontrol update nodename=worker$n state=drain failed"
        wait_for "$DELEGATE_STACK_WAIT" "worker$n's running jobs to finish" machine_idle "$n" \
            || die "worker$n still runs jobs after ${DELEGATE_STACK_WAIT}s; try again later"
    fi
    if docker service inspect "${STACK}_worker$n" >/dev/null 2>&1; then
        # Its service stops (a later deploy keeps it at 0: no machine has
        # the number), and Slurm forgets the node until a machine has it.
        docker service scale "${STACK}_worker$n=0" >/dev/null 2>&1 || die "cannot scale ${STACK}_worker$n to 0"
        if [[ -n $(stack_cid head) ]]; then
            stack_exec head scontrol update "nodename=worker$n" state=future \
                || warn "Slurm keeps worker$n drained (scontrol update state=future failed)"
        fi
    fi
    docker node update --availability drain "$id" >/dev/null || die "cannot drain node $id"
    docker node update --label-rm delegate.worker --label-rm delegate.role --label-rm delegate.ssh "$id" >/dev/null || true
    log "machine $hostn: worker$n stopped after its last call, out of Slurm and the swarm's placement; on it: docker swarm leave; then here: docker node rm $id"
}

# machines_placed: with placement (DELEGATE_STACK_PLACEMENT=1), every worker
# 1..N has its machine, and some node is labelled for the user node (this
# manager, when none is); without, no machine is labelled a worker (what
# delegate-deploy's `placement` says, stack_worker_ids). `deploy` and
# `update` call it.
machines_placed() {
    local key rest
    stack_worker_ids
    while read -r key rest; do
        case $key in
            refuse) die "$rest" ;;
            warn) warn "$rest" ;;
        esac
    done <<<"$STACK_PLACEMENT_SAYS"
    [[ $DELEGATE_STACK_PLACEMENT == 1 ]] || return 0
    # The workers are the machines (those beyond N too: added to the
    # running course by `machine add`); the renders after it read it.
    # shellcheck disable=SC2034
    elastic_on || DELEGATE_STACK_WORKERS=${#STACK_WORKER_IDS[@]}
    if [[ -z $(docker node ls -q --filter node.label=delegate.role=user) ]]; then
        docker node update --label-add delegate.role=user "$(docker info -f '{{.Swarm.NodeID}}')" >/dev/null \
            || die "cannot label this manager delegate.role=user"
        log "placement: the user node (JupyterHub) goes to this manager (label delegate.role=user)"
    fi
    while read -r key rest; do
        [[ $key != log ]] || log "$rest"
    done <<<"$STACK_PLACEMENT_SAYS"
}

machines_main() {
    local action=${1:-}
    shift || true
    case $action in
        add) machine_add "$@" ;;
        list) machine_list ;;
        remove) machine_remove "$@" ;;
        *) die "usage: ./build_cluster.sh machine add [--worker N] HOST | list | remove HOST|workerN" ;;
    esac
}

# shellcheck shell=bash
# build_cluster.d/stack.sh -- the multi-node cluster as a Docker swarm stack:
# `./build_cluster.sh deploy|update|status|down` (and the helpers check.sh
# uses for `test`).
#
# The cluster (head node with slurmctld, N workers with slurmd, Docker,
# sandbox-runner and the root sandbox-agent, a user node with JupyterLab,
# one shared home) runs as a swarm stack: on several machines, or as
# several containers on this one for the tests. Everything is generated
# from one description, cluster.toml
# (DELEGATE_CLUSTER_CONF=file to use another one), into
# $DELEGATE_STACK_DIR/generated/.
#   ./build_cluster.sh deploy [--workers N]   build what is missing, deploy
#   ./build_cluster.sh status                 services, sinfo, Jupyter URL
#   ./build_cluster.sh test                   the instructor's check (check.sh)
#   ./build_cluster.sh update [--workers N]   rebuild images, regenerate, restart
#   ./build_cluster.sh down                   remove the stack (homes stay)
# The actions are stack_deploy, stack_update, stack_status and stack_down.
#
# Sourced by build_cluster.sh after common.sh and local.sh (never run by
# itself). Needs from common.sh: log, warn, die, wait_for, need_root,
# docker_ok, MARKER, T0; from local.sh: local_build_images (the base and
# sandbox images are the same as the single-machine cluster's); from
# build_cluster.sh: REPO, the settings (DELEGATE_*) and STACK_WORKERS_ARG
# (set by its argument parsing from --workers).

# --workers N from the command line (empty: cluster.toml's number).
STACK_WORKERS_ARG=

# --- settings
# stack_load_config: apply --workers to the settings (cluster.toml, loaded
# at start, loaded again with it: delegate-deploy's schema checks every
# setting), and set the names every other function
# uses: STACK (the swarm stack's name), STACK_GEN, STACK_SECRETS,
# STACK_FILE, STACK_SWARM_MARK.
stack_load_config() {
    if [[ -n $STACK_WORKERS_ARG ]]; then
        # (the settings' schema decides what a worker count may be, as for
        # cluster.toml's: the environment wins over the file)
        export DELEGATE_STACK_WORKERS=$STACK_WORKERS_ARG
        settings_load
    fi
    elastic_load_config
    STACK=$DELEGATE_STACK_NAME
    STACK_GEN=$DELEGATE_STACK_DIR/generated
    STACK_SECRETS=$DELEGATE_STACK_DIR/secrets
    STACK_FILE=$STACK_GEN/delegate-stack.yml
    STACK_SWARM_MARK=$DELEGATE_STACK_DIR/swarm-initialized-by-delegate
    stack_worker_ids
}

# Slurm's states of a worker that is up and takes jobs (sinfo %T).
STACK_NODE_UP='(idle|mixed|allocated|completing)'

# stack_worker_ids: what delegate-deploy's `placement` decides from the
# settings and the machines `machine add` labelled: STACK_WORKER_IDS, the
# numbers of the workers there are (1..N; placement: those of the machines
# within the slots), STACK_SLOTS, how many Slurm knows (placement:
# DELEGATE_STACK_SLOTS, at least N, each FUTURE until its machine runs it;
# else N), STACK_REPLICAS (each worker service's, unless elastic) and
# STACK_PLACEMENT_SAYS
# (its refuse/warn/log lines for a deploy: machines_placed).
stack_worker_ids() {
    local machines key rest
    machines=$(mktemp -p "$BC_TMP")
    machine_workers >"$machines" 2>/dev/null || true
    STACK_WORKER_IDS=() STACK_REPLICAS="" STACK_PLACEMENT_SAYS=""
    while read -r key rest; do
        case $key in
            slots) STACK_SLOTS=$rest ;;
            workers) read -r -a STACK_WORKER_IDS <<<"$rest" ;;
            replicas) STACK_REPLICAS=$rest ;;
            *) STACK_PLACEMENT_SAYS+="$key $rest"$'\n' ;;
        esac
    done < <(deploy_value placement --machines "$machines")
    rm -f "$machines"
    [[ -n ${STACK_SLOTS:-} ]] || die "delegate-deploy placement gave no slots"
}

# stack_replicas: "r1 r2 ...", the replicas of each worker service:
# placement's (stack_worker_ids); elastic: what elastic_replicas says.
stack_replicas() {
    if [[ -n $STACK_REPLICAS ]]; then
        echo "$STACK_REPLICAS"
    else
        elastic_replicas
    fi
}

# --- helpers: containers of a service, exec in them
# stack_cid SERVICE: where its running container is: its id on this engine
# (the one of the task swarm wants running: while swarm rolls a service
# onto a new spec, the old container may still run: it is never chosen,
# else the first running), or ID@SSH-TARGET for a task on another machine
# (placement: the machine `machine add` labelled delegate.ssh, reached
# over ssh). Empty when none runs. stack_exec and stack_exec_as take both.
stack_cid() {
    local want c t
    want=$(docker service ps -q --no-trunc --filter desired-state=running "${STACK}_$1" 2>/dev/null)
    while read -r c t; do
        [[ -n $c ]] || continue
        if [[ -z $want ]] || grep -qxF "$t" <<<"$want"; then
            echo "$c"; return 0
        fi
    done < <(docker ps --filter "label=com.docker.swarm.service.name=${STACK}_$1" --filter status=running \
        --format '{{.ID}} {{.Label "com.docker.swarm.task.id"}}')
    [[ $DELEGATE_STACK_PLACEMENT == 1 ]] || return 0
    local node self target
    self=$(docker info -f '{{.Swarm.NodeID}}')
    for t in $want; do
        node=$(docker inspect -f '{{.NodeID}}' "$t" 2>/dev/null) || continue
        [[ -n $node && $node != "$self" ]] || continue
        target=$(docker node inspect -f '{{index .Spec.Labels "delegate.ssh"}}' "$node" 2>/dev/null) || continue
        [[ -n $target ]] || continue
        c=$(machine_ssh "$target" docker ps -q --filter "label=com.docker.swarm.task.id=$t" --filter status=running </dev/null) \
            || continue
        [[ -n $c ]] && { echo "$c@$target"; return 0; }
    done
    return 0
}

# stack_docker_exec WHERE [OPTION...] -- CMD...: `docker exec OPTION...
# ID CMD...` for WHERE as stack_cid prints it: here, or on its machine
# over ssh (the words quoted for the remote shell; standard input passed).
stack_docker_exec() {
    local where=$1
    shift
    local -a opts=()
    while (($#)) && [[ $1 != -- ]]; do opts+=("$1"); shift; done
    shift
    if [[ $where == *@* ]]; then
        machine_ssh "${where#*@}" "$(printf '%q ' docker exec "${opts[@]}" "${where%%@*}" "$@")"
    else
        docker exec "${opts[@]}" "$where" "$@"
    fi
}

# stack_service_settled SERVICE: swarm has rolled SERVICE onto the spec it
# has now: no update under way, every task it wants running runs with the
# service's current container spec, and no task it wants gone still runs
# (`docker stack deploy` and `service update` return before the rollout:
# checks made meanwhile would meet the old containers).
stack_service_settled() {
    local svc=${STACK}_$1 state spec want t have
    state=$(docker service inspect -f '{{if .UpdateStatus}}{{.UpdateStatus.State}}{{end}}' "$svc" 2>/dev/null) \
        || return 1
    [[ -z $state || $state == completed || $state == rollback_completed ]] || return 1
    # What a deploy or a forced update changes (the service's spec has
    # defaults filled in that its tasks' copies lack: not the whole spec).
    local fields='{{.Image}} {{json .Args}} {{json .Env}} {{json .Secrets}} {{json .Configs}} {{json .Mounts}}'
    spec=$(docker service inspect -f "{{with .Spec.TaskTemplate.ContainerSpec}}$fields{{end}} {{.Spec.TaskTemplate.ForceUpdate}}" "$svc") \
        || return 1
    want=$(docker service ps -q --no-trunc --filter desired-state=running "$svc" 2>/dev/null | sort)
    for t in $want; do
        [[ $(docker inspect --type task -f "{{.Status.State}} {{with .Spec.ContainerSpec}}$fields{{end}} {{.Spec.ForceUpdate}}" "$t" 2>/dev/null) \
            == "running $spec" ]] || return 1
    done
    # No task swarm wants gone is still running (on any node of the swarm).
    have=$(docker service ps --format '{{.DesiredState}} {{.CurrentState}}' "$svc" 2>/dev/null) || return 1
    ! grep -Eq '^(Shutdown|Remove|Complete|Orphaned) Running' <<<"$have"
}

# stack_settled: every service of the stack is settled.
stack_settled() {
    local svc
    for svc in $(docker stack services --format '{{.Name}}' "$STACK" 2>/dev/null); do
        stack_service_settled "${svc#"${STACK}"_}" || return 1
    done
}
# stack_exec SERVICE CMD...: run as root in the service's container.
stack_exec() {
    local svc=$1 cid; shift
    cid=$(stack_cid "$svc")
    [[ -n $cid ]] || { warn "service ${STACK}_$svc has no running container"; return 1; }
    stack_docker_exec "$cid" -i -- "$@"
}
# stack_exec_as USER SERVICE CMD...: run as USER, in their home, in the
# service's container; on the user node with their own Slurm configuration
# (it names their own munged, as the hub's servers and login shells have it).
stack_exec_as() {
    local u=$1 svc=$2 cid conf=(); shift 2
    cid=$(stack_cid "$svc")
    [[ -n $cid ]] || { warn "service ${STACK}_$svc has no running container"; return 1; }
    [[ $svc == user ]] && conf=(-e "SLURM_CONF=/etc/slurm/users/$u/slurm.conf")
    [[ ${STACK_EXEC_TTY:-0} == 1 ]] && conf+=(-t)
    stack_docker_exec "$cid" -i -u "$u" -w "$DELEGATE_STACK_HOME/$u" \
        -e HOME="$DELEGATE_STACK_HOME/$u" -e USER="$u" -e LOGNAME="$u" "${conf[@]}" -- "$@"
}

# --- preflight: clear errors for what is missing
# stack_preflight: the docker CLI, an answering engine, 4 GiB free for images.
stack_preflight() {
    command -v docker >/dev/null || die "docker not found: install docker.io (apt-get install docker.io)"
    docker_ok || die "the Docker engine does not answer ('docker info' fails): start dockerd"
    local root avail
    root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)
    avail=$(df -Pk "$root" 2>/dev/null | awk 'NR == 2 {print int($4 / 1024 / 1024)}')
    if [[ -n $avail ]] && ((avail < 4)); then
        die "only ${avail} GiB free under $root; the images need about 4 GiB"
    fi
}

# stack_port_check: the Jupyter port must be free, unless our own stack
# already publishes it.
stack_port_check() {
    local p=$DELEGATE_JUPYTER_PORT
    if docker service inspect "${STACK}_user" >/dev/null 2>&1; then return 0; fi
    if ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then
        die "port $p (DELEGATE_JUPYTER_PORT) is already in use on this host:
$(ss -Hltnp "sport = :$p" 2>/dev/null)
       Set DELEGATE_JUPYTER_PORT in cluster.toml to a free port."
    fi
}

# stack_swarm [ADDR]: this engine is a swarm manager; an inactive engine
# becomes a single-manager swarm advertising ADDR (default: the engine's
# choice), recorded in STACK_SWARM_MARK so `down` leaves it.
stack_swarm() {
    local state want=${1:-}
    state=$(docker info --format '{{.Swarm.LocalNodeState}}')
    case $state in
        active)
            [[ $(docker info --format '{{.Swarm.ControlAvailable}}') == true ]] \
                || die "this Docker engine is a swarm worker; run build_cluster.sh on a manager"
            log "swarm: active" ;;
        inactive)
            log "swarm: initializing a single-manager swarm on this host${want:+ (address $want)}"
            # Recorded, so `down` leaves the swarm again (and only then).
            if ! docker swarm init ${want:+--advertise-addr "$want"} >/dev/null 2>&1; then
                local addr
                addr=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
                docker swarm init --advertise-addr "${addr:-127.0.0.1}" >/dev/null \
                    || die "docker swarm init failed (try: docker swarm init --advertise-addr <this host's IP>)"
            fi
            install -d -m 0755 "$DELEGATE_STACK_DIR"
            date >"$STACK_SWARM_MARK" ;;
        *) die "swarm state is '$state'; fix it first (docker info, docker swarm leave --force)" ;;
    esac
}

# --- the agents' staging directories
# stack_staging_up: DELEGATE_STACK_STAGING becomes a shared mount point
# (a bind mount of itself, rshared) with one root-only subdirectory per
# worker. Each worker binds its own at /run/delegate/jobs with rshared
# propagation (the stack file), so the bind mount the worker's agent makes
# there for a running job propagates to the host, where the host's engine
# (given the host path, policy staging_host_dir) mounts it into the sandbox.
# Idempotent.
stack_staging_up() {
    local d=$DELEGATE_STACK_STAGING i prop
    install -d -o root -g root -m 0755 "$d"
    if ! mountpoint -q "$d"; then
        mount --bind "$d" "$d" || die "cannot bind-mount $d onto itself"
    fi
    prop=$(findmnt -n -o PROPAGATION --mountpoint "$d")
    if [[ $prop != shared* ]]; then
        mount --make-rshared "$d" || die "cannot make $d a shared mount"
    fi
    for ((i = 1; i <= DELEGATE_STACK_WORKERS; i++)); do
        install -d -o root -g root -m 0700 "$d/worker$i"
    done
    log "staging: $d is a shared mount ($(findmnt -n -o PROPAGATION --mountpoint "$d")), one directory per worker"
}

# stack_staging_down: unmount what is left under DELEGATE_STACK_STAGING (a
# job's pin left by a killed worker) and the shared mount itself; remove
# the directories. Idempotent.
stack_staging_down() {
    local d=$DELEGATE_STACK_STAGING m
    [[ -d $d ]] || return 0
    # Deepest first: the job pins, then the shared mount point.
    for m in $(findmnt -n -r -o TARGET | grep -E "^$d(/|$)" | sort -r); do
        umount -l "$m" 2>/dev/null || warn "down: cannot unmount $m"
    done
    find "$d" -mindepth 1 -maxdepth 2 -type d -empty -delete 2>/dev/null || true
    rmdir "$d" 2>/dev/null || warn "down: $d is not empty; left in place"
    mountpoint -q "$d" 2>/dev/null && warn "down: $d is still a mount point"
    return 0
}

# --- secrets
# stack_secrets: the munge key (generated once) under STACK_SECRETS; the
# hub's secrets (hub.sh).
stack_secrets() {
    install -d -m 0700 "$STACK_SECRETS"
    if [[ ! -s $STACK_SECRETS/munge.key ]]; then
        log "munge: generating the cluster's key $STACK_SECRETS/munge.key"
        (umask 077; dd if=/dev/urandom of="$STACK_SECRETS/munge.key.tmp" bs=1024 count=1 status=none)
        mv "$STACK_SECRETS/munge.key.tmp" "$STACK_SECRETS/munge.key"
    fi
    # (the single JupyterLab's token of before the hub is no more)
    rm -f "$STACK_SECRETS/jupyter-token" "$STACK_SECRETS/jupyter-token.generated"
    # The hub's certificate and the accounts' password hashes (hub.sh).
    hub_secrets
}

# --- generated files
# stack_generate: every generated file, from the one description
# (cluster.toml): slurm.conf, gres.conf, policy.toml, the lockdown's
# job_submit.lua, plugstack.conf and admins, accounts and the stack file, in
# STACK_GEN.
stack_generate() {
    local n=$DELEGATE_STACK_WORKERS
    install -d -m 0755 "$STACK_GEN"
    install -d -m 0755 "$DELEGATE_STACK_DIR"
    # The shared home: entered by all, listed by none (a student does not
    # learn the class's account names from it).
    install -d -m 0711 "$DELEGATE_STACK_HOME"

    # slurm.conf (slurm-conf/slurm.conf.j2: the single machine's settings
    # with the stack's controller, workers, job id range and, when elastic,
    # power saving), gres.conf and the workers' site policy (job
    # directories live in the shared home), each setting checked.
    deploy_render "$STACK_GEN/slurm.conf" slurm-conf --shape stack
    deploy_render "$STACK_GEN/gres.conf" gres-conf --shape stack
    deploy_render "$STACK_GEN/policy.toml" policy --shape stack

    # The lockdown (docs/security.md): slurmctld's job gate for the stack's
    # runner and home, the SPANK stack with the admin gid, and the admin
    # group ("name gid member,member" in the file `admins`: cluster.toml's
    # admins and the roster's instructors; delegate-deploy checks them).
    local agroup agid
    deploy_render "$STACK_GEN/admins" stack-admins --roster-state "$(hub_roster_file)"
    read -r agroup agid _ <"$STACK_GEN/admins"
    # SlurmUser (slurm.conf: slurm) runs the elastic power programs, whose
    # `scontrol update ... requeue=1` the gate allows root and SlurmUser
    # only: its uid in the cluster image.
    local slurm_uid
    slurm_uid=$(docker run --rm --entrypoint id "$DELEGATE_CLUSTER_IMAGE" -u slurm) \
        || die "cannot read the uid of user slurm in $DELEGATE_CLUSTER_IMAGE"
    deploy_render "$STACK_GEN/job_submit.lua" gate --runner /usr/local/bin/sandbox-runner \
        --policy "$STACK_GEN/policy.toml" --admin-group "$agroup" --slurm-uid "$slurm_uid"
    deploy_render "$STACK_GEN/plugstack.conf" plugstack --plugin /usr/local/lib/delegate/delegate_lockdown.so \
        --admin-gid "$agid" --runner /usr/local/bin/sandbox-runner

    # Accounts (deploy/src/stack_accounts.rs): cluster.toml's and the
    # roster's, each name and uid once; the instructor's test accounts
    # (`test`) are not logins of the hub.
    deploy_render "$STACK_GEN/accounts" stack-accounts --roster-state "$(hub_roster_file)"
    # Who is a student (every account but the admins), decided once: the
    # user node gives each a munged and a query limit of their own.
    deploy_render "$STACK_GEN/students" stack-students --roster-state "$(hub_roster_file)"

    # The stack file: the settings (checked by delegate-deploy) and what
    # only this deploy knows: the versions of the configs and secrets (their
    # swarm names carry them), the volumes, the hub's cgroups, the replicas
    # each worker service has now.
    local cfgv keyv
    elastic_generate
    cfgv=$(cat "$STACK_GEN"/{slurm.conf,gres.conf,policy.toml,accounts,students,job_submit.lua,plugstack.conf,admins,power.sh,power-hook} | sha256sum | cut -c1-10)
    keyv=$(sha256sum <"$STACK_SECRETS/munge.key" | cut -c1-10)
    hub_cgroups
    deploy_render "$STACK_FILE" stack-file --replicas "$(stack_replicas)" \
        --config-version "$cfgv" --key-version "$keyv" --hub-version "$(hub_secrets_version)" \
        --db-version "$STACK_DBV" --db-volume "$(stack_db_volume)" --ctld-volume "$(stack_ctld_volume)" \
        --cgroup-memory "$HUB_CG_MEM" --cgroup-cpu "$HUB_CG_CPU" "${REGISTRY_FACTS[@]}"
    log "generated $STACK_GEN/{slurm.conf,gres.conf,policy.toml,accounts,students,job_submit.lua,plugstack.conf,admins,delegate-stack.yml} ($n workers)"
}

# --- images
# source_hash: one hash of the sources the cluster and user images are built
# from; the images carry it as a label, so a deploy after a code change
# rebuilds them instead of running stale binaries with new configuration.
# The sources: the workspace manifests; every top-level folder that holds a
# crate, at its top or one level down (broker/ with its crates, protocol/,
# sandbox-runner/, python/, and any crate added later); cargo's and the
# toolchain's settings when present; and what the image builds copy
# (docker/, slurm-conf/, stack/). Lint settings (rustfmt.toml,
# clippy.toml) and build_cluster.d/ go into no image and are left out.
source_hash() {
    local paths=() p top
    local -A seen=()
    for p in Cargo.toml Cargo.lock .cargo rust-toolchain rust-toolchain.toml \
             broker protocol sandbox-runner python \
             "$REPO"/*/Cargo.toml "$REPO"/*/*/Cargo.toml docker slurm-conf stack; do
        p=${p#"$REPO"/}
        top=${p%%/*}
        [[ $p == */Cargo.toml ]] && p=$top
        [[ $top == target || -n ${seen[$p]:-} || ! -e $REPO/$p ]] && continue
        seen[$p]=1
        paths+=("$p")
    done
    (cd "$REPO" && find "${paths[@]}" \
        -type f ! -path '*/target/*' ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 2>/dev/null \
        | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}

# image_is_current IMAGE HASH: the image exists and was built from HASH.
image_is_current() {
    [[ $(docker image inspect -f '{{index .Config.Labels "org.delegate.source"}}' "$1" 2>/dev/null) == "$2" ]]
}

# build_image IMAGE SRC CTX WHAT [BUILD-ARG...]: docker build of CTX's
# docker/WHAT.Dockerfile as IMAGE, labelled with the sources' hash SRC, its
# output in DELEGATE_LOG_DIR/build-WHAT-image.log; CTX is removed after.
build_image() {
    local image=$1 src=$2 ctx=$3 what=$4 a
    shift 4
    local -a args=()
    for a in "$@"; do args+=(--build-arg "$a"); done
    local blog="$DELEGATE_LOG_DIR/build-$what-image.log"
    private_logs "$DELEGATE_LOG_DIR" "build-$what-image.log"
    log "image $image: building (log $blog)"
    if ! docker build "${args[@]}" --label "org.delegate.source=$src" -t "$image" \
        -f "$ctx/docker/$what.Dockerfile" "$ctx" >"$blog" 2>&1; then
        rm -rf "$ctx"
        die "docker build of $image failed; tail:
$(tail -n 20 "$blog")"
    fi
    rm -rf "$ctx"
    STACK_IMAGES_REBUILT=1
}

# stack_build_images [force]: build the images that are missing or were
# built from other sources (all with force).
stack_build_images() {
    local force=${1:-0} ctx src
    src=$(source_hash)
    # Base and sandbox images: the single-machine functions; a sandbox
    # image built from other sources than these (e.g. by an earlier
    # checkout: its executor would be stale) is rebuilt.
    if ((force)) || ! docker image inspect "$DELEGATE_BASE_IMAGE" >/dev/null 2>&1 \
        || ! image_is_current "$DELEGATE_SANDBOX_IMAGE" "$(sandbox_source_hash)"; then
        local_build_images
    else
        log "image $DELEGATE_SANDBOX_IMAGE: present, built from these sources"
    fi
    if ((force)) || ! image_is_current "$DELEGATE_CLUSTER_IMAGE" "$src"; then
        command -v cargo >/dev/null || die "cargo not found (rustup's ~/.cargo/bin); needed to build the binaries"
        log "cargo: building the workspace (release) for the images"
        (cd "$REPO" && cargo build --release --workspace -q) || die "cargo build failed"
        ctx=$(mktemp -d -p "$BC_TMP")
        mkdir -p "$ctx/bin" "$ctx/docker" "$ctx/slurm-conf/spank"
        cp "$REPO/docker/cluster.Dockerfile" "$REPO/docker/cluster-entrypoint.sh" "$ctx/docker/"
        cp "$REPO/slurm-conf/epilog.sh" "$REPO/slurm-conf/cgroup-slice.sh" "$ctx/slurm-conf/"
        # The SPANK plugin is compiled in the image build, against the
        # image's own Slurm headers.
        cp "$REPO/slurm-conf/spank/delegate_lockdown.c" "$ctx/slurm-conf/spank/"
        cp "$REPO/target/release/delegate" "$REPO/target/release/sandbox-runner" \
            "$REPO/target/release/sandbox-agent" "$REPO/target/release/delegate-deploy" \
            "$REPO/target/release/delegate-power" "$REPO/target/release/delegate-place" "$ctx/bin/" \
            || die "target/release/{delegate,sandbox-runner,sandbox-agent,delegate-deploy,delegate-power,delegate-place} missing after cargo build"
        cp "$(command -v docker)" "$ctx/bin/docker"
        build_image "$DELEGATE_CLUSTER_IMAGE" "$src" "$ctx" cluster "BASE_IMAGE=$DELEGATE_BASE_IMAGE"
        force=1   # the user image is built on top of it
    else
        log "image $DELEGATE_CLUSTER_IMAGE: present, built from these sources ($src)"
    fi
    if ((force)) || ! image_is_current "$DELEGATE_USER_IMAGE" "$src"; then
        ctx=$(mktemp -d -p "$BC_TMP")
        mkdir -p "$ctx/docker" "$ctx/wheels"
        cp "$REPO/docker/user.Dockerfile" "$ctx/docker/"
        stack_wheels "$ctx/wheels"
        hub_context "$ctx"
        build_image "$DELEGATE_USER_IMAGE" "$src" "$ctx" user \
            "CLUSTER_IMAGE=$DELEGATE_CLUSTER_IMAGE" "HUB_PIP_PINS=$HUB_PIP_PINS"
    else
        log "image $DELEGATE_USER_IMAGE: present"
    fi
    # cloudpickle pickles for one Python (major.minor): the user node's
    # Python and the sandbox's must be the same.
    local pu ps
    wait_for 60 dockerd docker_ok >/dev/null || die "the Docker engine does not answer"
    pu=$(docker run --rm --entrypoint /opt/delegate/venv/bin/python "$DELEGATE_USER_IMAGE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    ps=$(docker run --rm --entrypoint python3 "$DELEGATE_SANDBOX_IMAGE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [[ -n $pu && $pu == "$ps" ]] || die "Python of the user image ($pu) and of the sandbox image ($ps) differ; build both from the same base"
    log "images: user and sandbox Python $pu"
}

# stack_wheels DIR: the delegate wheel (maturin) and JupyterLab's wheels,
# built/downloaded on the host (image builds have no PyPI access here).
stack_wheels() {
    # shellcheck disable=SC2153  # DELEGATE_STATE_DIR is a setting of build_cluster.sh, not a misspelled DELEGATE_STACK_DIR
    local dir=$1 venv=$DELEGATE_STATE_DIR/build-venv cache=$DELEGATE_CACHE_DIR/stack-wheels pin
    if [[ ! -x $venv/bin/maturin ]]; then
        log "wheels: creating $venv with maturin"
        { python3 -m venv "$venv" && "$venv/bin/pip" install -q "maturin>=1.8,<2"; } \
            || die "cannot install maturin into $venv"
    fi
    log "wheels: maturin build of the delegate package"
    private_logs "$DELEGATE_LOG_DIR" maturin.log
    "$venv/bin/maturin" build --release -q -m "$REPO/python/Cargo.toml" -i "$venv/bin/python" -o "$dir" \
        >"$DELEGATE_LOG_DIR/maturin.log" 2>&1 || die "maturin build failed; see $DELEGATE_LOG_DIR/maturin.log"
    pin=$(sed -n 's/.*"\(cloudpickle==[^"]*\)".*/\1/p' "$REPO/python/pyproject.toml" | head -n1)
    [[ -n $pin ]] || die "no cloudpickle pin in python/pyproject.toml"
    # Cached across runs: pip only downloads what the cache lacks.
    install -d -m 0755 "$cache"
    local -a hub
    mapfile -t hub < <(hub_versions pip)
    log "wheels: pip download jupyterlab $pin ${hub[*]} (cache $cache)"
    "$venv/bin/pip" download -q --only-binary=:all: -d "$cache" jupyterlab "$pin" "${hub[@]}" \
        || die "pip download of jupyterlab/$pin/${hub[*]} failed"
    # CFiddle: the same pins as the sandbox image (user.Dockerfile installs them).
    "$venv/bin/pip" download -q --no-deps --only-binary=:all: -d "$cache" -r "$REPO/python/requirements-cfiddle.txt" \
        || die "pip download of python/requirements-cfiddle.txt failed"
    cp "$REPO/python/requirements-cfiddle.txt" "$dir/"
    cp "$cache"/*.whl "$dir/"
}

# --- waiting
# stack_services_running: head, user and every worker have a running
# container.
stack_services_running() {
    local svc want up=0 always=(head dbd db user) i
    for i in "${STACK_WORKER_IDS[@]}"; do
        elastic_always_on "$i" && always+=("worker$i")
    done
    elastic_on && [[ -z $DELEGATE_POWER_HOOK ]] && always+=(power)
    want=${#always[@]}
    for svc in "${always[@]}"; do
        [[ -n $(stack_cid "$svc") ]] && up=$((up + 1))
    done
    ((up == want))
}
# stack_nodes_idle: Slurm on the head says every worker is up and takes
# jobs: idle, or running jobs already (a redeploy while students' jobs wait:
# they start as soon as the workers are back); elastic: the always-on ones
# so, the others so or powered down ("idle~").
stack_nodes_idle() {
    local out up=$STACK_NODE_UP
    out=$(stack_exec head sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
    if elastic_on; then
        # The always-on ones up, the others powered down ("idle~").
        local i want=0
        for ((i = 1; i <= DELEGATE_STACK_WORKERS; i++)); do
            if elastic_always_on "$i"; then
                grep -Eqx "worker$i $up" <<<"$out" && want=$((want + 1))
            elif grep -qx "worker$i idle~" <<<"$out"; then
                want=$((want + 1))
            elif grep -Eqx "worker$i $up" <<<"$out" \
                && [[ $(docker service inspect -f '{{.Spec.Mode.Replicated.Replicas}}' "${STACK}_worker$i" 2>/dev/null) == 1 ]]; then
                want=$((want + 1))   # started by Slurm, kept by this deploy
            fi
        done
        ((want == DELEGATE_STACK_WORKERS))
    else
        local i
        for i in "${STACK_WORKER_IDS[@]}"; do
            grep -Eqx "worker$i $up" <<<"$out" || return 1
        done
    fi
}
# stack_wait: wait (up to DELEGATE_STACK_WAIT each) for every service, every
# worker idle (resuming drained ones once) and JupyterLab answering.
stack_wait() {
    wait_for "$DELEGATE_STACK_WAIT" "stack: every service rolled onto its current spec" stack_settled \
        || die "swarm has not finished rolling the services onto their new spec after ${DELEGATE_STACK_WAIT}s:
$(docker stack ps --no-trunc "$STACK" 2>&1 | head -n 30)
       Run the same command again once \`docker stack ps $STACK\` shows every task running."
    wait_for "$DELEGATE_STACK_WAIT" "stack: every service that runs all the time" stack_services_running \
        || die "not every service runs after ${DELEGATE_STACK_WAIT}s:
$(docker stack ps --no-trunc "$STACK" 2>&1 | head -n 30)"
    local deadline=$((SECONDS + DELEGATE_STACK_WAIT)) resumed=0 reset=0
    until stack_nodes_idle; do
        # Elastic workers left up or DOWN in Slurm's saved state (every
        # 10 s: a restarting head may recover them so once more).
        if ((SECONDS >= reset)); then
            elastic_reset_nodes || true
            reset=$((SECONDS + 10))
        fi
        if ((SECONDS > deadline)); then
            die "not every worker is up in Slurm after ${DELEGATE_STACK_WAIT}s:
$(stack_exec head sinfo -N -l 2>&1)
$(docker service logs --tail 15 "${STACK}_head" 2>&1)"
        fi
        # A worker that was DOWN (a restart) comes back by itself
        # (ReturnToService=2); a drained one needs a resume, once.
        if ((resumed == 0)) && stack_exec head sinfo -h -N -o '%T' 2>/dev/null | grep -q '^drain'; then
            # shellcheck disable=SC2016  # $(...) is for the head node's shell
            stack_exec head sh -c 'scontrol update nodename=$(sinfo -h -N -t drain -o %N | paste -sd,) state=resume' || true
            resumed=1
        fi
        sleep 2
    done
    # (once more: a powered-down worker that Slurm's saved state has "not
    # responding" passes stack_nodes_idle, but is never started)
    elastic_reset_nodes || true
    log "stack: all $DELEGATE_STACK_WORKERS workers up in Slurm"
    # JupyterHub takes a few seconds more to listen.
    wait_for "$DELEGATE_STACK_WAIT" "stack: JupyterHub" hub_answers \
        || die "JupyterHub does not answer in the user node after ${DELEGATE_STACK_WAIT}s:
$(docker service logs --tail 20 "${STACK}_user" 2>&1)"
}

# --- actions
# stack_deploy: `deploy`, build the images that are missing or stale, make
# this engine a swarm manager, generate the files, `docker stack deploy`,
# restart services whose images were rebuilt, wait until all is ready and
# print the JupyterLab URL. STACK_FORCE_BUILD=1 rebuilds every image,
# STACK_RESTART=1 restarts every service (both set by stack_update).
stack_deploy() {
    need_root deploy
    stack_load_config
    install -d -m 0755 "$DELEGATE_STATE_DIR" "$DELEGATE_CACHE_DIR"
    private_logs "$DELEGATE_LOG_DIR"
    stack_preflight
    stack_port_check
    local existed=0
    docker stack services "$STACK" >/dev/null 2>&1 && existed=1
    STACK_IMAGES_REBUILT=0
    stack_build_images "${STACK_FORCE_BUILD:-0}"
    stack_swarm ""   # (the engine picks the address)
    machines_placed
    registry_publish
    stack_secrets
    stack_accounting_prepare "${STACK_FORCE_BUILD:-0}"
    stack_generate
    # (on real machines, `machine add` made each worker machine's)
    [[ $DELEGATE_STACK_PLACEMENT == 1 ]] || stack_staging_up
    log "stack: docker stack deploy $STACK ($DELEGATE_STACK_WORKERS workers)"
    # (without the engine's four-line warning, per service, that local
    # images have no registry digest: every node but the workers' machines
    # is this engine)
    (cd "$STACK_GEN" && docker "${REGISTRY_CLIENT[@]}" stack deploy "${REGISTRY_DEPLOY[@]}" \
        --prune -c "$STACK_FILE" "$STACK" 2>&1 \
        | grep -v -e 'could not be accessed on a registry' -e '^its digest\. Each node will access' \
            -e '^possibly leading to different nodes' -e '^versions of the image\.$' -e '^$') || true
    docker stack services "$STACK" >/dev/null 2>&1 || die "docker stack deploy failed"
    if ((${STACK_RESTART:-0} || (existed && STACK_IMAGES_REBUILT))); then
        # Same tags, new images: swarm does not notice without a registry.
        local svc
        for svc in $(docker stack services -q "$STACK"); do
            docker service update -q --force "$svc" >/dev/null 2>&1 || warn "restart of service $svc failed"
        done
    fi
    stack_wait
    stack_new_deployment
    stack_accounting_setup
    log "deploy: done in $((SECONDS - T0)) s. JupyterHub (each student's own JupyterLab): $(hub_url)"
}

# stack_new_deployment: forget the workers' recorded classes (their Slurm
# comments, kept on the head's state volume): each agent records the class
# it finds next as this deployment's, and `delegate admin nodes` names a
# later change as drift.
stack_new_deployment() {
    local w i up="\$2 !~ /[~]|down|drain|fail/"
    # shellcheck disable=SC2016  # $(...) is for the head node's shell
    stack_exec head sh -c 'scontrol update nodename=$(sinfo -h -N -o %N | sort -u | paste -sd,) comment=' \
        || { warn "cannot clear the workers' comments: drift is counted from an earlier deployment"; return 0; }
    # Each running agent records its class as this deployment's now (it
    # publishes every 30 s anyway); powered-down workers at their start.
    for w in $(stack_exec head sinfo -h -N -O 'NodeList:|,StateLong:|' | awk -F'|' "$up { print \$1 }" | sort -u); do
        stack_exec "$w" pkill -HUP -x sandbox-agent || true
    done
    for ((i = 0; i < 20; i++)); do
        stack_exec head sinfo -h -N -O 'NodeList:|,StateLong:|,Comment:|' \
            | awk -F'|' "$up && \$3 !~ /^delegate class=/ { n++ } END { exit n > 0 }" && return 0
        sleep 2
    done
    warn "not every worker recorded its class yet (see delegate admin nodes)"
}

# stack_update: `update`, a deploy that rebuilds every image and restarts
# every service.
stack_update() {
    STACK_FORCE_BUILD=1 STACK_RESTART=1 stack_deploy
}

# stack_shell: `shell USER`, a login shell as USER on the user node, as the
# hub's terminal gives them (their home, their own Slurm configuration).
stack_shell() {
    need_root shell
    stack_load_config
    local u=${STACK_SHELL_USER:-}
    [[ $u =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || die "'$u' is not a user name"
    STACK_EXEC_TTY=0
    [[ -t 0 ]] && STACK_EXEC_TTY=1
    stack_exec_as "$u" user bash -l
}

# stack_deployed_workers: for status/test, set DELEGATE_STACK_WORKERS to the
# number of workers deployed (a deploy --workers N may differ from
# cluster.toml), unless --workers was given.
stack_deployed_workers() {
    local n
    n=$(docker service ls --format '{{.Name}}' --filter "label=com.docker.stack.namespace=$STACK" 2>/dev/null \
        | grep -c "^${STACK}_worker[0-9]*$" || true)
    if [[ $DELEGATE_STACK_PLACEMENT == 1 ]] && ! elastic_on; then
        # (a service per slot: the machines are the workers)
        DELEGATE_STACK_WORKERS=${#STACK_WORKER_IDS[@]}
    elif [[ -z $STACK_WORKERS_ARG && ${n:-0} -gt 0 ]]; then
        DELEGATE_STACK_WORKERS=$n
        mapfile -t STACK_WORKER_IDS < <(seq 1 "$n")
    fi
}

# stack_status: `status` (also without --stack when a stack is deployed
# here): services, tasks, sinfo, squeue, the JupyterLab URL and accounts.
stack_status() {
    stack_load_config
    stack_deployed_workers
    if ! docker stack services "$STACK" >/dev/null 2>&1 || [[ -z $(docker stack services -q "$STACK" 2>/dev/null) ]]; then
        echo "stack $STACK: not deployed"; return 0
    fi
    docker stack services "$STACK"
    echo
    # (no PORTS column: a host-mode port shows once per address family)
    docker stack ps --filter desired-state=running \
        --format 'table {{.Name}}\t{{.Image}}\t{{.CurrentState}}\t{{.Error}}' "$STACK" 2>&1 || true
    echo
    stack_exec head sinfo -N -l 2>&1 || true
    stack_exec head squeue 2>&1 || true
    echo
    echo "Power state of the workers ($(elastic_on && echo "elastic: $DELEGATE_ELASTIC_MIN..$DELEGATE_ELASTIC_MAX workers, stopped after ${DELEGATE_ELASTIC_IDLE}s idle" || echo "elastic off: always on")):"
    elastic_power_states
    echo
    stack_agents_status
    echo
    stack_accounting_status
    echo
    echo "JupyterHub (each student's own JupyterLab): $(hub_url)"
    echo "  log in with a course account; initial passwords: $STACK_SECRETS/initial-passwords (root only)"
    echo "shared home: $DELEGATE_STACK_HOME   accounts: $(hub_all_names | paste -sd ' ' -)"
}

# stack_agents_status: one line per worker: its root agent's pid, whether
# it answers the probe (as nobody), the last line of its log.
stack_agents_status() {
    local i w pid probe last
    for i in "${STACK_WORKER_IDS[@]}"; do
        w=worker$i
        if ! elastic_always_on "$i" && [[ -z $(stack_cid "$w") ]]; then
            echo "$w: not running (powered down; Slurm starts it when a job needs it)"
            continue
        fi
        pid=$(stack_exec "$w" pgrep -x sandbox-agent 2>/dev/null | paste -sd, -)
        if stack_exec "$w" runuser -u nobody -- /usr/local/bin/sandbox-runner probe >/dev/null 2>&1; then
            probe="answers"
        else
            probe="does NOT answer"
        fi
        last=$(stack_exec "$w" tail -n 1 /var/log/delegate/agent.log 2>/dev/null | cut -c1-120)
        echo "$w: sandbox-agent pid ${pid:-none}, $probe the probe; log: ${last:-empty}"
    done
}

# stack_leftovers: what of the stack is left on this engine, one "kind id"
# line each (empty when nothing).
stack_leftovers() {
    local l="label=com.docker.stack.namespace=$STACK"
    docker ps -aq --filter "$l" | sed 's/^/container /'
    docker network ls -q --filter "$l" | sed 's/^/network /'
    docker volume ls -q --filter "$l" | sed 's/^/volume /'
    if [[ $(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null) == active ]]; then
        docker service ls -q --filter "$l" | sed 's/^/service /'
        docker config ls -q --filter "$l" | sed 's/^/config /'
        docker secret ls -q --filter "$l" | sed 's/^/secret /'
    fi
}

# stack_down: `down`, remove the stack, wait until its containers and
# networks are gone, remove leftover sandboxes of its jobs, leave the swarm
# when this script created it and nothing else runs in it; die when
# anything of the stack is left. Images, the home and the secrets stay.
stack_down() {
    need_root down
    stack_load_config
    if [[ $(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null) == active ]] \
        && [[ -n $(docker stack services -q "$STACK" 2>/dev/null) ]]; then
        log "down: docker stack rm $STACK"
        docker stack rm "$STACK" >/dev/null
    else
        log "down: stack $STACK is not deployed"
    fi
    # Removal is asynchronous: wait until containers and network are gone.
    wait_for 90 "down: containers and networks of $STACK removed" \
        bash -c "[[ -z \$(docker ps -aq --filter label=com.docker.stack.namespace=$STACK; docker network ls -q --filter label=com.docker.stack.namespace=$STACK) ]]" \
        || warn "some containers/networks of $STACK are still being removed"
    # Sandboxes of the stack's jobs (their Slurm ids start at FirstJobId).
    local c id
    for c in $(docker ps -aq --filter label=delegate.slurm-job); do
        # (a sandbox of another cluster on this engine, the single
        # machine's, may be gone between the list and this look)
        id=$(docker inspect -f '{{index .Config.Labels "delegate.slurm-job"}}' "$c" 2>/dev/null) || continue
        id=${id%%_*}
        if [[ $id =~ ^[0-9]+$ ]] && ((id >= DELEGATE_STACK_FIRST_JOB_ID)); then
            if docker rm -f "$c" >/dev/null 2>&1; then
                log "down: removed leftover sandbox $c (Slurm job $id)"
            fi
        fi
    done
    stack_staging_down
    stack_accounting_down
    hub_cgroups_down
    registry_down
    if [[ -f $STACK_SWARM_MARK ]]; then
        if [[ -z $(docker service ls -q 2>/dev/null) ]]; then
            log "down: leaving the swarm this script initialized"
            docker swarm leave --force >/dev/null || warn "docker swarm leave failed"
            # The bridge swarm created for its containers' outside traffic.
            docker network rm docker_gwbridge >/dev/null 2>&1 || true
            rm -f "$STACK_SWARM_MARK"
        else
            warn "down: other services run in the swarm; it is left active"
        fi
    fi
    local left
    left=$(stack_leftovers)
    [[ -z $left ]] || die "down: left behind:
$left"
    log "down: nothing of stack $STACK is left (images, $DELEGATE_STACK_HOME and $STACK_SECRETS are kept)"
}

# shellcheck shell=bash
# build_cluster.d/stack_accounting.sh -- Slurm accounting in the swarm
# stack: the database service "db" (Debian's MariaDB in an image built
# here, docker/db.Dockerfile; its data on a named volume `down` keeps),
# slurmdbd in its own service "dbd" (the cluster image), slurmctld's state
# on a volume, and the course's account, QOS and associations.
#
# slurm.conf's accounting, priority and QOS settings are --local's
# (slurm-conf/slurm.conf.j2, rendered by delegate-deploy), slurmdbd.conf comes
# from the same generator (slurmdbd_conf), and the course setup from the
# same functions (accounting_cluster, accounting_course, add_association in
# accounting.sh), run through `docker exec` in the head's container.
#
# Sourced by build_cluster.sh after common.sh, local.sh, accounting.sh and
# stack.sh (never run by itself). What stack.sh calls:
#   stack_accounting_prepare   deploy, before stack_generate: the database
#                              image, the secrets (db-password,
#                              slurmdbd.conf), the database's volume
#   stack_accounting_setup     deploy, once the stack runs: the cluster,
#                              the course account, the student QOS, an
#                              association per account of the stack's
#                              accounts file, admins as coordinators
#   stack_accounting_status    status: the course's associations
#   stack_accounting_down      down: names the volumes it keeps
# Needs from common.sh: log, warn, die, wait_for, MARKER and the accounting
# settings (DELEGATE_DB_NAME, DELEGATE_DBD_PORT, DELEGATE_COURSE_ACCOUNT,
# DELEGATE_STUDENT_QOS, DELEGATE_QOS_*); from accounting.sh: slurmdbd_conf,
# SACCTMGR, sacctmgr_q, accounting_cluster, accounting_course,
# add_association; from stack.sh: STACK, STACK_GEN, STACK_SECRETS,
# stack_cid, image_is_current; the settings of cluster.toml
# (DELEGATE_DB_IMAGE, DELEGATE_BASE_IMAGE).

# stack_db_volume, stack_ctld_volume: the names of the database's volume
# and of slurmctld's StateSaveLocation (both outlive the stack).
stack_db_volume() { echo "${STACK}-accounting-db"; }
stack_ctld_volume() { echo "${STACK}-slurmctld-state"; }

# stack_db_image_hash: hash of what the database image is built from.
stack_db_image_hash() {
    (cd "$REPO" && cat docker/db.Dockerfile docker/db-entrypoint.sh | sha256sum | cut -c1-16)
}

# stack_build_db_image [force]: docker/db.Dockerfile on the base image,
# when missing or built from other sources.
stack_build_db_image() {
    local force=${1:-0} src ctx
    src=$(stack_db_image_hash)
    if ((force == 0)) && image_is_current "$DELEGATE_DB_IMAGE" "$src"; then
        log "image $DELEGATE_DB_IMAGE: present"
        return 0
    fi
    ctx=$(mktemp -d -p "$BC_TMP")
    mkdir -p "$ctx/docker"
    cp "$REPO/docker/db.Dockerfile" "$REPO/docker/db-entrypoint.sh" "$ctx/docker/"
    build_image "$DELEGATE_DB_IMAGE" "$src" "$ctx" db "BASE_IMAGE=$DELEGATE_BASE_IMAGE"
}

# stack_accounting_secrets: slurmdbd's database password (generated once)
# and slurmdbd.conf with it, both root-only files under STACK_SECRETS that
# become swarm secrets (the db and dbd services only); sets STACK_DBV (a
# hash of both, in the secrets' names).
stack_accounting_secrets() {
    local pass tmp
    if [[ ! -s $STACK_SECRETS/db-password ]]; then
        log "accounting: generating the database password $STACK_SECRETS/db-password"
        (umask 077; od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$STACK_SECRETS/db-password.tmp")
        mv "$STACK_SECRETS/db-password.tmp" "$STACK_SECRETS/db-password"
    fi
    pass=$(cat "$STACK_SECRETS/db-password")
    [[ $pass =~ ^[A-Za-z0-9]{16,200}$ ]] || die "$STACK_SECRETS/db-password must be 16+ letters and digits"
    tmp=$(mktemp -p "$BC_TMP")
    # The database listens on 3306 of its own container (docker/db-entrypoint.sh).
    DELEGATE_DB_PORT=3306 slurmdbd_conf slurm "" dbd db "$pass" /var/log/delegate /run/slurmdbd \
        "for the stack $STACK: service dbd, database in service db ($(stack_db_volume) volume)" >"$tmp"
    if ! cmp -s "$tmp" "$STACK_SECRETS/slurmdbd.conf" 2>/dev/null; then
        install -m 0600 "$tmp" "$STACK_SECRETS/slurmdbd.conf"
    fi
    rm -f "$tmp"
    # shellcheck disable=SC2034  # read by stack_generate (stack.sh)
    STACK_DBV=$(cat "$STACK_SECRETS"/{db-password,slurmdbd.conf} | sha256sum | cut -c1-10)
}

# stack_accounting_prepare [force]: before stack_generate (deploy/update).
stack_accounting_prepare() {
    [[ $DELEGATE_DB_NAME =~ ^[A-Za-z0-9_]+$ ]] || die "DELEGATE_DB_NAME must be letters, digits and _"
    stack_build_db_image "${1:-0}"
    stack_accounting_secrets
    local vol
    for vol in "$(stack_db_volume)" "$(stack_ctld_volume)"; do
        if ! docker volume inspect "$vol" >/dev/null 2>&1; then
            docker volume create --label "org.delegate.stack=$STACK" "$vol" >/dev/null \
                || die "cannot create the volume $vol"
            log "accounting: volume $vol created (kept by down)"
        fi
    done
}

# stack_sacctmgr_via_head: SACCTMGR and SLURM_CONF for accounting.sh's
# functions: sacctmgr in the head's container, the stack's slurm.conf.
stack_sacctmgr_via_head() {
    local cid; cid=$(stack_cid head)
    [[ -n $cid ]] || die "accounting: the head has no running container"
    SACCTMGR=(docker exec -i "$cid" sacctmgr)
    # shellcheck disable=SC2034  # read by cluster_name (accounting.sh)
    SLURM_CONF=$STACK_GEN/slurm.conf
}

# stack_accounting_setup: the cluster, the course account and the student
# QOS (accounting_course), then one association per account of the
# stack's accounts file ("name uid" lines; added together in one sacctmgr
# call), the admins (DELEGATE_STACK_ADMINS: the `admins` file) coordinators
# of the course account and Slurm operators. Idempotent.
stack_accounting_setup() {
    stack_sacctmgr_via_head
    wait_for "$DELEGATE_STACK_WAIT" "accounting: slurmdbd" slurmdbd_ok \
        || die "slurmdbd does not answer after ${DELEGATE_STACK_WAIT}s:
$(docker service logs --tail 15 "${STACK}_dbd" 2>&1)"
    accounting_cluster
    accounting_course
    local have missing=() name _uid m
    have=$("${SACCTMGR[@]}" -n -P show assoc where account="$DELEGATE_COURSE_ACCOUNT" format=user 2>/dev/null) \
        || die "accounting: cannot list the associations of $DELEGATE_COURSE_ACCOUNT"
    while read -r name _uid; do
        [[ -z $name || $name == \#* ]] && continue
        grep -qxF "$name" <<<"$have" || missing+=("$name")
    done <"$STACK_GEN/accounts"
    if ((${#missing[@]})); then
        local list
        printf -v list '%s,' "${missing[@]}"
        sacctmgr_q add user "${list%,}" account="$DELEGATE_COURSE_ACCOUNT" \
            defaultaccount="$DELEGATE_COURSE_ACCOUNT" grptresrunmins="cpu=$DELEGATE_QOS_MAX_CPU_RUN_MINS" \
            || die "accounting: cannot add the associations of ${missing[*]}; run the same command again to finish"
    fi
    local _g _gid members=""
    read -r _g _gid members <"$STACK_GEN/admins" || true
    for m in ${members//,/ }; do
        add_association "$m" 1 || die "accounting: cannot make $m a coordinator of $DELEGATE_COURSE_ACCOUNT"
    done
    log "accounting: $(wc -l <"$STACK_GEN/accounts") accounts in $DELEGATE_COURSE_ACCOUNT (${#missing[@]} added), coordinators: ${members:-none}"
}

# stack_accounting_status: the course's associations and the fair share.
stack_accounting_status() {
    stack_exec head sshare -a -A "$DELEGATE_COURSE_ACCOUNT" 2>&1 | head -n 40 || true
}

# stack_accounting_down: say which volumes `down` keeps: the accounting
# records and slurmctld's state (its job ids go on at the next deploy; jobs
# that were running end NODE_FAIL then, pending ones run).
stack_accounting_down() {
    local v
    for v in "$(stack_db_volume)" "$(stack_ctld_volume)"; do
        docker volume inspect "$v" >/dev/null 2>&1 && log "down: volume $v is kept (docker volume rm $v to forget it)"
    done
    return 0
}

# shellcheck shell=bash
# build_cluster.d/hub.sh -- JupyterHub on the stack's user node, and the
# stack's accounts from the instructor's roster.
#
# The user node runs JupyterHub (stack/jupyterhub_config.py): students log
# in over HTTPS with their course account (PAM), each gets their own
# JupyterLab as their own uid. This file holds what build_cluster.sh does
# for it on the host:
#   hub_context CTX          the user image's build context: the pinned
#                            JupyterHub wheels (with stack_wheels), the
#                            npm-installed configurable-http-proxy, the
#                            hub's config
#   hub_secrets              the certificate (cluster.toml's, or a
#                            self-signed one made once), every account's
#                            password hash (an initial password made once
#                            per account, written to a root-only file)
#   hub_all_names            every account's name (delegate-deploy
#                            stack-accounts: cluster.toml's and the roster's)
#   hub_url, hub_answers     the hub's URL; whether it answers in the node
#   stack_accounts_main ARGS `build_cluster.sh --stack accounts add --csv
#                            FILE [--instructors] | list | remove USER
#                            [--archive]`
# Files (host, under DELEGATE_STACK_DIR):
#   roster                      "name uid role full name,,,email" per roster
#                               account (0600); cluster.toml's accounts are
#                               not in it
#   secrets/hub-passwords       "name:sha512-crypt" (chpasswd -e), the
#                               user node's swarm secret hub_passwords
#   secrets/initial-passwords   "name password", root only (0600): the
#                               instructor hands them out
#   secrets/hub.crt, hub.key    the self-signed certificate (when
#                               cluster.toml names none)
#   hub/                        the hub's state (sqlite, cookie secret),
#                               bound into the user node; kept by update/down
#
# Sourced by build_cluster.sh after stack.sh (never run by itself). Needs
# from common.sh: log, warn, die, need_root; from accounting.sh:
# roster_rows; from stack.sh: stack_load_config, stack_deploy,
# stack_exec and what stack_load_config sets (STACK, STACK_SECRETS,
# ...); from build_cluster.sh: REPO.

# hub_versions KIND: the pinned packages of stack/hub-versions of KIND (pip
# or npm), one per line.
hub_versions() {
    awk -v k="$1" '$1 == k { print $2 }' "$REPO/stack/hub-versions"
}

# hub_context CTX: what the user image's build needs beside the wheels:
# CTX/chp (configurable-http-proxy with its node_modules, `npm install`ed on
# the host once per version into DELEGATE_CACHE_DIR) and
# CTX/stack/jupyterhub_config.py, CTX/stack/rush_page.py (the instructor's
# page), CTX/docker/keep-passwords.sh. Sets HUB_PIP_PINS (the build argument).
hub_context() {
    local ctx=$1 chp cache
    chp=$(hub_versions npm)
    [[ $chp =~ ^configurable-http-proxy@[0-9]+\.[0-9]+\.[0-9]+$ ]] \
        || die "stack/hub-versions: want one pinned 'npm configurable-http-proxy@X.Y.Z', not '$chp'"
    cache=$DELEGATE_CACHE_DIR/chp-${chp#*@}
    if [[ ! -x $cache/node_modules/.bin/configurable-http-proxy ]]; then
        if ! command -v npm >/dev/null; then
            log "hub: installing npm (Debian) to fetch $chp"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm >/dev/null \
                || die "npm not found and apt-get install npm failed: install npm to fetch $chp"
        fi
        log "hub: npm install $chp (cache $cache)"
        rm -rf "$cache.tmp"
        install -d -m 0755 "$cache.tmp"
        private_logs "$DELEGATE_LOG_DIR" npm-chp.log
        (cd "$cache.tmp" && npm install --no-audit --no-fund --omit=dev --loglevel=error "$chp" \
            >"$DELEGATE_LOG_DIR/npm-chp.log" 2>&1) \
            || die "npm install $chp failed; see $DELEGATE_LOG_DIR/npm-chp.log"
        rm -rf "$cache"
        mv "$cache.tmp" "$cache"
    fi
    cp -a "$cache" "$ctx/chp"
    mkdir -p "$ctx/stack"
    cp "$REPO/stack/jupyterhub_config.py" "$REPO/stack/rush_page.py" "$ctx/stack/"
    mkdir -p "$ctx/docker"
    cp "$REPO/docker/keep-passwords.sh" "$ctx/docker/"
    HUB_PIP_PINS=$(hub_versions pip | paste -sd ' ' -)
    [[ -n $HUB_PIP_PINS ]] || die "stack/hub-versions names no pip package"
}

# --- the roster's state
# hub_roster_file: the roster's state file.
hub_roster_file() { echo "$DELEGATE_STACK_DIR/roster"; }

# hub_all_names: every account of the stack (cluster.toml's and the
# roster's), one name per line, as the accounts config has them.
hub_all_names() {
    deploy_render /dev/stdout stack-accounts --roster-state "$(hub_roster_file)" --names
}

# --- secrets
# hub_new_password: a fresh password of 14 characters (no look-alikes).
hub_new_password() {
    local p
    p=$(head -c 96 /dev/urandom | base64 -w0 | tr -dc 'a-km-zA-HJ-NP-Z2-9')
    echo "${p:0:14}"
}

# hub_secrets: the hub's certificate and key (DELEGATE_HUB_TLS_CERT/_KEY, or
# self-signed once) in STACK_SECRETS/hub-tls.{crt,key}; the password hash of
# every account in hub-passwords (a new account gets an initial password,
# appended to the root-only initial-passwords; a removed one's lines go).
# Idempotent: the same accounts give the same files.
hub_secrets() {
    local crt=$STACK_SECRETS/hub-tls.crt key=$STACK_SECRETS/hub-tls.key host
    if [[ -n ${DELEGATE_HUB_TLS_CERT:-} ]]; then
        [[ -r $DELEGATE_HUB_TLS_CERT && -r ${DELEGATE_HUB_TLS_KEY:-} ]] \
            || die "DELEGATE_HUB_TLS_CERT/DELEGATE_HUB_TLS_KEY must both name readable files"
        openssl x509 -noout -in "$DELEGATE_HUB_TLS_CERT" 2>/dev/null || die "$DELEGATE_HUB_TLS_CERT is not a PEM certificate"
        cmp -s "$DELEGATE_HUB_TLS_CERT" "$crt" || install -m 0600 "$DELEGATE_HUB_TLS_CERT" "$crt"
        cmp -s "$DELEGATE_HUB_TLS_KEY" "$key" || install -m 0600 "$DELEGATE_HUB_TLS_KEY" "$key"
    elif [[ ! -s $crt || ! -s $key || -f $STACK_SECRETS/hub-tls.from-conf ]]; then
        host=$(hostname -f 2>/dev/null || hostname)
        log "hub: generating a self-signed certificate for $host ($crt, 10 years)"
        (umask 077; openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$host" \
            -addext "subjectAltName=DNS:$host,DNS:localhost,IP:127.0.0.1" \
            -keyout "$key.tmp" -out "$crt.tmp" 2>/dev/null) || die "openssl cannot make the hub's certificate"
        mv "$key.tmp" "$key"; mv "$crt.tmp" "$crt"
        rm -f "$STACK_SECRETS/hub-tls.from-conf"
    fi
    [[ -n ${DELEGATE_HUB_TLS_CERT:-} ]] && date >"$STACK_SECRETS/hub-tls.from-conf"

    local pw=$STACK_SECRETS/hub-passwords init=$STACK_SECRETS/initial-passwords tmp name p hash n=0
    (umask 077; touch "$pw" "$init")
    tmp=$(mktemp -p "$BC_TMP")
    for name in $(hub_all_names); do
        hash=$(awk -F: -v n="$name" '$1 == n { print $2; exit }' "$pw")
        if [[ -z $hash ]]; then
            p=$(hub_new_password)
            [[ ${#p} -eq 14 ]] || die "cannot make a password for $name"
            hash=$(printf '%s\n' "$p" | openssl passwd -6 -stdin) || die "openssl cannot hash a password"
            printf '%s %s\n' "$name" "$p" >>"$init"
            n=$((n + 1))
        fi
        printf '%s:%s\n' "$name" "$hash" >>"$tmp"
    done
    if ! cmp -s "$tmp" "$pw"; then
        install -m 0600 "$tmp" "$pw"
    fi
    rm -f "$tmp"
    # initial-passwords keeps the accounts that still exist.
    awk 'NR == FNR { keep[$1] = 1; next } keep[$1]' <(hub_all_names) "$init" >"$init.tmp"
    cmp -s "$init.tmp" "$init" || cat "$init.tmp" >"$init"
    rm -f "$init.tmp"
    chmod 0600 "$init"
    ((n)) && log "hub: initial passwords of $n new account(s) written to $init (root only)"
    install -d -m 0700 "$DELEGATE_STACK_DIR/hub"
    return 0
}

# hub_secrets_version: a hash of the hub's secrets (their swarm names).
hub_secrets_version() {
    cat "$STACK_SECRETS"/{hub-passwords,hub-tls.crt,hub-tls.key} | sha256sum | cut -c1-10
}

# --- the hub in the running stack
# hub_url: the hub's address for students.
hub_url() { echo "https://$(hostname -f 2>/dev/null || hostname):$DELEGATE_JUPYTER_PORT/"; }

# hub_answers: the hub answers its API (version) through the proxy, in the
# user node.
hub_answers() {
    stack_exec user curl -kfsS --max-time 10 -o /dev/null https://127.0.0.1:8888/hub/api/
}

# --- `build_cluster.sh --stack accounts ...`
# roster_state ACTION ARGS...: `delegate-deploy roster-ACTION --state FILE`
# with cluster.toml's accounts reserved (deploy/src/roster_state.rs owns the
# state file: uids, roles, names; checked and written whole, 0600).
roster_state() {
    local action=$1 a reserved=(); shift
    for a in $DELEGATE_STACK_USERS $DELEGATE_STACK_TEST_USERS; do reserved+=(--reserved "$a"); done
    deploy_build
    install -d -m 0755 "$DELEGATE_STACK_DIR"
    "$REPO/target/release/delegate-deploy" "roster-$action" --state "$(hub_roster_file)" "${reserved[@]}" "$@"
}

# stack_roster_add FILE INSTRUCTORS: each roster line becomes an account of
# the stack (a free uid from DELEGATE_STACK_ROSTER_FIRST_UID, same on every
# node), then the stack is redeployed when it runs (every node creates the
# accounts, the user node their 0700 homes, the hub their passwords).
# Existing accounts are left as they are: the same roster again changes
# nothing.
stack_roster_add() {
    local file=$1 flag=() out what u uid role n=0 added=0
    ((${2:-0})) && flag=(--instructors)
    out=$(roster_state add --csv "$file" "${flag[@]}" --first-uid "$DELEGATE_STACK_ROSTER_FIRST_UID" \
        --reserved-id "${DELEGATE_STACK_ADMIN_GROUP##*:}") || die "the roster $file cannot be used (above)"
    while read -r what u uid role; do
        case $what in
            added) log "accounts: $u (uid $uid, $role) added to the stack's roster"; added=$((added + 1)) ;;
            entries) n=$u ;;
        esac
    done <<<"$out"
    if ((added == 0)); then
        log "accounts: $n roster entries, all already accounts of the stack: nothing changed in the roster"
        # A roster whose apply was cut short (the stack restarting under
        # it) is finished here: the associations are added when missing.
        if [[ -n $(docker stack services -q "$STACK" 2>/dev/null) ]]; then
            stack_wait
            stack_accounting_setup
        fi
        return 0
    fi
    stack_roster_apply "$added account(s) added"
}

# stack_roster_apply WHAT: the new accounts reach the nodes: a redeploy
# when the stack runs (the accounts config and the password secret change:
# swarm rolls the services onto them), else at the next deploy.
stack_roster_apply() {
    if [[ -n $(docker stack services -q "$STACK" 2>/dev/null) ]]; then
        log "accounts: $1; redeploying stack $STACK (the nodes restart with the new accounts)"
        stack_deployed_workers   # as many workers as deployed
        # (the deploy waits until swarm has rolled every service onto the
        # new configs, then until all is ready, then adds the associations)
        stack_deploy
    else
        stack_secrets
        log "accounts: $1; stack $STACK is not deployed: \`deploy\` creates them"
    fi
    log "accounts: initial passwords in $STACK_SECRETS/initial-passwords (root only); hub: $(hub_url)"
}

# stack_roster_list: every account of the stack: name, uid, role, source,
# full name.
stack_roster_list() {
    local u admins=()
    for u in $DELEGATE_STACK_ADMINS; do admins+=(--admin "$u"); done
    roster_state list "${admins[@]}" || die "cannot list the stack's accounts (above)"
}

# stack_roster_remove USER ARCHIVE: USER leaves the roster and the nodes
# (a redeploy when the stack runs); the home is kept, or with ARCHIVE=1
# packed into DELEGATE_STACK_DIR/archive/USER-DATE.tar.gz and removed.
stack_roster_remove() {
    local u=$1 archive=$2 home
    [[ $u =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || die "'$u' is not a user name"
    roster_state remove "$u" >/dev/null || die "cannot remove $u (above)"
    log "accounts: $u removed from the stack's roster"
    # Its Slurm association too (the stack's accounting), when the head runs.
    if [[ -n $(stack_cid head 2>/dev/null) ]]; then
        stack_sacctmgr_via_head
        sacctmgr_q delete user name="$u" account="$DELEGATE_COURSE_ACCOUNT" \
            || warn "accounts: cannot remove the Slurm association of $u (jobs still running?)"
    fi
    home=$DELEGATE_STACK_HOME/$u
    if [[ $archive == 1 && -d $home ]]; then
        install -d -m 0700 "$DELEGATE_STACK_DIR/archive"
        local out
        out=$DELEGATE_STACK_DIR/archive/$u-$(date +%Y%m%d%H%M%S).tar.gz
        tar -C "$DELEGATE_STACK_HOME" -czf "$out" "$u" || die "cannot archive $home"
        chmod 0600 "$out"
        rm -rf --one-file-system "$home"
        log "accounts: home of $u archived in $out and removed"
    elif [[ -d $home ]]; then
        log "accounts: home $home kept"
    fi
    stack_roster_apply "$u removed"
}

# stack_accounts_main ARGS: `build_cluster.sh --stack accounts add --csv
# FILE [--instructors] | list | remove USER [--archive]`.
stack_accounts_main() {
    stack_load_config
    accounts_dispatch stack_roster_add stack_roster_list stack_roster_remove "$@"
}

# --- per-student limits on the user node (docs/security.md, "The hub")
# The user node's container has no writable cgroup of its own, so the host
# makes one subtree for the hub's students and binds it in; the spawner
# (stack/jupyterhub_config.py) puts each student's server and everything it
# starts in <subtree>/<student>, with a memory limit for their sum and a CPU
# cap, so one notebook cannot starve the others. The subtree itself gets the
# user node's totals (DELEGATE_USER_NODE_MEM/CPUS): the servers leave the
# container's own cgroup, not its bounds.
#   cgroup v1 (this project's test VM): memory/<name> and cpu/<name>;
#   cgroup v2: one <name> under /sys/fs/cgroup, memory and cpu delegated.
# Sets HUB_CG_MEM and HUB_CG_CPU, the bind sources of the user service's
# /run/delegate-cgroup/{memory,cpu} (the same directory twice on v2). When
# the host allows no cgroup, both are an empty directory and the servers
# keep only their rlimits (warned).
hub_cgroup_name() { echo "delegate-hub-$STACK"; }

hub_cgroups() {
    local name mem cpus fallback quota
    name=$(hub_cgroup_name)
    mem=$(deploy_value bytes DELEGATE_USER_NODE_MEM) || exit 1
    cpus=$DELEGATE_USER_NODE_CPUS
    quota=$(deploy_value cpu-quota DELEGATE_USER_NODE_CPUS --period 100000) || exit 1
    fallback=$DELEGATE_STACK_DIR/hub-no-cgroup
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
        HUB_CG_MEM=/sys/fs/cgroup/$name
        if mkdir -p "$HUB_CG_MEM" 2>/dev/null \
            && echo "+memory +cpu" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null \
            && echo "$mem" >"$HUB_CG_MEM/memory.max" \
            && echo "$quota 100000" >"$HUB_CG_MEM/cpu.max" \
            && echo "+memory +cpu" >"$HUB_CG_MEM/cgroup.subtree_control"; then
            HUB_CG_CPU=$HUB_CG_MEM
            log "hub: per-student cgroups under $HUB_CG_MEM (cgroup v2; node total $DELEGATE_USER_NODE_MEM, $cpus CPUs)"
            return
        fi
    elif [[ -d /sys/fs/cgroup/memory && -d /sys/fs/cgroup/cpu ]]; then
        HUB_CG_MEM=/sys/fs/cgroup/memory/$name
        HUB_CG_CPU=/sys/fs/cgroup/cpu/$name
        # The limits of the subtree hold for the students' groups below it
        # only with memory.use_hierarchy (the default on current kernels).
        if mkdir -p "$HUB_CG_MEM" "$HUB_CG_CPU" 2>/dev/null \
            && [[ $(cat "$HUB_CG_MEM/memory.use_hierarchy" 2>/dev/null) == 1 ]] \
            && echo "$mem" >"$HUB_CG_MEM/memory.limit_in_bytes" \
            && echo 100000 >"$HUB_CG_CPU/cpu.cfs_period_us" \
            && echo "$quota" >"$HUB_CG_CPU/cpu.cfs_quota_us"; then
            log "hub: per-student cgroups under $HUB_CG_MEM and $HUB_CG_CPU (node total $DELEGATE_USER_NODE_MEM, $cpus CPUs)"
            return
        fi
    fi
    warn "hub: cannot make a cgroup subtree for the students' servers: each keeps its rlimits, but one student's processes together are not bounded"
    mkdir -p "$fallback"
    HUB_CG_MEM=$fallback
    HUB_CG_CPU=$fallback
}

# hub_cgroups_down: removes the subtree (students' groups first; a group
# that still holds a process stays, and says so).
hub_cgroups_down() {
    local name d
    name=$(hub_cgroup_name)
    for d in /sys/fs/cgroup/memory/"$name" /sys/fs/cgroup/cpu/"$name" /sys/fs/cgroup/"$name"; do
        [[ -d $d ]] || continue
        find "$d" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
        rmdir "$d" 2>/dev/null || warn "down: cgroup $d still holds processes"
    done
}

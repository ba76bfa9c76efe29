#!/bin/bash
# Entrypoint of the stack's nodes: cluster-entrypoint head|dbd|worker|user
#
# Inputs (from the stack file, stack/delegate-stack.yml.j2):
#   /etc/delegate-stack/slurm.conf, gres.conf, policy.toml, accounts   (swarm configs)
#   /run/secrets/munge.key                                             (swarm secret)
#   DELEGATE_STACK_HOME   the shared home (same absolute path everywhere)
#   /run/secrets/hub-passwords, hub-tls.{crt,key}  (user node) the accounts'
#                         password hashes, the hub's certificate
#   DELEGATE_STAGING_HOST_DIR  (worker) the host directory bound at
#                         /run/delegate/jobs, as the host's engine sees it
#   /run/delegate-engine/docker.sock  (worker) the host's Docker socket
#   /run/secrets/slurmdbd.conf  (dbd) slurmdbd's configuration with the
#                         database password (swarm secret)
#   /var/lib/delegate/slurm/ctld  (head) slurmctld's StateSaveLocation, a
#                         named volume: a restarted head keeps its queue
# It installs them, creates the accounts, starts munged (and on a worker
# the root agent sandbox-agent), then runs the role's daemon in the
# foreground (slurmctld, slurmd or JupyterHub) so the container lives
# exactly as long as the daemon.
set -euo pipefail
role=${1:-worker}

CFG=/etc/delegate-stack
HOME_ROOT=${DELEGATE_STACK_HOME:?DELEGATE_STACK_HOME not set}
log() { printf '%s [%s %s] %s\n' "$(date '+%H:%M:%S')" "$role" "$(hostname)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

# --- configuration
install -d -m 0755 /etc/slurm /etc/delegate /var/lib/delegate /run/delegate
# The logs name every student's jobs, uids, refusals and kills: readable by
# root and group adm only (0640), the directory not listable (0711).
install -d -m 0711 /var/log/delegate
chmod 0711 /var/log/delegate
private_log() {
    touch "$1"
    chown "${2:-root}:adm" "$1"
    chmod 0640 "$1"
}
install -o root -g root -m 0644 "$CFG/slurm.conf" /etc/slurm/slurm.conf
install -o root -g root -m 0644 "$CFG/gres.conf" /etc/slurm/gres.conf
# The site policy: root-owned, not writable by others (the runner checks).
install -o root -g root -m 0644 "$CFG/policy.toml" /etc/delegate/policy.toml
# What this node is, for `delegate doctor` (which checks what a node of that
# role has: a user node runs no sandbox).
echo "$role" >/etc/delegate/node-role
chmod 0644 /etc/delegate/node-role
# The lockdown (docs/security.md): slurmctld's job gate (read on the head)
# and the SPANK stack slurm.conf names (read by slurmstepd on the workers,
# by srun/sbatch everywhere).
install -o root -g root -m 0644 "$CFG/job_submit.lua" /etc/slurm/job_submit.lua
install -o root -g root -m 0644 "$CFG/plugstack.conf" /etc/slurm/delegate-plugstack.conf

# sandbox_pull REF NAME: the host's engine pulls REF (an image by digest)
# with the registry's credentials (the registry-auth.json secret, root's
# only) and tags it NAME; a registry that does not answer yet is tried
# again for a minute, then the worker fails (and swarm restarts it).
sandbox_pull() {
    local ref=$1 name=$2 conf=/run/delegate/registry i out
    install -d -m 0700 "$conf"
    install -m 0600 /run/secrets/registry-auth.json "$conf/config.json" \
        || die "the registry's credentials (secret registry-auth.json) are missing"
    for i in $(seq 20); do
        if out=$(docker --config "$conf" pull -q "$ref" 2>&1); then
            docker tag "$ref" "$name" || die "cannot tag $ref as $name"
            rm -rf "$conf"
            log "sandbox image $name: $ref, from the course's registry"
            return 0
        fi
        ((i < 20)) && sleep 3
    done
    rm -rf "$conf"
    die "cannot pull the sandbox image $ref: $out"
}

# worker_lost_jobs: a worker that starts while Slurm counts jobs as running
# on it has lost them (its container, Docker engine or machine stopped
# under them; this container is new). The node is set down with that
# reason, at once rather than when Slurm misses the jobs: their calls end
# with Slurm's NODE_FAIL, the down event and its reason are in the
# accounting (sacctmgr list event), and slurmd's registration brings the
# node back (ReturnToService=2). Jobs waiting for an elastic worker to boot
# are CONFIGURING, not running, and are left alone.
worker_lost_jobs() {
    local node jobs
    node=$(hostname -s)
    jobs=$(timeout 20 squeue -h -w "$node" -t RUNNING,COMPLETING -o %i 2>/dev/null | paste -sd, -) || return 0
    [[ -n $jobs ]] || return 0
    log "Slurm counts jobs $jobs as running on $node, which this new container cannot have: setting $node down"
    timeout 20 scontrol update "nodename=$node" state=down \
        "reason=restarted under jobs $jobs (its container, Docker engine or machine stopped)" \
        || log "WARNING: cannot set $node down; Slurm ends jobs $jobs when it finds them missing"
}

# --- the power program of elastic workers (docs/elastic.md, slurm-conf/power.sh)
install -d -m 0755 /usr/local/lib/delegate
if [[ -r $CFG/power.sh ]]; then
    install -o root -g root -m 0755 "$CFG/power.sh" /usr/local/lib/delegate/power
fi
if [[ $role == power ]]; then
    # The power service: root, the host's Docker socket (root-only
    # directory, as on the workers), the spool shared with the head only.
    engine=/run/delegate-engine
    [[ -S $engine/docker.sock ]] || die "the host's Docker socket is not mounted at $engine/docker.sock"
    chown root:root "$engine"
    chmod 0700 "$engine"
    ln -sfn "$engine/docker.sock" /var/run/docker.sock
    log "power service: serving requests in /run/delegate-power"
    exec /usr/local/sbin/delegate-power
fi

# --- accounts: "name uid [role [full name]]" per line (role and name: the
# roster's accounts); same uid/gid on every node
while read -r name uid _role gecos; do
    [[ -z $name || $name == \#* ]] && continue
    getent group "$name" >/dev/null || groupadd --gid "$uid" "$name"
    if ! id "$name" >/dev/null 2>&1; then
        useradd --uid "$uid" --gid "$uid" --home-dir "$HOME_ROOT/$name" --no-create-home \
            --shell /bin/bash --comment "${gecos:-}" "$name"
    fi
    # Homes are created by the user node (the workers only use them).
    if [[ $role == user && ! -d $HOME_ROOT/$name ]]; then
        install -d -o "$uid" -g "$uid" -m 0700 "$HOME_ROOT/$name"
        log "created home $HOME_ROOT/$name"
    fi
done <"$CFG/accounts"

# --- the admin group: "name gid member,member"; same gid on every node.
# Its members keep full Slurm (job_submit.lua reads /etc/group on the head,
# the SPANK plugin this node's account database).
read -r agroup agid amembers <"$CFG/admins" || true
if [[ -n ${agroup:-} ]]; then
    getent group "$agroup" >/dev/null || groupadd --gid "$agid" "$agroup"
    [[ $(getent group "$agroup" | cut -d: -f3) == "$agid" ]] || die "group $agroup exists with another gid than $agid"
    for m in ${amembers//,/ }; do usermod -aG "$agroup" "$m"; done
fi

# --- privacy (docs/security.md, "Privacy"): on the nodes students use, each
# user sees only their own processes: /proc remounted hidepid=invisible, the
# admin group (gid) sees all, and so does root with CAP_SYS_PTRACE (the
# workers and the user node give it to root's processes). Needs
# CAP_SYS_ADMIN (the workers have it for the agent; the user node only for
# this, then drops it).
hide_processes() {
    if mount -o "remount,hidepid=invisible,gid=${agid:-0}" /proc 2>/dev/null; then
        log "/proc: hidepid=invisible (gid ${agid:-0} sees all)"
    else
        log "WARNING: cannot remount /proc hidepid=invisible (no CAP_SYS_ADMIN): users see each other's processes"
    fi
}
[[ $role == worker || $role == user ]] && hide_processes

# --- munge: the one key of the cluster
install -d -o munge -g munge -m 0700 /etc/munge
install -o munge -g munge -m 0400 /run/secrets/munge.key /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
runuser -u munge -- munged --force
for _ in $(seq 20); do munge -n | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
munge -n | unmunge >/dev/null || die "munged does not answer"

slurmuser=$(sed -n 's/^SlurmUser=//p' /etc/slurm/slurm.conf)
install -d -m 0755 /var/lib/delegate/slurm /var/lib/delegate/slurm/d
install -d -m 0700 -o "${slurmuser:-root}" /var/lib/delegate/slurm/ctld
# (on the head a named volume: what an older image's slurm uid left is
# handed to this one's)
chown -R "${slurmuser:-root}" /var/lib/delegate/slurm/ctld
private_log /var/log/delegate/slurmctld.log "${slurmuser:-root}"
for f in epilog slurmd agent; do private_log "/var/log/delegate/$f.log"; done

# students: "name uid" of each account that is not an admin, as the deploy
# decided it (the `students` config: delegate-deploy stack-students).
students() {
    local name uid
    while read -r name uid; do
        [[ -n $name && $uid =~ ^[0-9]+$ ]] && echo "$name $uid"
    done <"$CFG/students"
}

# munge_per_account: on the user node every account that is not an admin
# gets a munged of its own. munged serves its socket with a few threads and
# gives each connection up to 2 s to speak, so a student holding silent
# connections to a shared munged would stop every Slurm command on the node
# (each needs a credential); with one munged per student they stop only
# their own. The student's socket is in a directory only they (and munge)
# can enter, their Slurm configuration (/etc/slurm/users/NAME/slurm.conf,
# SLURM_CONF: set by the hub for their server and by /etc/profile.d for
# login shells) names it, and the shared socket's directory is closed to
# them. Admins keep the shared munged (their slurm.conf is the node's).
munge_per_account() {
    local name uid d n=0
    install -d -m 0755 /run/munge-users /etc/slurm/users
    install -d -o munge -g munge -m 0700 /var/lib/munge/users /var/log/munge/users
    for name in ${amembers//,/ }; do
        install -d -m 0755 "/etc/slurm/users/$name"
        ln -sfn /etc/slurm/slurm.conf "/etc/slurm/users/$name/slurm.conf"
    done
    while read -r name uid; do
        install -d -m 0755 "/etc/slurm/users/$name"
        d=/run/munge-users/$name
        install -d -o munge -g "$uid" -m 0750 "$d"
        # --force: munged wants its socket's directory open to all.
        runuser -u munge -- munged --force --socket="$d/munge.socket" --pid-file="$d/munged.pid" \
            --seed-file="/var/lib/munge/users/$name.seed" --log-file="/var/log/munge/users/$name.log" \
            || die "cannot start the munged of $name"
        # AccountingStoragePass names the munged of connections to
        # slurmdbd (sacct, sshare, sacctmgr), AuthInfo that of the others
        # (deploy/src/user_node.rs).
        delegate-deploy student-slurm-conf --base /etc/slurm/slurm.conf --socket "$d/munge.socket" \
            >"/etc/slurm/users/$name/slurm.conf.new" || die "cannot write the slurm.conf of $name"
        chmod 0644 "/etc/slurm/users/$name/slurm.conf.new"
        mv -f "/etc/slurm/users/$name/slurm.conf.new" "/etc/slurm/users/$name/slurm.conf"
        n=$((n + 1))
    done < <(students)
    chown munge:"${agid:-0}" /run/munge
    chmod 0750 /run/munge
    cat >/etc/profile.d/delegate-slurm.sh <<'PROFILE'
# delegate (docker/cluster-entrypoint.sh): each account's Slurm configuration
# names its own munged.
# (USER is unset in a `docker exec -u NAME` shell: the uid's name then.)
_delegate_user=${USER:-$(id -un 2>/dev/null)}
if [ -n "$_delegate_user" ] && [ -r "/etc/slurm/users/$_delegate_user/slurm.conf" ]; then
    SLURM_CONF="/etc/slurm/users/$_delegate_user/slurm.conf"
    export SLURM_CONF
fi
unset _delegate_user
PROFILE
    log "munge: $n accounts have a munged of their own (/run/munge-users); the shared one is root's and the admins'"
}

# limit_queries: on the user node, each account that is not an admin
# - may open at most DELEGATE_RPC_RATE new connections per second (after a
#   burst of DELEGATE_RPC_BURST) to slurmctld's and slurmdbd's ports;
#   beyond, its connection attempts are dropped (the client's TCP retries
#   back off, so a flooding loop slows itself down);
# - may hold at most DELEGATE_RPC_CONNS of them open at once; beyond, a new
#   one is refused (slurmctld and slurmd serve at most 256 connections at
#   once and wait up to MessageTimeout for each request: idle connections
#   held open would stop them answering anyone);
# - may not connect to the workers' slurmd at all (nothing a student runs
#   needs it: srun, sattach and sstat are refused to them).
# Slurm 22.05 has no per-user RPC limit of its own (docs/security.md).
# iptables in this container's network namespace, per uid (owner match)
# with a hash limit and a connection count of its own; needs CAP_NET_ADMIN,
# which the hub's exec drops from the bounding set. The rules are
# delegate-deploy's (deploy/src/user_node.rs: query-plan).
limit_queries() {
    local rate=${DELEGATE_RPC_RATE:-0} burst=${DELEGATE_RPC_BURST:-0} conns=${DELEGATE_RPC_CONNS:-0}
    local plan kind rest ports="" uids=() args n=0 _name uid
    while read -r _name uid; do uids+=(--uid "$uid"); n=$((n + 1)); done < <(students)
    plan=$(delegate-deploy query-plan --slurm-conf /etc/slurm/slurm.conf \
        --rate "$rate" --burst "$burst" --conns "$conns" "${uids[@]}") \
        || die "DELEGATE_RPC_RATE, DELEGATE_RPC_BURST and DELEGATE_RPC_CONNS must be numbers (above)"
    ports=$(sed -n 's/^ports //p' <<<"$plan")
    if ! { iptables -N delegate-queries 2>/dev/null || iptables -F delegate-queries; } \
        || ! { iptables -C OUTPUT -p tcp --syn -m multiport --dports "$ports" -j delegate-queries 2>/dev/null \
            || iptables -A OUTPUT -p tcp --syn -m multiport --dports "$ports" -j delegate-queries; }; then
        log "WARNING: no per-student limit of queries to Slurm (iptables failed: CAP_NET_ADMIN?)"
        return 0
    fi
    while read -r kind rest; do
        [[ $kind == rule ]] || continue
        read -ra args <<<"$rest"
        iptables "${args[@]}" || die "cannot limit the queries of a student (iptables ${args[*]})"
    done <<<"$plan"
    local new="$rate new connections/s (burst $burst)" open="$conns open at once"
    ((rate > 0)) || new="no limit of new connections (DELEGATE_RPC_RATE=0)"
    ((conns > 0)) || open="no limit of open connections (DELEGATE_RPC_CONNS=0)"
    log "queries to Slurm from $n accounts: $new, $open, to ports $ports (the last, slurmd's, refused)"
}

# dbd_answers: slurmdbd answers sacctmgr (bounded: a dead one must not hang us).
dbd_answers() { timeout 10 sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1; }

# run_head: the controller (slurmctld), after the elastic power program and
# slurmdbd.
run_head() {
    local n cluster wait_s deadline
    # Elastic workers: slurmctld runs the power program as SlurmUser under
    # the names slurm.conf gives (power-resume, -suspend, -resume-fail); it
    # writes requests into the spool (SlurmUser's alone, 0700) and logs to
    # power.log. The site's hook (cluster.toml DELEGATE_POWER_HOOK), when
    # one is configured, replaces the spool.
    for n in power-resume power-suspend power-resume-fail; do
        ln -sfn power "/usr/local/lib/delegate/$n"
    done
    if [[ -s $CFG/power-hook && $(head -n1 "$CFG/power-hook") != "# delegate: no power hook"* ]]; then
        install -o root -g root -m 0755 "$CFG/power-hook" /usr/local/lib/delegate/power-hook
    else
        rm -f /usr/local/lib/delegate/power-hook
    fi
    if [[ -d /run/delegate-power ]]; then
        chown "${slurmuser:-root}:" /run/delegate-power
        chmod 0700 /run/delegate-power
    fi
    private_log /var/log/delegate/power.log "${slurmuser:-root}"
    # A worker whose start failed for want of a machine is resumed once
    # the power service sees a machine that can take it again (power.sh's
    # watch, as SlurmUser, beside slurmctld).
    if [[ -d /run/delegate-power && ! -e /usr/local/lib/delegate/power-hook ]]; then
        runuser -u "${slurmuser:-root}" -- /usr/local/lib/delegate/power watch </dev/null >/dev/null 2>&1 &
    fi
    # slurmctld needs slurmdbd (the "dbd" service) on its first start: with
    # AccountingStorageEnforce and no saved state it cannot start without
    # the associations. With state on the volume (a restart) it starts from
    # its saved associations and spools the accounting records until
    # slurmdbd answers again, so a dead database does not keep it down.
    cluster=$(sed -n 's/^ClusterName=//p' /etc/slurm/slurm.conf)
    wait_s=${DELEGATE_DBD_WAIT:-180}
    [[ -e /var/lib/delegate/slurm/ctld/assoc_mgr_state ]] && wait_s=20
    deadline=$((SECONDS + wait_s))
    until dbd_answers; do
        ((SECONDS < deadline)) || break
        sleep 2
    done
    if dbd_answers; then
        # The cluster in the database before slurmctld's first connection.
        if [[ -z $(timeout 10 sacctmgr -n -P show cluster "$cluster" format=cluster 2>/dev/null) ]]; then
            timeout 30 sacctmgr -i add cluster "$cluster" >/dev/null || die "cannot register cluster $cluster in slurmdbd"
            log "accounting: cluster $cluster registered"
        fi
    else
        log "WARNING: slurmdbd does not answer after ${wait_s}s; starting slurmctld without it"
    fi
    log "starting slurmctld (state in /var/lib/delegate/slurm/ctld)"
    exec slurmctld -D -i
}

# run_dbd: slurmdbd, once its database answers.
run_dbd() {
    local dbhost dbport
    # slurmdbd.conf holds the database password: SlurmUser's, 0600.
    install -o "${slurmuser:-root}" -g root -m 0600 /run/secrets/slurmdbd.conf /etc/slurm/slurmdbd.conf
    install -d -o "${slurmuser:-root}" -m 0755 /run/slurmdbd
    private_log /var/log/delegate/slurmdbd.log "${slurmuser:-root}"
    dbhost=$(sed -n 's/^StorageHost=//p' /etc/slurm/slurmdbd.conf)
    dbport=$(sed -n 's/^StoragePort=//p' /etc/slurm/slurmdbd.conf)
    # The database may still be starting (or be down): wait for its port
    # (slurmdbd gives up at once when it cannot connect on start).
    for _ in $(seq 90); do
        timeout 3 bash -c "exec 3<>/dev/tcp/$dbhost/$dbport" 2>/dev/null && break
        sleep 2
    done
    log "starting slurmdbd (database $dbhost:$dbport)"
    tail -F /var/log/delegate/slurmdbd.log 2>/dev/null &
    exec slurmdbd -D
}

# worker_engine: the host's Docker socket (root's only), the staging
# directory and the host's /proc, as the policy names them.
worker_engine() {
    local engine=/run/delegate-engine stage host_stage prop
    # The host's Docker socket is mounted in /run/delegate-engine, a
    # root-only directory (0700): only root in this container (the agent and
    # the epilog) reaches it; /var/run/docker.sock is a symlink into it for
    # the docker CLI's default. Students are in no group that owns it, and
    # the runner is not setgid (docs/security.md, "Who starts containers").
    [[ -S $engine/docker.sock ]] || die "the host's Docker socket is not mounted at $engine/docker.sock"
    chown root:root "$engine"
    chmod 0700 "$engine"
    ln -sfn "$engine/docker.sock" /var/run/docker.sock
    [[ ! -g /usr/local/bin/sandbox-runner && ! -u /usr/local/bin/sandbox-runner ]] \
        || die "/usr/local/bin/sandbox-runner must not be setuid/setgid"
    # The agent pins each running job directory at /run/delegate/jobs/<job>
    # (policy staging_dir), a bind mount of a host directory with rshared
    # propagation, so the host's engine sees the pin at
    # $DELEGATE_STAGING_HOST_DIR/<job> (policy staging_host_dir).
    stage=/run/delegate/jobs
    host_stage=${DELEGATE_STAGING_HOST_DIR:?DELEGATE_STAGING_HOST_DIR not set}
    prop=$(findmnt -n -o PROPAGATION --mountpoint "$stage" 2>/dev/null || true)
    [[ $prop == shared* ]] || die "$stage is not a shared bind mount of the host's $host_stage (propagation '${prop:-none}'): the host's engine would not see the agent's staging mounts"
    # The host's /proc, read-only in the same root-only directory: the
    # sandboxes are the host engine's, in the host's pid namespace, and the
    # agent counts their deleted-but-open files in the job directory's
    # budget there (policy host_proc; docs/security.md, "Disk").
    local proc=()
    if [[ $(findmnt -n -o FSTYPE --mountpoint "$engine/proc" 2>/dev/null) == proc ]]; then
        proc=(--host-proc "$engine/proc")
    else
        log "WARNING: the host's /proc is not mounted at $engine/proc: deleted-but-open files of sandboxes are not counted"
    fi
    # Both set in the policy by delegate-deploy (deploy/src/worker_policy.rs),
    # which reads it before and after.
    local policy
    policy=$(delegate-deploy worker-policy --policy /etc/delegate/policy.toml \
        --staging-host-dir "$host_stage" "${proc[@]}") || die "cannot set this worker's facts in policy.toml"
    printf '%s\n' "$policy" >/etc/delegate/policy.toml.new
    chmod 0644 /etc/delegate/policy.toml.new
    mv /etc/delegate/policy.toml.new /etc/delegate/policy.toml
}

# worker_sandbox_image: the policy's sandbox image on the host's engine
# (pulled from the course's registry on a worker machine).
worker_sandbox_image() {
    local sandbox_image
    sandbox_image=$(delegate-deploy policy-image --policy /etc/delegate/policy.toml) \
        || die "cannot read the sandbox image of /etc/delegate/policy.toml"
    # On a worker machine: the sandbox image from the course's registry
    # (build_cluster.d/registry.sh), by digest, tagged as the policy's.
    if [[ -n ${DELEGATE_SANDBOX_PULL:-} ]]; then
        sandbox_pull "$DELEGATE_SANDBOX_PULL" "$sandbox_image"
    fi
    docker image inspect "$sandbox_image" >/dev/null 2>&1 \
        || log "WARNING: the sandbox image is not present on this host's Docker engine"
}

# worker_agent: the root agent, restarted if it ever exits, listening
# before slurmd starts.
worker_agent() {
    # The root agent, before slurmd: restarted if it ever exits (a job's
    # runner fails with "cannot reach the delegate agent" meanwhile).
    (
        while :; do
            rc=0
            # It opens its log itself; its stdout/stderr (nothing, unless
            # it cannot open the log) go to the container's output.
            DELEGATE_AGENT_LOG=/var/log/delegate/agent.log DELEGATE_NODE_NAME=$(hostname -s) \
                setpriv --bounding-set -sys_time --inh-caps -sys_time \
                /usr/local/sbin/sandbox-agent </dev/null || rc=$?
            log "sandbox-agent exited ($rc); restarting in 2 s"
            sleep 2
        done
    ) &
    for _ in $(seq 40); do [[ -S /run/delegate/agent.sock ]] && break; sleep 0.25; done
    [[ -S /run/delegate/agent.sock ]] || die "sandbox-agent did not open /run/delegate/agent.sock: $(tail -n 20 /var/log/delegate/agent.log)"
    log "sandbox-agent: listening on /run/delegate/agent.sock (log /var/log/delegate/agent.log)"
}

# worker_cgroup_conf: cgroup.conf beside slurm.conf for this worker's own
# facts (docs/ml.md, "Slurm's cgroup side"): the hierarchy it sees, no
# systemd (a container), Slurm's version. Without it slurmd autodetects,
# and on a cgroup v2 host Slurm 22.05 then stops for want of dbus. Where
# slurmd makes its own scope (v2, Slurm before 23.11) its slice is made.
worker_cgroup_conf() {
    local hierarchy=v1
    [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs ]] && hierarchy=v2
    delegate-deploy cgroup-conf --shape stack --cgroup "$hierarchy" --slurm-version "$(slurmd -V)" \
        >/etc/slurm/cgroup.conf.new || die "cannot render cgroup.conf for this worker"
    mv -f /etc/slurm/cgroup.conf.new /etc/slurm/cgroup.conf
    if grep -qx 'IgnoreSystemd=yes' /etc/slurm/cgroup.conf; then
        /usr/local/lib/delegate/cgroup-slice.sh || die "cannot prepare slurmd's cgroup slice"
    fi
    log "cgroup.conf: cgroup $hierarchy, $(grep -m1 '^CgroupPlugin=' /etc/slurm/cgroup.conf)"
}

# run_worker: a worker node: the engine, the sandbox image, the agent,
# then slurmd (in a time namespace of its own on an elastic worker).
run_worker() {
    local up
    worker_cgroup_conf
    worker_engine
    worker_sandbox_image
    worker_agent
    worker_lost_jobs
    log "starting slurmd"
    # slurmd's and the agent's logs go to the container's output too
    # (docker service logs).
    tail -F /var/log/delegate/slurmd.log /var/log/delegate/epilog.log /var/log/delegate/agent.log 2>/dev/null &
    if [[ ${DELEGATE_ELASTIC_NODE:-0} == 1 ]]; then
        # An elastic worker (docs/elastic.md): slurmctld counts a powered-up
        # node as started only when its slurmd reports a boot time after the
        # power-up request, and a container would report the host's. slurmd
        # runs in a time namespace whose boot clock starts now (0 s: a
        # boot time even a second old can precede a fast start's request).
        # slurmctld computes that boot time in whole seconds (its clock,
        # floored, less slurmd's uptime, rounded up), up to 3 s early: slurmd
        # starts no sooner than 3 s after this container did (after the
        # request), else a fast start never counts (docs/elastic.md).
        # CAP_SYS_TIME (the stack gives it to elastic workers for this alone)
        # leaves the bounding and inheritable sets: slurmd and the jobs
        # never hold it (the agent dropped it when it started, above).
        while ((SECONDS < 4)); do sleep 0.2; done
        up=$(cut -d. -f1 /proc/uptime)
        exec unshare --time --fork --kill-child=SIGTERM --boottime "-$up" \
            setpriv --bounding-set -sys_time --inh-caps -sys_time slurmd -D
    fi
    exec slurmd -D
}

# run_user: the user node: munge per account, the limit of queries to
# Slurm, the accounts' passwords and JupyterHub.
# place_helper: on the user node, delegate-place tells each student where
# their waiting jobs stand in Slurm's queue (students see only their own
# jobs; docs/students.md). It runs as SlurmUser, which sees every job, with a
# munged of its own as each student has (the shared one's directory is
# closed to all but the admins); it needs nothing more. Without it the
# students' lines only lack their place: a warning, not a failure.
place_helper() {
    local user=${slurmuser:-root} d=/run/munge-place socket
    socket=$(delegate-place --print-socket) || { log "WARNING: delegate-place is missing: no places"; return 0; }
    install -d -o munge -g "$(id -g "$user")" -m 0750 "$d"
    if ! runuser -u munge -- munged --force --socket="$d/munge.socket" --pid-file="$d/munged.pid" \
        --seed-file=/var/lib/munge/place.seed --log-file=/var/log/munge/place.log; then
        log "WARNING: the place helper's munged did not start: no places"
        return 0
    fi
    install -d -m 0755 /etc/slurm/place
    delegate-deploy student-slurm-conf --base /etc/slurm/slurm.conf --socket "$d/munge.socket" \
        >/etc/slurm/place/slurm.conf || { log "WARNING: no slurm.conf for the place helper: no places"; return 0; }
    install -d -o "$user" -g root -m 0755 "$(dirname "$socket")"
    private_log /var/log/delegate/place.log "$user"
    SLURM_CONF=/etc/slurm/place/slurm.conf setpriv --reuid="$user" --regid="$user" --init-groups --no-new-privs \
        delegate-place </dev/null >>/var/log/delegate/place.log 2>&1 &
    log "place helper: delegate-place on $socket as $user (log /var/log/delegate/place.log)"
}

run_user() {
    local keep
    # JupyterHub (/etc/jupyterhub/jupyterhub_config.py): the accounts'
    # passwords for PAM ("name:hash" lines, the root-only secret), the
    # certificate, then the hub as root (it starts each student's server as
    # the student).
    munge_per_account
    limit_queries
    place_helper
    # A password a student changed since (passwd in a terminal) is kept in
    # the hub's state directory and set again (keep-passwords).
    if [[ -s /run/secrets/hub-passwords ]]; then
        chpasswd -e </run/secrets/hub-passwords || die "cannot set the accounts' passwords"
        keep=/var/lib/jupyterhub/kept-passwords
        /usr/local/lib/delegate/keep-passwords restore /run/secrets/hub-passwords "$keep" \
            || log "kept passwords not restored (see above)"
        /usr/local/lib/delegate/keep-passwords watch /run/secrets/hub-passwords "$keep" </dev/null &
    fi
    install -d -m 0700 /etc/jupyterhub/tls
    install -m 0644 /run/secrets/hub-tls.crt /etc/jupyterhub/tls/hub.crt
    install -m 0600 /run/secrets/hub-tls.key /etc/jupyterhub/tls/hub.key
    chown root:root /var/lib/jupyterhub
    chmod 0700 /var/lib/jupyterhub
    cd /var/lib/jupyterhub
    log "starting JupyterHub on :8888 (https)"
    # CAP_SYS_ADMIN (for the /proc remount above) leaves the bounding set:
    # nothing the hub starts, not even a setuid binary, can get it back.
    exec setpriv --bounding-set -sys_admin,-net_admin --inh-caps -sys_admin,-net_admin \
        env -i PATH="$PATH" HOME=/root LANG=C.UTF-8 \
        DELEGATE_HUB_MEM_LIMIT="${DELEGATE_HUB_MEM_LIMIT:-}" DELEGATE_HUB_NPROC_LIMIT="${DELEGATE_HUB_NPROC_LIMIT:-}" \
        DELEGATE_HUB_IDLE_TIMEOUT="${DELEGATE_HUB_IDLE_TIMEOUT:-}" \
        DELEGATE_HUB_STUDENT_MEM="${DELEGATE_HUB_STUDENT_MEM:-}" DELEGATE_HUB_STUDENT_CPUS="${DELEGATE_HUB_STUDENT_CPUS:-}" \
        jupyterhub -f /etc/jupyterhub/jupyterhub_config.py
}

case $role in
head) run_head ;;
dbd) run_dbd ;;
worker) run_worker ;;
user) run_user ;;
*) die "unknown role '$role' (head|dbd|worker|user)" ;;
esac

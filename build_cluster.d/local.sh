# shellcheck shell=bash
# build_cluster.d/local.sh -- the single-machine cluster: `./build_cluster.sh
# --local up|stop|status` (the default mode).
#
# Sourced by build_cluster.sh after common.sh (never run by itself). The
# actions are local_up, local_stop and local_status; `up` runs steps 1-7 as
# the header of build_cluster.sh lists them, one section below each:
#   1. Debian packages          local_install_packages
#   2. Slurm config and epilog  local_write_slurm_conf
#      lockdown                 local_install_lockdown (job_submit.lua, the
#                               SPANK plugin, the admin group, sysctls,
#                               hidepid; docs/security.md)
#   3. daemons                  local_start_daemons (munged, dockerd,
#                               slurmctld, slurmd; then waits for the node)
#   4. Rust build and install   local_build_install
#   5. images                   local_build_images (also used by stack.sh)
#   6. site policy              local_install_policy
#      the root agent           local_start_agent
#      the place helper         local_start_place
#   7. demo job                 local_demo
# Daemons this script starts are recorded in $STARTED_FILE so that `stop`
# stops those and nothing else.
#
# Needs from common.sh: log, warn, die, wait_for, need_root, docker_ok,
# MARKER, T0. From build_cluster.sh: REPO and the settings (DELEGATE_*,
# SLURM_CONF).

# The node's GPUs (Slurm GRES "gpu", gres.conf beside slurm.conf):
#   auto           the default: the machine's NVIDIA GPUs (as nvidia below)
#                  when it has any, else none.
#   standin:N      test scaffolding: N stand-in character devices
#                  /dev/delegate-gpu0..N-1 (N <= 4), made here with mknod as
#                  copies of /dev/null, zero, full and urandom (devices every
#                  container has anyway): Slurm allocates them like GPUs and
#                  the root agent passes exactly the allocated ones into the
#                  sandbox. tests/run.sh asks for standin:2, so that CI runs
#                  tests/e2e/test_gpu.py on machines without GPUs.
#   nvidia         the GPU worker profile: every /dev/nvidia<N> of this machine
#                  (NVIDIA driver loaded; the NVIDIA container toolkit, where
#                  installed, also brings the driver's libraries into the
#                  sandbox). A new policy gets max_gpus = their number.
#   /dev/x[0-1]    these device files (a Slurm File= expression).
#   none           no GPUs.
# (the stand-ins, /dev/delegate-gpu<N>: deploy/src/local_gpus.rs)

# "name pid" per daemon this script started (read by `stop` and `status`,
# and by tests/e2e/test_faults.py, which restarts daemons and records the
# new pids in the same format).
STARTED_FILE=$DELEGATE_STATE_DIR/started
# The Debian packages `up` installs when missing.
PACKAGES=(slurmctld slurmd slurm-client munge docker.io debootstrap
          build-essential pkg-config python3-venv python3-pip ca-certificates
          curl procps libslurm-dev lua5.1 mariadb-server mariadb-client slurmdbd btrfs-progs
          libpfm4 logrotate)

# local_pgrep NAME: pids of the processes named NAME in this machine's own
# pid namespace, oldest first -- not those of containers (a swarm stack's
# head and workers run slurmctld, slurmd and munged on the same host).
local_pgrep() {
    local pid ns
    ns=$(readlink /proc/self/ns/pid)
    for pid in $(pgrep -x "$1" || true); do
        if [[ $(readlink "/proc/$pid/ns/pid" 2>/dev/null) == "$ns" ]]; then echo "$pid"; fi
    done
    return 0
}

# record_started NAME PID: remember a daemon we started so `stop` stops it
# and nothing else.
record_started() {
    mkdir -p "$DELEGATE_STATE_DIR"
    # One line per daemon: drop an older entry for the same name.
    { grep -v "^$1 " "$STARTED_FILE" 2>/dev/null || true; echo "$1 $2"; } >"$STARTED_FILE.tmp"
    mv "$STARTED_FILE.tmp" "$STARTED_FILE"
}

# ------------------------------------------------------ 1. Debian packages
# local_install_packages: apt-get install the PACKAGES that are missing
# (refreshing the index only when it is older than a day).
local_install_packages() {
    local missing=()
    mapfile -t missing < <(missing_packages "${PACKAGES[@]}")
    if ((${#missing[@]} == 0)); then
        log "packages: all installed"
        return
    fi
    log "packages: installing ${missing[*]}"
    command -v apt-get >/dev/null || die "apt-get not found: only Debian/Ubuntu are supported"
    # Only refresh the index when it is missing or older than a day.
    if [[ -z $(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -n1) ]]; then
        apt-get update -q || die "apt-get update failed"
    fi
    # The Debian packages try to start their services; in a container or CI
    # VM without systemd that fails harmlessly, and we start them ourselves.
    apt-get install -y -q --no-install-recommends "${missing[@]}" \
        || die "apt-get install ${missing[*]} failed"
}

# --------------------------------------------- 2. Slurm config and epilog
# node_hardware: the hardware line for the node, as slurmd itself detects it (CPUs, sockets,
# cores, threads, RealMemory); falls back to nproc and /proc/meminfo.
node_hardware() {
    local hw
    hw=$(slurmd -C 2>/dev/null | head -n1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ *UpTime=.*//') || true
    if [[ $hw != *CPUs=* || $hw != *RealMemory=* ]]; then
        hw="CPUs=$(nproc) RealMemory=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))"
    fi
    echo "$hw"
}

# install_generated SRC DEST MODE: install SRC as DEST unless DEST exists and
# was not written by us (no marker) -- then stop rather than clobber it.
# Returns 0 when DEST changed, 1 when it was already up to date.
install_generated() {
    local src=$1 dest=$2 mode=$3
    if [[ -e $dest ]]; then
        if [[ $(head -n1 "$dest") != "$MARKER" && $(sed -n 2p "$dest") != "$MARKER" ]]; then
            die "$dest exists and was not written by this script (no marker line).
       Move it away, or put this line at its top to let the script manage it:
       $MARKER"
        fi
        if cmp -s "$src" "$dest"; then
            return 1
        fi
    fi
    install -D -o root -g root -m "$mode" "$src" "$dest"
    return 0
}

# local_gpu_plan: this node's GPUs as DELEGATE_LOCAL_GPUS asks, decided by
# `delegate-deploy local-gpus` (deploy/src/local_gpus.rs) from the node's
# /dev/nvidia<N> minors; here the stand-in devices it names are made (or
# found made). Sets GPU_FILES (gres.conf's File=, empty: none), GPU_COUNT
# and GPU_MAX (a new policy's max_gpus: real GPUs only).
local_gpu_plan() {
    local dev minors=() tmp what a b c have
    for dev in /dev/nvidia[0-9]*; do
        [[ -c $dev && ${dev#/dev/nvidia} =~ ^[0-9]+$ ]] && minors+=(--nvidia "${dev#/dev/nvidia}")
    done
    tmp=$(mktemp -p "$BC_TMP")
    deploy_render "$tmp" local-gpus "${minors[@]}"
    GPU_FILES="" GPU_COUNT=0 GPU_MAX=0
    while read -r what a b c; do
        case $what in
            files) GPU_FILES=$a ;;
            count) GPU_COUNT=$a ;;
            max_gpus) GPU_MAX=$a ;;
            device)
                if [[ -e $a || -L $a ]]; then
                    have=$(stat -c '%F %t:%T' "$a" 2>/dev/null || true)
                    # stat prints major:minor in hex.
                    [[ $have == "character special file $(printf '%x:%x' "$b" "$c")" ]] && continue
                    die "$a exists and is not delegate's stand-in GPU ($b:$c): move it away or set DELEGATE_LOCAL_GPUS"
                fi
                mknod -m 0666 "$a" c "$b" "$c" || die "cannot make the stand-in GPU $a (mknod)"
                ;;
        esac
    done <"$tmp"
    rm -f "$tmp"
}

# Set to 1 by local_write_slurm_conf when slurm.conf changed, so that
# local_start_daemons restarts running Slurm daemons.
SLURM_CONF_CHANGED=0
# local_write_slurm_conf: /etc/slurm/slurm.conf (from the template, for this
# node) and the epilog, both only over files this script wrote; the private
# state and log directories the Slurm daemons use.
local_write_slurm_conf() {
    local node slurmuser tmp gpus
    node=$(hostname -s)
    [[ -n $node ]] || die "hostname -s is empty"
    local_gpu_plan
    gpus=$GPU_COUNT
    slurmuser=root
    id slurm >/dev/null 2>&1 && slurmuser=slurm
    tmp=$(mktemp -p "$BC_TMP")
    deploy_render "$tmp" slurm-conf --shape local --node "$node" --hardware "$(node_hardware)" \
        --gpus "$gpus" --slurm-user "$slurmuser"
    if install_generated "$tmp" "$SLURM_CONF" 0644; then
        SLURM_CONF_CHANGED=1
        log "slurm: wrote $SLURM_CONF (node $node: $(node_hardware), $gpus GPU(s))"
    else
        log "slurm: $SLURM_CONF up to date"
    fi
    rm -f "$tmp"

    # gres.conf beside slurm.conf: the device file of each GPU, in the
    # order Slurm numbers them (the root agent maps the job's GPU indexes
    # through this file; the site policy's gres_conf names it).
    tmp=$(mktemp -p "$BC_TMP")
    deploy_render "$tmp" gres-conf --shape local --node "$node" --gpus "$gpus" --files "$GPU_FILES"
    if install_generated "$tmp" "$(dirname "$SLURM_CONF")/gres.conf" 0644; then
        SLURM_CONF_CHANGED=1
        log "slurm: wrote $(dirname "$SLURM_CONF")/gres.conf (${gpus} GPU(s)${GPU_FILES:+: $GPU_FILES})"
    fi
    rm -f "$tmp"

    local_write_cgroup_conf

    # The epilog: the marker is on its second line (after the #! line).
    tmp=$(mktemp -p "$BC_TMP")
    { head -n1 "$REPO/slurm-conf/epilog.sh"; echo "$MARKER"; tail -n +2 "$REPO/slurm-conf/epilog.sh"; } >"$tmp"
    if install_generated "$tmp" /etc/slurm/delegate-epilog.sh 0755; then
        log "slurm: installed /etc/slurm/delegate-epilog.sh"
    fi
    rm -f "$tmp"

    # Private state and log directories (slurmctld writes as SlurmUser).
    install -d -m 0755 "$DELEGATE_STATE_DIR" "$DELEGATE_STATE_DIR/slurm" "$DELEGATE_RUN_DIR"
    install -d -m 0755 "$DELEGATE_STATE_DIR/slurm/d"
    install -d -m 0700 -o "$slurmuser" "$DELEGATE_STATE_DIR/slurm/ctld"
    private_logs "$DELEGATE_LOG_DIR" slurmctld.log epilog.log slurmd.log dockerd.log agent.log
    chown "$slurmuser" "$DELEGATE_LOG_DIR/slurmctld.log"
    install_logrotate "$DELEGATE_LOG_DIR"
}

# ---------------------------------------------------- 2b. lockdown
# local_install_lockdown: what keeps students to delegate's own jobs and out
# of each other's (docs/security.md, "Only delegate's jobs reach a node" and
# "Privacy"): the admin group, job_submit.lua beside slurm.conf, the SPANK
# plugin built against this Slurm and its plugstack file, the fs.protected_*
# sysctls, and /proc mounted hidepid=invisible (gid = the admin group).
local_install_lockdown() {
    local gid slurm_uid=0 tmp
    getent group "$DELEGATE_ADMIN_GROUP" >/dev/null \
        || groupadd --system "$DELEGATE_ADMIN_GROUP" \
        || die "cannot create the admin group $DELEGATE_ADMIN_GROUP"
    gid=$(getent group "$DELEGATE_ADMIN_GROUP" | cut -d: -f3)
    id slurm >/dev/null 2>&1 && slurm_uid=$(id -u slurm)
    tmp=$(mktemp -p "$BC_TMP")
    deploy_render "$tmp" gate --runner "$DELEGATE_PREFIX/sandbox-runner" --policy "$DELEGATE_POLICY_FILE" \
        --admin-group "$DELEGATE_ADMIN_GROUP" --slurm-uid "$slurm_uid"
    if install_generated "$tmp" "$(dirname "$SLURM_CONF")/job_submit.lua" 0644; then
        log "lockdown: installed $(dirname "$SLURM_CONF")/job_submit.lua (runner $DELEGATE_PREFIX/sandbox-runner, job roots of $DELEGATE_POLICY_FILE, admin group $DELEGATE_ADMIN_GROUP)"
    fi
    rm -f "$tmp"

    # The SPANK plugin, built against this machine's Slurm headers.
    tmp=$(mktemp -d -p "$BC_TMP")
    lockdown_build_spank "$REPO/slurm-conf/spank/delegate_lockdown.c" "$tmp/delegate_lockdown.so"
    if ! cmp -s "$tmp/delegate_lockdown.so" "$DELEGATE_SPANK_PLUGIN"; then
        install -D -o root -g root -m 0755 "$tmp/delegate_lockdown.so" "$DELEGATE_SPANK_PLUGIN"
        log "lockdown: installed $DELEGATE_SPANK_PLUGIN"
    fi
    deploy_render "$tmp/plugstack.conf" plugstack --plugin "$DELEGATE_SPANK_PLUGIN" --admin-gid "$gid" \
        --runner "$DELEGATE_PREFIX/sandbox-runner"
    if install_generated "$tmp/plugstack.conf" "$(dirname "$SLURM_CONF")/delegate-plugstack.conf" 0644; then
        log "lockdown: installed $(dirname "$SLURM_CONF")/delegate-plugstack.conf (admin gid $gid)"
    fi
    rm -rf "$tmp"

    lockdown_sysctls
    if [[ $DELEGATE_HIDEPID == 1 ]]; then
        # Each proc mount is its own instance (Linux >= 5.8): this changes
        # this machine's /proc only, not the containers'. Root and the admin
        # group still see every process.
        if mount -o "remount,hidepid=invisible,gid=$gid" /proc 2>/dev/null; then
            log "lockdown: /proc remounted hidepid=invisible,gid=$gid"
        else
            warn "lockdown: cannot remount /proc with hidepid=invisible (users see each other's processes)"
        fi
    fi
}

# ------------------------------------------------------------- 3. daemons
# munge_ok: munged answers (a credential round-trips).
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
# slurmctld_ok: the controller answers `scontrol ping`.
slurmctld_ok() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

# start_munged: start munged (creating its key on first use) unless it runs
# and answers.
start_munged() {
    if [[ -n $(local_pgrep munged) ]] && munge_ok; then
        log "munged: already running"; return
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "munged: creating /etc/munge/munge.key"
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- munged || die "munged failed to start (see /var/log/munge/munged.log)"
    record_started munged "$(local_pgrep munged | tail -n1)"
    wait_for 20 munged munge_ok || die "munged does not answer (munge -n | unmunge fails)"
}

# start_slurmctld: start the controller unless it answers; die when a
# slurmctld runs but does not answer (the log says why).
start_slurmctld() {
    if slurmctld_ok; then
        log "slurmctld: already running"; return
    fi
    [[ -n $(local_pgrep slurmctld) ]] && die "slurmctld is running but 'scontrol ping' fails; see $DELEGATE_LOG_DIR/slurmctld.log"
    slurmctld -f "$SLURM_CONF" || die "slurmctld failed to start; see $DELEGATE_LOG_DIR/slurmctld.log"
    wait_for "$DELEGATE_WAIT" slurmctld slurmctld_ok \
        || die "slurmctld not answering after ${DELEGATE_WAIT}s; tail $DELEGATE_LOG_DIR/slurmctld.log:
$(tail -n 20 "$DELEGATE_LOG_DIR/slurmctld.log")"
    record_started slurmctld "$(cat "$DELEGATE_RUN_DIR/slurmctld.pid")"
}

# local_cgroup_facts: this node's cgroup hierarchy, whether systemd runs it,
# and its Slurm version, as `delegate-deploy cgroup-conf` options.
local_cgroup_facts() {
    local hierarchy=v1 version
    [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs ]] && hierarchy=v2
    version=$(slurmd -V 2>/dev/null) || die "slurmd -V failed: is slurmd installed?"
    printf '%s\n' --cgroup "$hierarchy" --slurm-version "$version"
    [[ -d /run/systemd/system ]] && printf '%s\n' --systemd
    return 0
}

# local_write_cgroup_conf: cgroup.conf beside slurm.conf for this node's
# facts (docs/operations.md "cgroup v2"); where slurmd makes its own scope
# (cgroup v2 without systemd, Slurm before 23.11) its slice is made first.
local_write_cgroup_conf() {
    local tmp conf facts
    conf=$(dirname "$SLURM_CONF")/cgroup.conf
    mapfile -t facts < <(local_cgroup_facts)
    tmp=$(mktemp -p "$BC_TMP")
    deploy_render "$tmp" cgroup-conf --shape local "${facts[@]}"
    if install_generated "$tmp" "$conf" 0644; then
        SLURM_CONF_CHANGED=1
        log "slurm: wrote $conf (${facts[*]})"
    fi
    rm -f "$tmp"
    if grep -qx 'IgnoreSystemd=yes' "$conf"; then
        slurmd_slice
    fi
}

# slurmd_slice: slurmd's slice with its controllers (cgroup v2 without
# systemd: nothing else makes it; slurm-conf/cgroup-slice.sh).
slurmd_slice() {
    "$REPO/slurm-conf/cgroup-slice.sh" || die "cannot prepare slurmd's cgroup slice"
    log "slurm: /sys/fs/cgroup/system.slice ready for slurmd's own scope (cgroup v2 without systemd)"
}

# start_slurmd: start the node daemon unless one runs.
start_slurmd() {
    if [[ -n $(local_pgrep slurmd) ]]; then
        log "slurmd: already running"; return
    fi
    slurmd -f "$SLURM_CONF" || die "slurmd failed to start; see $DELEGATE_LOG_DIR/slurmd.log"
    wait_for 20 slurmd test -s "$DELEGATE_RUN_DIR/slurmd.pid" \
        || die "slurmd did not write its pid file; see $DELEGATE_LOG_DIR/slurmd.log"
    record_started slurmd "$(cat "$DELEGATE_RUN_DIR/slurmd.pid")"
}

# start_dockerd: start dockerd in the background (no systemd here) unless
# the engine answers, then wait until it does.
start_dockerd() {
    if docker_ok; then
        log "dockerd: already running"; return
    fi
    if [[ -n $(local_pgrep dockerd) ]]; then
        log "dockerd: running but not answering yet, waiting"
    else
        # No systemd here (containers, CI): start it by hand, in the background.
        detached dockerd >>"$DELEGATE_LOG_DIR/dockerd.log" 2>&1 </dev/null
        record_started dockerd $!
    fi
    wait_for "$DELEGATE_WAIT" dockerd docker_ok \
        || die "dockerd not answering after ${DELEGATE_WAIT}s; tail $DELEGATE_LOG_DIR/dockerd.log:
$(tail -n 20 "$DELEGATE_LOG_DIR/dockerd.log")"
}

# stop_recorded NAME PID: stop a daemon we recorded, if that pid still is
# that program (SIGTERM, then SIGKILL after 30 s).
stop_recorded() {
    local name=$1 pid=$2 i
    if [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]]; then
        log "stopping $name (pid $pid)"
        kill "$pid" 2>/dev/null || true
        for ((i = 0; i < 30; i++)); do
            kill -0 "$pid" 2>/dev/null || return 0
            sleep 1
        done
        warn "$name (pid $pid) still running after 30 s; sending SIGKILL"
        kill -9 "$pid" 2>/dev/null || true
    else
        log "$name (pid ${pid:-?}) is no longer running"
    fi
}

# node_state: Slurm's state of this machine's node (idle, down, ...).
node_state() { sinfo -h -N -n "$(hostname -s)" -o '%T' 2>/dev/null | head -n1; }

# local_wait_node: wait until this node can take jobs, resuming it once when
# it is down or drained (a leftover of an earlier run); die after
# DELEGATE_WAIT seconds with sinfo and the slurmd log.
local_wait_node() {
    local node state deadline=$((SECONDS + DELEGATE_WAIT)) resumed=0
    node=$(hostname -s)
    while :; do
        state=$(node_state)
        case $state in
            idle|mixed|allocated|completing) log "node $node: $state"; return ;;
            down*|drain*|fail*)
                if ((resumed == 0)); then
                    log "node $node is $state ($(sinfo -h -N -n "$node" -o '%E')); resuming it"
                    scontrol update nodename="$node" state=resume || true
                    resumed=1
                fi ;;
        esac
        if ((SECONDS >= deadline)); then
            die "node $node is '${state:-unknown}', not idle, after ${DELEGATE_WAIT}s.
$(sinfo -N -l 2>&1)
tail of $DELEGATE_LOG_DIR/slurmd.log:
$(tail -n 15 "$DELEGATE_LOG_DIR/slurmd.log")"
        fi
        sleep 1
    done
}

# local_start_daemons: munged, dockerd, slurmctld and slurmd running (Slurm
# restarted when its configuration changed), and the node ready.
local_start_daemons() {
    # A changed slurm.conf (new template, new hardware) needs a restart of
    # the Slurm daemons (node definitions are not reread by reconfigure).
    if ((SLURM_CONF_CHANGED)) && [[ -n $(local_pgrep slurmctld)$(local_pgrep slurmd) ]]; then
        log "slurm: configuration changed, restarting the Slurm daemons"
        local d
        for d in slurmd slurmctld; do
            local pid; pid=$(local_pgrep "$d" | head -n1)
            [[ -n $pid ]] && stop_recorded "$d" "$pid"
        done
    fi
    start_munged
    start_dockerd
    # DELEGATE_ACCOUNTING=0: no slurmdbd, no associations (slurm.conf says so).
    if [[ $DELEGATE_ACCOUNTING == 1 ]]; then local_start_accounting; fi
    start_slurmctld
    if [[ $DELEGATE_ACCOUNTING == 1 ]]; then local_setup_accounts; fi
    start_slurmd
    local_wait_node
}

# --------------------------------------------------- 4. Rust build/install
# local_build_install: cargo build of the workspace; install `delegate`, the
# unprivileged `sandbox-runner` and the root agent `sandbox-agent` into
# DELEGATE_PREFIX.
local_build_install() {
    command -v cargo >/dev/null || die "cargo not found (looked in \$HOME/.cargo/bin and PATH).
       Install Rust with rustup (https://rustup.rs); Debian's rustc is too old for this workspace."
    log "cargo: building the workspace (release)"
    (cd "$REPO" && cargo build --release --workspace) || die "cargo build failed"
    local t=$REPO/target/release
    if [[ -x $t/delegate ]]; then
        install -o root -g root -m 0755 "$t/delegate" "$DELEGATE_PREFIX/delegate"
        log "installed $DELEGATE_PREFIX/delegate"
    else
        warn "the workspace built no 'delegate' binary yet; CLI not installed"
    fi
    [[ -x $t/sandbox-runner ]] || die "the workspace built no target/release/sandbox-runner"
    [[ -x $t/sandbox-agent ]] || die "the workspace built no target/release/sandbox-agent"
    # The privilege model: students are NOT in the docker group and the
    # runner holds no privilege (no setgid); only the root agent reaches
    # the Docker socket (docs/security.md).
    install -o root -g root -m 0755 "$t/sandbox-runner" "$DELEGATE_PREFIX/sandbox-runner"
    install -o root -g root -m 0755 "$t/sandbox-agent" "$DELEGATE_PREFIX/sandbox-agent"
    log "installed $DELEGATE_PREFIX/sandbox-runner (root:root 0755) and $DELEGATE_PREFIX/sandbox-agent"
    [[ -x $t/delegate-place ]] || die "the workspace built no target/release/delegate-place"
    install -o root -g root -m 0755 "$t/delegate-place" "$DELEGATE_PREFIX/delegate-place"
}

# ------------------------------------------------------ 6b. the agent
# local_new_deployment: forget the node's recorded class (its Slurm
# comment): the agent records the class it finds as the one of this
# deployment, and `delegate admin nodes` names a later change as drift.
local_new_deployment() {
    scontrol update nodename="$(hostname -s)" comment= \
        || warn "cannot clear node $(hostname -s)'s comment: drift is counted from an earlier deployment"
}
# agent_ok: the agent's socket exists.
agent_ok() { [[ -S $DELEGATE_AGENT_SOCKET ]]; }
# local_start_agent: (re)start the root agent, the only holder of the Docker
# socket; it logs to $DELEGATE_LOG_DIR/agent.log (its own file).
local_start_agent() {
    local pid
    pid=$(awk '$1 == "sandbox-agent" { print $2 }' "$STARTED_FILE" 2>/dev/null || true)
    if [[ -n $pid ]]; then
        stop_recorded sandbox-agent "$pid"
    fi
    rm -f "$DELEGATE_AGENT_SOCKET"
    DELEGATE_AGENT_LOG=$DELEGATE_LOG_DIR/agent.log SLURM_CONF=$SLURM_CONF \
        detached "$DELEGATE_PREFIX/sandbox-agent" </dev/null >>"$DELEGATE_LOG_DIR/agent.log" 2>&1
    record_started sandbox-agent $!
    wait_for 20 sandbox-agent agent_ok \
        || die "sandbox-agent did not open $DELEGATE_AGENT_SOCKET; tail $DELEGATE_LOG_DIR/agent.log:
$(tail -n 20 "$DELEGATE_LOG_DIR/agent.log")"
    log "sandbox-agent: listening on $DELEGATE_AGENT_SOCKET (log $DELEGATE_LOG_DIR/agent.log)"
}

# ------------------------------------------------------ 6c. the place helper
# local_start_place: (re)start delegate-place, which tells each student
# where their waiting jobs stand in Slurm's queue (students do not see other
# users' jobs). It runs as Slurm's user (who sees every job, and is given
# nothing more) from a directory only it writes; log place.log.
local_start_place() {
    local pid user socket
    pid=$(awk '$1 == "delegate-place" { print $2 }' "$STARTED_FILE" 2>/dev/null || true)
    [[ -z $pid ]] || stop_recorded delegate-place "$pid"
    user=root
    id slurm >/dev/null 2>&1 && user=slurm
    socket=$("$DELEGATE_PREFIX/delegate-place" --print-socket) || die "delegate-place --print-socket failed"
    install -d -o "$user" -g root -m 0755 "$(dirname "$socket")"
    rm -f "$socket"
    private_logs "$DELEGATE_LOG_DIR" place.log
    SLURM_CONF=$SLURM_CONF detached setpriv --reuid="$user" --regid="$user" --init-groups \
        "$DELEGATE_PREFIX/delegate-place" </dev/null >>"$DELEGATE_LOG_DIR/place.log" 2>&1
    record_started delegate-place $!
    wait_for 20 delegate-place test -S "$socket" \
        || die "delegate-place did not open $socket; tail $DELEGATE_LOG_DIR/place.log:
$(tail -n 20 "$DELEGATE_LOG_DIR/place.log")"
    log "delegate-place: listening on $socket as $user (log $DELEGATE_LOG_DIR/place.log)"
}

# ------------------------------------------------------------- 5. images
# local_build_images: the base image (present, pulled or debootstrapped) and
# the sandbox image jobs run in (a cached docker build). stack.sh builds the
# same two images through this function.
local_build_images() {
    if docker image inspect "$DELEGATE_BASE_IMAGE" >/dev/null 2>&1; then
        log "image $DELEGATE_BASE_IMAGE: present"
    elif timeout 30 docker pull -q "$DELEGATE_BASE_IMAGE" >/dev/null 2>&1; then
        log "image $DELEGATE_BASE_IMAGE: pulled"
    else
        build_base_image
    fi
    log "image $DELEGATE_SANDBOX_IMAGE: building from docker/sandbox.Dockerfile (cached)"
    # The context is only what the image needs: docker/, the Python executor,
    # the pyproject.toml that pins cloudpickle, and that cloudpickle's wheel
    # (downloaded here: the image build has no pip and trusts no proxy CA).
    local pin wheels
    pin=$(python3 -c 'import sys, tomllib; d = tomllib.load(open(sys.argv[1], "rb")); print(*[r for r in d["project"]["dependencies"] if r.startswith("cloudpickle==")])' \
        "$REPO/python/pyproject.toml") || die "cannot read the cloudpickle pin from python/pyproject.toml"
    wheels=$(mktemp -d -p "$BC_TMP")
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheels/wheels" "$pin" \
        || die "cannot download $pin (pip download)"
    if [[ $DELEGATE_SANDBOX_CFIDDLE == 1 ]]; then
        sandbox_cfiddle_wheels "$wheels/wheels-cfiddle" || { rm -rf "$wheels"; die "cannot download the CFiddle wheels"; }
    else
        log "image $DELEGATE_SANDBOX_IMAGE: without CFiddle (DELEGATE_SANDBOX_CFIDDLE=0)"
        install -d "$wheels/wheels-cfiddle"
    fi
    tar --exclude=__pycache__ -c -C "$REPO" docker python/pyproject.toml python/pysrc/delegate_sandbox \
        python/requirements-cfiddle.txt -C "$wheels" wheels wheels-cfiddle \
        | docker build -q --build-arg "BASE_IMAGE=$DELEGATE_BASE_IMAGE" --build-arg "CFIDDLE=$DELEGATE_SANDBOX_CFIDDLE" \
            --label "org.delegate.source=$(sandbox_source_hash)" \
            -t "$DELEGATE_SANDBOX_IMAGE" -f docker/sandbox.Dockerfile - \
        || { rm -rf "$wheels"; die "docker build of $DELEGATE_SANDBOX_IMAGE failed"; }
    rm -rf "$wheels"
}

# sandbox_source_hash: one hash of what the sandbox image is built from
# (its Dockerfile, the Python executor, the pins), its label
# org.delegate.source: a deploy rebuilds an image of other sources.
sandbox_source_hash() {
    (cd "$REPO" && find docker/sandbox.Dockerfile python/pyproject.toml python/requirements-cfiddle.txt \
        python/pysrc/delegate_sandbox -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
        | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}

# sandbox_cfiddle_wheels DIR: the wheels of python/requirements-cfiddle.txt
# (CFiddle and its run-time needs, pinned there) for the sandbox's Python
# (asked of the base image) into DIR, through a cache so a rebuild
# downloads nothing.
sandbox_cfiddle_wheels() {
    local dir=$1 cache=$DELEGATE_CACHE_DIR/sandbox-wheels py arch
    py=$(docker run --rm --network none --entrypoint python3 "$DELEGATE_BASE_IMAGE" \
        -c 'import sys; print("%d.%d" % sys.version_info[:2])') || return 1
    arch=$(uname -m)
    install -d -m 0755 "$cache" "$dir"
    log "wheels: CFiddle's pins (python/requirements-cfiddle.txt) for Python $py $arch (cache $cache)"
    python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp \
        --python-version "$py" --platform "manylinux2014_$arch" --platform "manylinux_2_28_$arch" \
        -d "$cache" -r "$REPO/python/requirements-cfiddle.txt" || return 1
    # Only the pinned files (the cache may hold older pins).
    python3 - "$REPO/python/requirements-cfiddle.txt" "$cache" "$dir" "cp${py/./}" "$arch" <<'PY' || return 1
import pathlib, re, shutil, sys
req, cache, out = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
pytag, arch = sys.argv[4], sys.argv[5]
def fits(w):
    py, abi, plat = w.name[: -len(".whl")].split("-")[-3:]
    tags = py.split(".")
    # A stable-ABI wheel (abi3) of an older CPython runs on this one too.
    stable = abi == "abi3" and any(t.startswith("cp3") and int(t[3:]) <= int(pytag[3:]) for t in tags)
    return (pytag in tags or "py3" in tags or stable) and (plat == "any" or arch in plat)
for line in open(req):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, ver = line.split("==")
    norm = re.sub(r"[-_.]+", "_", name).lower()
    hits = [w for w in cache.glob("*.whl") if re.sub(r"[-_.]+", "_", w.name.split("-")[0]).lower() == norm and w.name.split("-")[1] == ver and fits(w)]
    if not hits:
        sys.exit("no wheel of %s in %s" % (line, cache))
    shutil.copy(hits[0], out / hits[0].name)
PY
}

# build_base_image: no registry: debootstrap a minimal Debian with python3 and import it. The
# rootfs tarball is cached so a rebuilt Docker engine imports it in seconds.
build_base_image() {
    local tarball=$DELEGATE_CACHE_DIR/${DELEGATE_BASE_IMAGE//[:\/]/_}.tar dir
    install -d -m 0755 "$DELEGATE_CACHE_DIR"
    if [[ ! -s $tarball ]]; then
        command -v debootstrap >/dev/null || die "debootstrap not installed"
        dir=$(mktemp -d "$DELEGATE_CACHE_DIR/rootfs.XXXXXX")
        private_logs "$DELEGATE_LOG_DIR" debootstrap.log
        log "image $DELEGATE_BASE_IMAGE: not pullable; debootstrap $DELEGATE_BASE_SUITE (~1 min, log $DELEGATE_LOG_DIR/debootstrap.log)"
        if ! debootstrap --variant=minbase --include=python3 "$DELEGATE_BASE_SUITE" "$dir" \
                "$DELEGATE_DEBIAN_MIRROR" >"$DELEGATE_LOG_DIR/debootstrap.log" 2>&1; then
            rm -rf "$dir"
            die "debootstrap failed; see $DELEGATE_LOG_DIR/debootstrap.log"
        fi
        rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
        tar --numeric-owner -C "$dir" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
        rm -rf "$dir"
    fi
    log "image $DELEGATE_BASE_IMAGE: importing $tarball"
    docker import "$tarball" "$DELEGATE_BASE_IMAGE" >/dev/null || die "docker import failed"
}

# ------------------------------------------------------ 6. site policy
# local_install_policy: write the site policy from its template, once: an
# existing policy file (the site's own edits) is never replaced.
local_install_policy() {
    # What this machine is, for `delegate doctor`: every role at once.
    install -d -m 0755 /etc/delegate
    echo single >/etc/delegate/node-role
    chmod 0644 /etc/delegate/node-role
    if [[ -e $DELEGATE_POLICY_FILE ]]; then
        log "policy: $DELEGATE_POLICY_FILE exists, left as it is"
        return
    fi
    local tmp max_gpus=0
    # Real GPUs (the GPU worker profile, or device files named): jobs may
    # use them all. Stand-ins are for tests, which set max_gpus themselves.
    local_gpu_plan
    max_gpus=$GPU_MAX
    tmp=$(mktemp -p "$BC_TMP")
    # max_mem: DELEGATE_MAX_MEM, else 3/4 of the machine's memory.
    deploy_render "$tmp" policy --shape local --max-gpus "$max_gpus"
    install -D -o root -g root -m 0644 "$tmp" "$DELEGATE_POLICY_FILE"
    rm -f "$tmp"
    log "policy: wrote $DELEGATE_POLICY_FILE ($(grep -E '^max_(cpus|mem|time|gpus) =' "$DELEGATE_POLICY_FILE" | tr -d '"' | tr '\n' ' '))"
}

# --------------------------------------------------------- 7. demo job
# demo_id_free ID: ID is a number that no account holds as its uid and no
# group as its gid.
demo_id_free() {
    [[ $1 =~ ^[0-9]+$ ]] && ! getent passwd "$1" >/dev/null && ! getent group "$1" >/dev/null
}

# demo_user: print the account the demo job runs as: DELEGATE_DEMO_USER,
# else $SUDO_USER when it is a real user, else delegate-demo. An existing
# account is used as it is and never changed. A missing one is created with
# a home under /home: with DELEGATE_DEMO_UID as its uid and gid when that id
# is free as both, else with ids useradd picks among the free ones -- so it
# never takes the id of another account or group. Anything useradd/groupadd
# print goes to stderr (stdout is the name).
demo_user() {
    local u=$DELEGATE_DEMO_USER
    if [[ -z $u && -n ${SUDO_USER:-} && $SUDO_USER != root ]]; then
        u=$SUDO_USER
    fi
    u=${u:-delegate-demo}
    if ! id "$u" >/dev/null 2>&1; then
        local idopt=()
        if getent group "$u" >/dev/null; then
            # A group of that name is left over (an earlier demo user, or a
            # useradd that failed after our groupadd): the account gets it as
            # its primary group; the group itself is not changed.
            idopt=(--gid "$u")
            if [[ $DELEGATE_DEMO_UID =~ ^[0-9]+$ ]] && ! getent passwd "$DELEGATE_DEMO_UID" >/dev/null; then
                idopt+=(--uid "$DELEGATE_DEMO_UID")
            fi
        elif demo_id_free "$DELEGATE_DEMO_UID"; then
            # The same id from run to run on a machine, when it is free.
            idopt=(--uid "$DELEGATE_DEMO_UID" --gid "$DELEGATE_DEMO_UID")
            groupadd --gid "$DELEGATE_DEMO_UID" "$u" >&2 || die "cannot create group $u"
        fi
        # Without --uid/--gid, useradd takes the next free uid and a new group
        # of the user's name.
        useradd --create-home --home-dir "/home/$u" --shell /bin/bash "${idopt[@]}" "$u" >&2 \
            || die "cannot create demo user $u"
    fi
    [[ $(id -u "$u") -ne 0 ]] || die "the demo user must not be root"
    echo "$u"
}

# local_demo: as the demo user, submit a command job with the CLI, check
# its output came back with the user's uid, then print `delegate doctor`.
local_demo() {
    if [[ $DELEGATE_SKIP_DEMO == 1 ]]; then
        warn "DELEGATE_SKIP_DEMO=1: demo job skipped"
        return
    fi
    command -v delegate >/dev/null || die "the delegate CLI is not installed; cannot run the demo job
       (set DELEGATE_SKIP_DEMO=1 to skip it)"
    local u home
    u=$(demo_user)
    # Where accounting is enforced, the demo user needs an association.
    if [[ $DELEGATE_ACCOUNTING == 1 ]]; then
        add_association "$u" || die "cannot give the demo user $u a Slurm association"
    fi
    home=$(getent passwd "$u" | cut -d: -f6)
    # As that user, in their home and with their HOME (runuser keeps root's
    # environment otherwise): the CLI keeps job dirs under ~/.delegate.
    as_user() {
        (cd "$home" && runuser -u "$u" -- env HOME="$home" USER="$u" LOGNAME="$u" "$@")
    }
    log "demo: delegate submit --wait, as $u"
    local out
    # shellcheck disable=SC2016  # $(...) is for the job's shell to expand, on the node
    out=$(as_user delegate submit --wait -- sh -c 'echo hello from $(hostname) as uid $(id -u)' 2>&1) \
        || die "the demo job failed (as $u):
$out
       see 'delegate doctor' and $DELEGATE_LOG_DIR/"
    printf '%s\n' "$out"
    # The job's stdout must have come back, with the user's uid.
    grep -q "hello from .* as uid $(id -u "$u")" <<<"$out" \
        || die "the demo job did not print the expected 'hello from ... as uid $(id -u "$u")'"
    log "demo: delegate doctor, as $u"
    as_user delegate doctor || die "delegate doctor reports a problem"
}

# ------------------------------------------------------------ actions
# local_images: `--local images`, step 5 alone: the base and sandbox images
# (DELEGATE_BASE_IMAGE, DELEGATE_SANDBOX_IMAGE, DELEGATE_SANDBOX_CFIDDLE),
# e.g. a sandbox image on another Debian for a site (docs/existing-site.md).
local_images() {
    need_root images
    install -d -m 0755 "$DELEGATE_LOG_DIR"
    local_build_images
}

# local_up: `--local up`, steps 1-7 (see the top of this file).
local_up() {
    need_root up
    install -d -m 0755 "$DELEGATE_STATE_DIR" "$DELEGATE_RUN_DIR"
    private_logs "$DELEGATE_LOG_DIR"
    local_install_packages
    local_write_slurm_conf
    local_install_lockdown
    local_start_daemons
    local_build_install
    local_build_images
    local_install_policy
    local_new_deployment
    local_start_agent
    local_start_place
    local_demo
    private_logs "$DELEGATE_LOG_DIR"
    log "up: done in $((SECONDS - T0)) s"
}

# local_stop: `--local stop`, the daemons this script started (recorded in
# STARTED_FILE), newest first; configuration, images and binaries stay.
local_stop() {
    need_root stop
    if [[ ! -s $STARTED_FILE ]]; then
        log "stop: nothing recorded in $STARTED_FILE; nothing to stop"
        return
    fi
    # Reverse order of starting: sandbox-agent, slurmd, slurmctld, slurmdbd,
    # mariadbd, dockerd, munged.
    local name pid
    tac "$STARTED_FILE" | while read -r name pid; do
        stop_recorded "$name" "$pid"
    done
    rm -f "$STARTED_FILE"
    log "stop: done (configuration, images and binaries left in place)"
}

# local_status: `--local status`, daemons, Slurm's view and the images.
local_status() {
    local d pids
    for d in munged dockerd mariadbd slurmdbd slurmctld slurmd sandbox-agent delegate-place; do
        pids=$(local_pgrep "$d" | tr '\n' ' ')
        printf '%-10s %s\n' "$d" "${pids:-(not running)}"
    done
    echo "started by this script: $( { [[ -s $STARTED_FILE ]] && tr "\n" " " <"$STARTED_FILE"; } || echo none)"
    scontrol ping 2>&1 || true
    sinfo -N -l 2>&1 || true
    squeue 2>&1 || true
    docker images --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.CreatedSince}}' 2>&1 \
        | grep -E "^(${DELEGATE_BASE_IMAGE}|${DELEGATE_SANDBOX_IMAGE}) " || echo "no delegate images"
}

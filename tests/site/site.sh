#!/bin/bash
# tests/site/site.sh -- a Slurm site delegate did not build: Debian 13, its
# own Slurm 24.11 and munge from Debian's archive, in three containers on
# this host's Docker engine, with delegate's Debian packages installed into
# it the way docs/existing-site.md tells a site admin.
#
#   tests/site/site.sh up      build (cached), start, install, configure
#   tests/site/site.sh down    remove the containers and the site's files
#   tests/site/site.sh base    only the Debian 13 base image (debootstrap,
#                              cached), which tests/machines/ builds on too
#
# The site (its own configuration, written before delegate comes):
#   ctl  slurmctld, and the login node users run commands on
#   g1   partition `general` (Default): the researchers' node, plain Slurm
#   c1   partition `course`: delegate's node (the agent, the SPANK plugin)
#   its own job_submit.lua (a rule of its own: a job without a time limit
#   gets 60 minutes; delegate's block is added to it as the docs say), its own epilog (Epilog=/etc/slurm/epilog.d/*),
#   Debian's plugstack.conf (which includes plugstack.conf.d/*.conf).
# Users: alice (student, uid 4201), rita (researcher, 4202), ada (group
# delegate-admin, 4203); homes in /srv/delegate-site/home, the same path
# on the host (the host's engine mounts job directories from there).
# Then delegate: `./build_cluster.sh packages` against trixie's Slurm
# headers; ctl gets delegate + delegate-controller, c1 delegate +
# delegate-node, g1 nothing; the site admin's lines (policy, the gate module
# and three lines of job_submit.lua, one plugstack.conf.d file, one epilog
# link, the agent's service, the place helper's service on the login node).
# tests/site/test_site.py is the suite.
set -euo pipefail

REPO=$(cd "$(dirname "$(readlink -f -- "${BASH_SOURCE[0]}")")/../.." && pwd)
HERE=$REPO/tests/site
ROOT=/srv/delegate-site
STAGING=/run/delegate-site/c1
NET=delegate-site
CACHE=${DELEGATE_CACHE_DIR:-/var/cache/delegate}
MIRROR=${DELEGATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=delegate-site-base:trixie
IMAGE=delegate-site-slurm:trixie
SANDBOX=delegate-sandbox:trixie
NODES=(ctl g1 c1)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/delegate-site.XXXXXX")
trap 'rm -rf -- "$TMP"' EXIT

log() { printf '%s [site] %s\n' "$(date '+%H:%M:%S')" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }
# on NODE CMD...: CMD as root in the site's container NODE.
on() { local n=$1; shift; docker exec "site-$n" "$@"; }

base_image() {
    docker image inspect "$BASE" >/dev/null 2>&1 && return
    local tar=$CACHE/delegate-site-base_trixie.tar dir
    if [[ ! -s $tar ]]; then
        command -v debootstrap >/dev/null || die "debootstrap is not installed"
        install -d -m 0755 "$CACHE"
        dir=$(mktemp -d "$CACHE/site-rootfs.XXXXXX")
        log "debootstrap trixie (a few minutes; log $TMP/debootstrap.log)"
        debootstrap --variant=minbase --include=python3,ca-certificates trixie "$dir" "$MIRROR" \
            >"$TMP/debootstrap.log" 2>&1 || { tail -n 20 "$TMP/debootstrap.log"; rm -rf "$dir"; die "debootstrap failed"; }
        rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
        tar --numeric-owner -C "$dir" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
        rm -rf "$dir"
    fi
    docker import "$tar" "$BASE" >/dev/null || die "docker import of $tar failed"
}

# packages: delegate's packages, the SPANK plugin built against the site's
# Slurm headers (copied out of the site's image).
packages() {
    local cid
    cid=$(docker create "$IMAGE" true)
    docker cp "$cid:/usr/include/slurm" "$TMP/slurm-headers" >/dev/null \
        || { docker rm "$cid" >/dev/null; die "cannot copy the Slurm headers out of $IMAGE"; }
    docker rm "$cid" >/dev/null
    rm -rf "$ROOT/debs"
    "$REPO/build_cluster.sh" packages --slurm-headers "$TMP/slurm-headers" --out "$ROOT/debs" \
        || die "./build_cluster.sh packages failed"
}

# site_files: the site's own configuration, before delegate.
site_files() {
    install -d -m 0755 "$ROOT/etc" "$ROOT/home"
    [[ -s $ROOT/munge.key ]] || { head -c 1024 /dev/urandom >"$ROOT/munge.key"; chmod 0400 "$ROOT/munge.key"; }
    cp "$HERE/slurm.conf" "$HERE/job_submit.lua" "$HERE/epilog-site.sh" "$ROOT/etc/"
}

start_node() {
    local n=$1 extra=()
    if [[ $n == c1 ]]; then
        # As the stack's workers (docs/deployment.md): the host's engine and
        # /proc in a root-only directory, the staging directory shared back.
        install -d -m 0700 "$STAGING"
        if ! findmnt -n --mountpoint "$STAGING" >/dev/null; then
            mount --bind "$STAGING" "$STAGING" || die "cannot bind-mount $STAGING onto itself"
            mount --make-rshared "$STAGING" || die "cannot make $STAGING a shared mount"
        fi
        extra=(--cap-add SYS_ADMIN --cap-add SYS_PTRACE
            -v /var/run/docker.sock:/run/delegate-engine/docker.sock
            -v /proc:/run/delegate-engine/proc:ro
            --mount "type=bind,source=$STAGING,target=/run/delegate/jobs,bind-propagation=rshared")
    fi
    docker run -d --name "site-$n" --hostname "$n" --network "$NET" \
        -v "$ROOT/etc:/etc/site:ro" -v "$ROOT/home:$ROOT/home" -v "$ROOT/debs:/debs:ro" \
        "${extra[@]}" --entrypoint sleep "$IMAGE" infinity >/dev/null
    docker cp "$ROOT/munge.key" "site-$n:/etc/munge/munge.key"
    # shellcheck disable=SC2016 # expanded in the container
    on "$n" sh -c '
        set -e
        chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
        install -m 0644 /etc/site/slurm.conf /etc/slurm/slurm.conf
        install -m 0644 /etc/site/job_submit.lua /etc/slurm/job_submit.lua
        install -d -m 0755 /etc/slurm/epilog.d /var/log/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd
        install -m 0755 /etc/site/epilog-site.sh /etc/slurm/epilog.d/10-site.sh
        chown slurm:slurm /var/lib/slurm/slurmctld /var/log/slurm
        groupadd -g 4300 delegate-admin
        for u in alice:4201 rita:4202 ada:4203; do
            useradd -M -d /srv/delegate-site/home/${u%%:*} -u ${u##*:} -U -s /bin/bash ${u%%:*}
        done
        usermod -aG delegate-admin ada
        install -d -m 0755 /run/munge && chown munge:munge /run/munge
        runuser -u munge -- munged'
}

# the users' homes on the shared filesystem (0700, their own).
homes() {
    local u uid
    for u in alice:4201 rita:4202 ada:4203; do
        uid=${u##*:}
        install -d -m 0700 -o "$uid" -g "$uid" "$ROOT/home/${u%%:*}"
    done
}

# checksums NODE: the site's Slurm files, one `sha256 path` line each.
checksums() { on "$1" sh -c 'find /etc/slurm -type f -print0 | sort -z | xargs -0 sha256sum'; }

# install_delegate: the packages, then the site admin's lines
# (docs/existing-site.md), node by node.
install_delegate() {
    local n before
    for n in ctl c1; do
        before=$(checksums "$n")
        case $n in
            ctl) on ctl sh -c 'dpkg -i /debs/delegate_*.deb /debs/delegate-controller_*.deb' >/dev/null ;;
            c1) on c1 sh -c 'dpkg -i /debs/delegate_*.deb /debs/delegate-node_*.deb' >/dev/null ;;
        esac
        [[ $(checksums "$n") == "$before" ]] || die "installing delegate's packages on $n changed the site's /etc/slurm"
        checksums "$n" >"$ROOT/etc-slurm-after-dpkg.$n"
    done
    # Every node that runs delegate's client or its jobs: the site policy.
    for n in ctl c1; do
        on "$n" install -d -m 0755 /etc/delegate
        docker cp "$HERE/policy.toml" "site-$n:/etc/delegate/policy.toml"
        on "$n" sh -c 'chown root:root /etc/delegate/policy.toml && chmod 0644 /etc/delegate/policy.toml'
    done
    # What each node is, for `delegate doctor`: ctl is the users' login node.
    on ctl sh -c 'echo user >/etc/delegate/node-role'
    on c1 sh -c 'echo worker >/etc/delegate/node-role'
    # slurmctld's host: the gate as a module, and the site's job_submit.lua
    # calling it (the example shows the three lines).
    # shellcheck disable=SC2016 # expanded in the container
    on ctl sh -c 'set -e
        delegate-deploy gate --module --policy /etc/delegate/policy.toml \
            --admin-group delegate-admin --slurm-uid "$(id -u slurm)" >/etc/slurm/delegate_gate.lua.new
        mv /etc/slurm/delegate_gate.lua.new /etc/slurm/delegate_gate.lua
        f=/etc/slurm/job_submit.lua
        sed -i "s/^function slurm_job_submit(/local function site_job_submit(/; s/^function slurm_job_modify(/local function site_job_modify(/" "$f"
        sed -n "/^-- delegate: begin\$/,/^-- delegate: end\$/p" /usr/share/delegate/site_job_submit.example.lua >/tmp/delegate-block
        last=$(grep -n "^return" "$f" | tail -n 1 | cut -d: -f1)
        if [ -n "$last" ]; then sed -i "$((last - 1))r /tmp/delegate-block" "$f"; else cat /tmp/delegate-block >>"$f"; fi'
    # delegate's node: the SPANK line in plugstack.conf.d, the epilog beside
    # the site's, the agent's service (no systemd in a container: started
    # with the unit's own ExecStart and Environment).
    # shellcheck disable=SC2016 # expanded in the container
    on c1 sh -c 'delegate-deploy plugstack --plugin /usr/lib/delegate/delegate_lockdown.so \
            --admin-gid "$(getent group delegate-admin | cut -d: -f3)" --runner /usr/bin/sandbox-runner \
            --node c1 >/etc/slurm/plugstack.conf.d/delegate.conf
        ln -sfn /usr/lib/delegate/epilog.sh /etc/slurm/epilog.d/50-delegate
        chown root:root /run/delegate-engine && chmod 0700 /run/delegate-engine
        ln -sfn /run/delegate-engine/docker.sock /var/run/docker.sock
        printf "staging_host_dir = \"%s\"\nhost_proc = \"/run/delegate-engine/proc\"\n" '"$STAGING"' >>/etc/delegate/policy.toml'
    start_agent
}

# start_agent: c1's agent as delegate-agent.service starts it.
start_agent() {
    local unit=/usr/lib/systemd/system/delegate-agent.service exec env
    exec=$(on c1 sed -n 's/^ExecStart=//p' "$unit")
    env=$(on c1 sed -n 's/^Environment=//p' "$unit")
    [[ -n $exec ]] || die "c1: $unit has no ExecStart"
    on c1 sh -c "env $env setsid -f $exec </dev/null >/dev/null 2>&1"
    wait_socket c1 /run/delegate/agent.sock \
        || die "c1: the agent did not open /run/delegate/agent.sock: $(on c1 tail -n 20 /var/log/delegate/agent.log)"
}

# wait_socket NODE PATH: until PATH is a socket on NODE; 1 when it is not
# one after 10 s.
wait_socket() {
    local deadline=$((SECONDS + 10))
    until on "$1" test -S "$2"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.25
    done
}

# start_place: ctl's place helper as delegate-place.service starts it (no
# systemd in a container): the unit's RuntimeDirectory made as systemd
# makes it, then its ExecStart as its User.
start_place() {
    local unit=/usr/lib/systemd/system/delegate-place.service exec user dir mode socket
    exec=$(on ctl sed -n 's/^ExecStart=//p' "$unit")
    user=$(on ctl sed -n 's/^User=//p' "$unit")
    dir=$(on ctl sed -n 's/^RuntimeDirectory=//p' "$unit")
    mode=$(on ctl sed -n 's/^RuntimeDirectoryMode=//p' "$unit")
    [[ -n $exec && -n $user && -n $dir ]] || die "ctl: $unit has no ExecStart, User or RuntimeDirectory"
    socket=$(on ctl "$exec" --print-socket) || die "ctl: $exec --print-socket failed"
    [[ $socket == /run/$dir/* ]] || die "ctl: the helper's socket $socket is not in its RuntimeDirectory /run/$dir"
    on ctl install -d -m "${mode:-0755}" -o "$user" -g "$user" "/run/$dir"
    on ctl sh -c "setsid -f runuser -u $user -- $exec </dev/null >>/var/log/delegate-place.log 2>&1"
    wait_socket ctl "$socket" \
        || die "ctl: the place helper did not open $socket: $(on ctl tail -n 20 /var/log/delegate-place.log)"
}

start_slurm() {
    on ctl sh -c 'slurmctld' || die "slurmctld did not start: $(on ctl tail -n 20 /var/log/slurm/slurmctld.log)"
    on g1 slurmd || die "g1: slurmd did not start"
    on c1 slurmd || die "c1: slurmd did not start"
    for _ in $(seq 60); do
        if [[ $(on ctl sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$') == 2 ]]; then
            log "up: $(on ctl sinfo -h -o '%P %N %t' | tr '\n' ' ')"
            return
        fi
        sleep 1
    done
    die "the nodes are not idle: $(on ctl sinfo -N 2>&1) $(on c1 tail -n 5 /var/log/slurm/slurmd.log)"
}

up() {
    [[ $(id -u) -eq 0 ]] || die "run as root"
    down
    base_image
    log "image $IMAGE (tests/site/site.Dockerfile; cached)"
    docker build -t "$IMAGE" --build-arg "BASE_IMAGE=$BASE" -f "$HERE/site.Dockerfile" "$HERE" \
        >"$TMP/build.log" 2>&1 || { tail -n 30 "$TMP/build.log"; die "docker build of $IMAGE failed"; }
    log "delegate's packages for Slurm 24.11 (./build_cluster.sh packages)"
    packages
    # The sandbox on the students' Python (Debian 13's 3.13): the calls'
    # Python must be the sandbox's. CFiddle's pins have no 3.13 wheels.
    log "image $SANDBOX (./build_cluster.sh --local images on $BASE, without CFiddle)"
    DELEGATE_BASE_IMAGE=$BASE DELEGATE_SANDBOX_IMAGE=$SANDBOX DELEGATE_SANDBOX_CFIDDLE=0 \
        "$REPO/build_cluster.sh" --local images >"$TMP/images.log" 2>&1 \
        || { tail -n 30 "$TMP/images.log"; die "the sandbox image $SANDBOX did not build"; }
    site_files
    homes
    docker network create "$NET" >/dev/null
    local n
    for n in "${NODES[@]}"; do start_node "$n"; done
    install_delegate
    start_slurm
    start_place
}

down() {
    local n
    for n in "${NODES[@]}"; do docker rm -f "site-$n" >/dev/null 2>&1 || true; done
    docker network rm "$NET" >/dev/null 2>&1 || true
    # Sandboxes the agent started that outlived it.
    docker ps -aq --filter label=delegate.node=c1 | xargs -r docker rm -f >/dev/null 2>&1 || true
    if findmnt -n --mountpoint "$STAGING" >/dev/null; then umount -R "$STAGING" || true; fi
    rm -rf "$ROOT"
}

case ${1:-} in
    up) up ;;
    down) down ;;
    base) base_image ;;
    *) echo "usage: tests/site/site.sh up|down|base" >&2; exit 2 ;;
esac

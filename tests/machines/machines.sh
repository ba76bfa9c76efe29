#!/bin/bash
# tests/machines/machines.sh -- worker machines emulated the way kind
# emulates Kubernetes nodes: each a container with its own hostname and
# address on a private network, its own Docker engine (its own images,
# containers and sandboxes) and an ssh server, nothing of delegate in it.
# This host is the manager: the instructor's machine, with the checkout,
# cargo, the images and the swarm's manager engine. The machines are not
# containers of that engine but of a second one, the machines' own
# (ENGINE_SOCK, its bridge BRIDGE, no iptables of its own: `up` lets the
# bridge's traffic through FORWARD), so the manager's engine can be stopped
# and started, as when the manager restarts, while the machines run on.
#
#   tests/machines/machines.sh up      build the machine image (cached),
#                                      start the home's server and the
#                                      machines, mount the home on them and
#                                      on this host, authorize the
#                                      manager's ssh key on the machines
#   tests/machines/machines.sh down    remove them, their engines' data,
#                                      the home's volume (unmounted here),
#                                      the network and the key
#   tests/machines/machines.sh ssh     print the ssh command the manager
#                                      uses (DELEGATE_MACHINE_SSH)
#   tests/machines/machines.sh home    mount the home on this host (as at
#                                      its boot) unless it is mounted
#   tests/machines/machines.sh docker ARG...
#                                      docker ARG... on the machines' engine
#                                      (`docker exec m1 ...`)
#
# The machines (MACHINES): m1 Debian 12 with its docker.io 20.10, m2 Debian
# 13 with its docker.io 26. The home (DELEGATE_STACK_HOME) is served over
# the network by the machine `home` (GlusterFS, Debian's glusterfs-server:
# a user-space server; this kernel has no NFS) and mounted at the same
# path on every machine and on this host (the manager, where the user node
# runs) by its FUSE client with NFS-like caches: attributes 3 s, entries
# and negative lookups 30 s (HOME_CACHE), so each side sees the other's
# writes late. The server squashes no uid. The machines run
# unprivileged with every capability but CAP_SYS_RESOURCE (which this host's
# own root lacks, so `docker run --privileged` fails here), unconfined, with
# every device allowed: what a nested engine needs (the init remounts the
# cgroup hierarchies writable, machine-entrypoint.sh).
set -euo pipefail

REPO=$(cd "$(dirname "$(readlink -f -- "${BASH_SOURCE[0]}")")/../.." && pwd)
HERE=$REPO/tests/machines
NET=${DELEGATE_MACHINES_NET:-delegate-machines}
SUBNET=${DELEGATE_MACHINES_SUBNET:-172.31.90.0/24}
HOME_DIR=${DELEGATE_STACK_HOME:-/srv/delegate-stack/home}
STATE=${DELEGATE_MACHINES_STATE:-/var/lib/delegate/machines}
KEY=$STATE/id_ed25519
# name:image
MACHINES=("m1:delegate-machine:bookworm" "m2:delegate-machine:trixie")
# The home's server, its volume and the client's caches.
HOME_SERVER=home
HOME_VOLUME=home
HOME_CACHE=attribute-timeout=3,entry-timeout=30,negative-timeout=30
# The machines' own engine: its socket and state (kept between runs: the
# machine images stay loaded), its log and its bridge.
ENGINE_RUN=${DELEGATE_MACHINES_ENGINE:-/run/delegate-machines}
ENGINE_SOCK=unix://$ENGINE_RUN/docker.sock
ENGINE_DATA=/var/lib/delegate/machines-engine
ENGINE_LOG=/var/log/delegate/machines-dockerd.log
BRIDGE=dlg-machines
ENGINE_BRIDGE=dlg-machines0
ENGINE_BRIDGE_NET=${DELEGATE_MACHINES_ENGINE_NET:-172.31.91.1/24}

log() { printf '%s [machines] %s\n' "$(date '+%H:%M:%S')" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

mdocker() { docker -H "$ENGINE_SOCK" "$@"; }

# engine: the machines' own Docker engine answers (started unless it does):
# no iptables or masquerading (the machines need no route out), its
# containers' cgroups under /delegate-machines, and a default bridge of its
# own (ENGINE_BRIDGE, unused: without one, `--bridge none`, dockerd deletes
# docker0, the manager's engine's).
engine() {
    mdocker info >/dev/null 2>&1 && return 0
    install -d "$ENGINE_RUN" "$ENGINE_DATA" "$(dirname "$ENGINE_LOG")"
    if ! ip link show "$ENGINE_BRIDGE" >/dev/null 2>&1; then
        ip link add name "$ENGINE_BRIDGE" type bridge || die "cannot make the bridge $ENGINE_BRIDGE"
        ip addr add "$ENGINE_BRIDGE_NET" dev "$ENGINE_BRIDGE"
        ip link set "$ENGINE_BRIDGE" up
    fi
    log "engine: starting the machines' own dockerd ($ENGINE_SOCK)"
    setsid dockerd -H "$ENGINE_SOCK" --data-root "$ENGINE_DATA" --exec-root "$ENGINE_RUN/exec" \
        --pidfile "$ENGINE_RUN/docker.pid" --bridge "$ENGINE_BRIDGE" --iptables=false --ip-masq=false \
        --cgroup-parent /delegate-machines >>"$ENGINE_LOG" 2>&1 </dev/null &
    local _
    for _ in $(seq 60); do
        mdocker info >/dev/null 2>&1 && return 0
        sleep 1
    done
    die "the machines' engine does not answer: $(tail -n 5 "$ENGINE_LOG")"
}

# engine_down: the machines' engine stopped (its state kept).
engine_down() {
    local pid _
    pid=$(cat "$ENGINE_RUN/docker.pid" 2>/dev/null) || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 60); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 1
    done
    log "the machines' engine (pid $pid) did not stop"
}

# forward [-I|-D]: the machines' bridge's traffic allowed through this
# host's FORWARD chain (whose policy the manager's engine sets to DROP), to
# and from the manager's own networks (the registry's published port).
forward() {
    local op=$1 dir
    for dir in -i -o; do
        if iptables -C FORWARD "$dir" "$BRIDGE" -j ACCEPT 2>/dev/null; then
            # (an `up` of machines already up keeps the rule: not a failure)
            if [[ $op == -D ]]; then iptables -D FORWARD "$dir" "$BRIDGE" -j ACCEPT; fi
        elif [[ $op == -I ]]; then
            iptables -I FORWARD "$dir" "$BRIDGE" -j ACCEPT
        fi
    done
}

# load IMAGE: IMAGE (built by this host's engine) in the machines' engine.
load() {
    local id
    id=$(docker image inspect -f '{{.Id}}' "$1")
    [[ $(mdocker image inspect -f '{{.Id}}' "$1" 2>/dev/null) == "$id" ]] && return 0
    log "image $1: into the machines' engine"
    docker save "$1" | mdocker load -q >/dev/null || die "cannot load $1 into the machines' engine"
}

ssh_cmd() {
    echo "ssh -i $KEY -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile=$STATE/known_hosts -o BatchMode=yes -o ConnectTimeout=10"
}

# image SUITE BASE: the machine image of a Debian suite, built on BASE.
image() {
    local tag=delegate-machine:$1 base=$2
    local src
    src=$(cat "$HERE/machine.Dockerfile" "$HERE/machine-entrypoint.sh" | sha256sum | cut -c1-16)
    if [[ $(docker image inspect -f '{{index .Config.Labels "org.delegate.source"}}' "$tag" 2>/dev/null) == "$src" ]]; then
        return 0
    fi
    log "image $tag: building on $base"
    docker build -q --build-arg "BASE_IMAGE=$base" --label "org.delegate.source=$src" \
        -t "$tag" -f "$HERE/machine.Dockerfile" "$HERE" >/dev/null || die "docker build of $tag failed"
}

images() {
    docker image inspect delegate-base:bookworm >/dev/null 2>&1 \
        || die "delegate-base:bookworm is missing: run ./build_cluster.sh --local first"
    "$REPO/tests/site/site.sh" base
    image bookworm delegate-base:bookworm
    image trixie delegate-site-base:trixie
    engine
    load delegate-machine:bookworm
    load delegate-machine:trixie
}

# start NAME IMAGE [DOCKER-RUN-OPTION...]
start() {
    local name=$1 img=$2
    shift 2
    if [[ $(mdocker inspect -f '{{.State.Running}} {{.Image}}' "$name" 2>/dev/null) \
        == "true $(mdocker image inspect -f '{{.Id}}' "$img")" ]]; then
        return 0
    fi
    mdocker rm -f "$name" >/dev/null 2>&1 || true
    log "machine $name: starting ($img)"
    mdocker run -d --name "$name" --hostname "$name" --network "$NET" \
        --label org.delegate.machine=1 \
        --cap-add ALL --cap-drop SYS_RESOURCE \
        --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
        --security-opt systempaths=unconfined --device-cgroup-rule 'a *:* rwm' \
        --device /dev/fuse --tmpfs /run --tmpfs /tmp \
        -v "$name-docker:/var/lib/docker" "$@" \
        "$img" >/dev/null || die "cannot start machine $name"
    # A new machine: a new host key.
    [[ -f $STATE/known_hosts ]] && ssh-keygen -q -R "$(address "$name")" -f "$STATE/known_hosts" >/dev/null 2>&1
    return 0
}

authorize() {
    local name=$1 _
    for _ in $(seq 60); do
        mdocker exec "$name" docker info >/dev/null 2>&1 && break
        sleep 1
    done
    mdocker exec "$name" docker info >/dev/null 2>&1 \
        || die "machine $name: its Docker engine does not answer: $(mdocker exec "$name" tail -n 5 /var/log/machine/dockerd.log)"
    mdocker exec -i "$name" sh -c 'install -d -m 0700 /root/.ssh && cat >/root/.ssh/authorized_keys && chmod 0600 /root/.ssh/authorized_keys' \
        <"$KEY.pub"
    $(ssh_cmd) "root@$(address "$name")" true || die "machine $name: ssh as root does not work"
    log "machine $name: $(mdocker exec "$name" docker version -f 'Docker {{.Server.Version}}'), ssh root@$(address "$name")"
}

# home_server: the home's server answers and serves the volume HOME_VOLUME
# (made on its first start; its brick on the volume home-brick).
home_server() {
    local _ addr
    start "$HOME_SERVER" delegate-machine:bookworm -e MACHINE_ROLE=home -v home-brick:/bricks
    for _ in $(seq 60); do
        mdocker exec "$HOME_SERVER" gluster volume list >/dev/null 2>&1 && break
        sleep 1
    done
    addr=$(address "$HOME_SERVER")
    if ! mdocker exec "$HOME_SERVER" gluster volume info "$HOME_VOLUME" >/dev/null 2>&1; then
        mdocker exec "$HOME_SERVER" gluster volume create "$HOME_VOLUME" "$addr:/bricks/$HOME_VOLUME" force >/dev/null \
            || die "cannot create the home's volume on $HOME_SERVER"
    fi
    if [[ $(mdocker exec "$HOME_SERVER" gluster volume info "$HOME_VOLUME" | sed -n 's/^Status: //p') != Started ]]; then
        mdocker exec "$HOME_SERVER" gluster volume start "$HOME_VOLUME" >/dev/null \
            || die "cannot start the home's volume on $HOME_SERVER"
    fi
    log "home: $addr:/$HOME_VOLUME (GlusterFS $(mdocker exec "$HOME_SERVER" glusterd --version | sed -n '1s/glusterfs //p'))"
}

# home_mount [MACHINE]: the home mounted at HOME_DIR on MACHINE (from its
# /etc/fstab, as at boot), or on this host.
home_mount() {
    local src
    src="$(address "$HOME_SERVER"):/$HOME_VOLUME"
    if [[ -z ${1:-} ]]; then
        command -v mount.glusterfs >/dev/null || die "mount.glusterfs is missing here: apt-get install glusterfs-client"
        [[ $(findmnt -n -o FSTYPE --mountpoint "$HOME_DIR") == fuse.glusterfs ]] && return 0
        install -d "$HOME_DIR"
        mount -t glusterfs -o "$HOME_CACHE" "$src" "$HOME_DIR" || die "cannot mount $src at $HOME_DIR here"
        chmod 0711 "$HOME_DIR"
        return 0
    fi
    # shellcheck disable=SC2016 # (expanded by the machine's sh)
    mdocker exec -i "$1" sh -c 'grep -q " glusterfs " /etc/fstab || cat >>/etc/fstab; mkdir -p "$1"; mountpoint -q "$1" || mount "$1"' \
        sh "$HOME_DIR" <<<"$src $HOME_DIR glusterfs defaults,_netdev,$HOME_CACHE 0 0" \
        || die "machine $1: cannot mount the home"
}

address() { mdocker inspect -f "{{(index .NetworkSettings.Networks \"$NET\").IPAddress}}" "$1"; }

up() {
    images
    install -d -m 0700 "$STATE"
    [[ -s $KEY ]] || ssh-keygen -q -t ed25519 -N '' -C delegate-manager -f "$KEY"
    install -d -m 0711 "$HOME_DIR"
    mdocker network inspect "$NET" >/dev/null 2>&1 \
        || mdocker network create --subnet "$SUBNET" -o "com.docker.network.bridge.name=$BRIDGE" "$NET" >/dev/null \
        || die "cannot create network $NET ($SUBNET)"
    forward -I
    home_server
    home_mount
    local m
    for m in "${MACHINES[@]}"; do start "${m%%:*}" "${m#*:}"; done
    for m in "${MACHINES[@]}"; do
        authorize "${m%%:*}"
        home_mount "${m%%:*}"
    done
}

down() {
    local m name
    for m in "${MACHINES[@]}"; do
        name=${m%%:*}
        mdocker rm -f "$name" >/dev/null 2>&1 || true
        mdocker volume rm "$name-docker" >/dev/null 2>&1 || true
    done
    if [[ $(findmnt -n -o FSTYPE --mountpoint "$HOME_DIR" 2>/dev/null) == fuse.glusterfs ]]; then
        umount "$HOME_DIR" 2>/dev/null || umount -l "$HOME_DIR" || log "cannot unmount $HOME_DIR"
    fi
    mdocker rm -f "$HOME_SERVER" >/dev/null 2>&1 || true
    mdocker volume rm home-brick >/dev/null 2>&1 || true
    mdocker network rm "$NET" >/dev/null 2>&1 || true
    forward -D
    engine_down
    ip link del "$ENGINE_BRIDGE" 2>/dev/null || true
    rm -rf "$STATE"
}

case ${1:-} in
    up) up ;;
    down) down ;;
    ssh) ssh_cmd ;;
    home) home_mount ;;
    docker) shift; mdocker "$@" ;;
    address) address "${2:?machine}" ;;
    *) echo "usage: tests/machines/machines.sh up|down|ssh|home|address NAME|docker ARG..." >&2; exit 2 ;;
esac

#!/bin/bash
# The init of an emulated machine (docker/machine.Dockerfile): what a
# Debian server's init does at boot, reduced to what the tests need, in this
# order: /etc/rc.local (where `build_cluster.sh machine join` puts the
# staging mount on a machine without systemd, so it is there before the
# engine starts its containers), the ssh server, then the Docker engine,
# restarted when it dies as systemd's docker.service (Restart=always,
# RestartSec=2) does. Logs in /var/log/machine/. SIGTERM (docker stop: the
# machine is shut down) stops the engine first. The machine `home`
# (MACHINE_ROLE=home) is the home's server instead: glusterd, no engine.
# Every other machine mounts the home from /etc/fstab (the line
# machines.sh writes, as an instructor's fstab would have it) before its
# engine starts, waiting for the server as _netdev does.
set -uo pipefail

LOGS=/var/log/machine
mkdir -p "$LOGS" /run/sshd
log() { printf '%s machine %s: %s\n' "$(date '+%F %T')" "$(hostname)" "$*" | tee -a "$LOGS/init.log"; }

# A fresh engine directory per boot would lose the images; the data is on a
# volume. Stale pid and socket files of the last boot are not.
rm -f /var/run/docker.pid /var/run/docker.sock /run/docker/containerd/containerd.pid

# Unprivileged (machines.sh says why), the engine's cgroup hierarchies and
# /sys come read-only: the nested engine creates its containers' cgroups.
mount -o remount,rw /sys 2>/dev/null || log "cannot remount /sys writable"
while read -r _ mnt _ opts _; do
    [[ $mnt == /sys/fs/cgroup/* && ,$opts, == *,ro,* ]] || continue
    mount -o remount,bind,rw "$mnt" || log "cannot remount $mnt writable"
done </proc/mounts

if [[ -x /etc/rc.local ]]; then
    log "running /etc/rc.local"
    /etc/rc.local >>"$LOGS/rc.local.log" 2>&1 || log "/etc/rc.local failed ($?)"
fi

ssh-keygen -A >/dev/null
/usr/sbin/sshd -E "$LOGS/sshd.log" || log "sshd did not start"

if [[ ${MACHINE_ROLE:-} == home ]]; then
    log "the home's server: glusterd ($(glusterd --version | head -n 1))"
    exec glusterd -N -p /run/glusterd.pid -l "$LOGS/glusterd.log"
fi
home=$(awk '$3 == "glusterfs" { print $2 }' /etc/fstab 2>/dev/null)
if [[ -n $home ]]; then
    mkdir -p "$home"
    for _ in $(seq 60); do
        mountpoint -q "$home" && break
        mount "$home" >>"$LOGS/home-mount.log" 2>&1 || sleep 1
    done
    if mountpoint -q "$home"; then
        log "home: $(findmnt -n -o SOURCE,FSTYPE,OPTIONS "$home")"
    else
        log "home: $home is not mounted (see $LOGS/home-mount.log)"
    fi
fi

stopping=0
engine=0
shutdown() {
    stopping=1
    log "shutting down: stopping the Docker engine"
    ((engine)) && kill -TERM "$engine" 2>/dev/null && wait "$engine"
    exit 0
}
trap shutdown TERM INT

while ((!stopping)); do
    log "starting dockerd ($(dockerd --version))"
    dockerd >>"$LOGS/dockerd.log" 2>&1 &
    engine=$!
    wait "$engine"
    rc=$?
    ((stopping)) && break
    log "dockerd exited ($rc); restarting in 2 s"
    sleep 2
done

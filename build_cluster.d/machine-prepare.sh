#!/bin/bash
# build_cluster.d/machine-prepare.sh -- what `build_cluster.sh machine add`
# runs on a worker machine, as root, over ssh (the script on its standard
# input, its arguments on the command line; nothing of delegate needs to be
# installed there first):
#   bash -s STAGING WORKER HOME MANAGER TOKEN REGISTRY CA
# It checks the machine (its Docker engine, the shared home), makes the
# workers' staging directory STAGING a shared mount point with the root-only
# directory STAGING/workerWORKER, now and at every boot (a systemd unit
# ordered before docker.service where systemd is the init, else
# /etc/rc.local), and joins the swarm of MANAGER (address:port) with TOKEN
# unless already in it. Its engine trusts the course's CA (CA: the
# certificate in base64) for the registry REGISTRY (address:port), through
# /etc/docker/certs.d, which the engine reads at each pull. Prints "node NODE-ID DOCKER-VERSION BOOT-MECHANISM"
# last; errors are one line on stderr, exit 1.
set -euo pipefail

staging=$1 worker=$2 home=$3 manager=$4 token=$5 registry=$6 ca=$7
die() { printf 'machine %s: %s\n' "$(hostname)" "$*" >&2; exit 1; }

[[ $staging =~ ^/[A-Za-z0-9._/-]+$ && $staging != *..* ]] || die "bad staging directory '$staging'"
[[ $worker =~ ^[1-9][0-9]{0,2}$ ]] || die "bad worker number '$worker'"
[[ $manager =~ ^[A-Za-z0-9.:-]+$ ]] || die "bad manager address '$manager'"
[[ $registry =~ ^[A-Za-z0-9.-]+:[0-9]+$ ]] || die "bad registry address '$registry'"

docker info >/dev/null 2>&1 || die "its Docker engine does not answer (docker info): install docker.io and start it"
version=$(docker version -f '{{.Server.Version}}')
((${version%%.*} >= 20)) || die "Docker $version is too old (20.10 or later)"
[[ -d $home ]] || die "the shared home $home is not there: mount it at the same path as on the manager first"

# The staging mount: a script, run now and at boot (/run is emptied at boot).
install -d -m 0755 /usr/local/lib/delegate
cat >/usr/local/lib/delegate/staging-mount.sh <<EOF
#!/bin/sh
# delegate: the workers' staging directory, a shared mount point with one
# root-only directory per worker service placed on this machine
# (written by build_cluster.sh machine add; docs/instructors.md).
set -e
install -d -m 0755 "$staging"
mountpoint -q "$staging" || mount --bind "$staging" "$staging"
mount --make-rshared "$staging"
install -d -m 0700 "$staging/worker$worker"
EOF
chmod 0755 /usr/local/lib/delegate/staging-mount.sh
/usr/local/lib/delegate/staging-mount.sh || die "cannot make $staging a shared mount point"

if [[ -d /run/systemd/system ]]; then
    boot=systemd
    cat >/etc/systemd/system/delegate-staging.service <<'EOF'
[Unit]
Description=delegate: the workers' staging directory (shared mount)
Before=docker.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/lib/delegate/staging-mount.sh
[Install]
WantedBy=multi-user.target
EOF
    { systemctl daemon-reload && systemctl enable -q delegate-staging.service; } \
        || die "cannot enable delegate-staging.service"
else
    boot=rc.local
    [[ -f /etc/rc.local ]] || printf '#!/bin/sh\n' >/etc/rc.local
    if ! grep -qxF /usr/local/lib/delegate/staging-mount.sh /etc/rc.local; then
        sed -i '/^exit 0$/d' /etc/rc.local
        echo /usr/local/lib/delegate/staging-mount.sh >>/etc/rc.local
    fi
    chmod 0755 /etc/rc.local
fi

# The registry's CA.
install -d -m 0755 "/etc/docker/certs.d/$registry"
if ! base64 -d <<<"$ca" >"/etc/docker/certs.d/$registry/ca.crt.new" \
    || ! grep -q 'BEGIN CERTIFICATE' "/etc/docker/certs.d/$registry/ca.crt.new"; then
    die "the registry's CA certificate did not arrive whole"
fi
mv "/etc/docker/certs.d/$registry/ca.crt.new" "/etc/docker/certs.d/$registry/ca.crt"

state=$(docker info -f '{{.Swarm.LocalNodeState}}')
case $state in
    active)
        docker info -f '{{range .Swarm.RemoteManagers}}{{.Addr}} {{end}}' | grep -qw -- "$manager" \
            || die "it is already in another swarm (docker swarm leave first)" ;;
    inactive)
        addr=$(ip -4 route get "${manager%:*}" 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
        docker swarm join ${addr:+--advertise-addr "$addr"} --token "$token" "$manager" >/dev/null \
            || die "docker swarm join $manager failed" ;;
    *) die "its swarm state is '$state' (docker swarm leave --force, then again)" ;;
esac
echo "node $(docker info -f '{{.Swarm.NodeID}}') $version $boot"

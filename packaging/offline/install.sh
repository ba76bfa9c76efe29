#!/bin/bash
# delegate-offline/install.sh -- the install half of the offline bundle
# (`./build_cluster.sh bundle`; docs/ml.md, "An offline GPU check"): sets
# delegate up on this bare machine, alone, without network, as a single
# machine cluster without accounting, then (--check) runs the GPU check as
# a student. Run as root from the unpacked bundle:
#
#   tar -xf delegate-offline.tar && delegate-offline/install.sh --check
#
# Options:
#   --gpus SPEC      the node's GPUs, as DELEGATE_LOCAL_GPUS: auto (default:
#                    this machine's /dev/nvidia<N>, else none), nvidia,
#                    standin:N (test scaffolding), none
#   --student NAME   the student account the check runs as (made when
#                    missing; default delegate-student)
#   --check          then run gpu-check.sh as that student
#   --log FILE       everything to FILE too (default
#                    /var/log/delegate/offline.log)
#
# What it does, in order (each step says what it did in the log):
#   1. checks the machine: root, x86_64, glibc at least the bundle's, no
#      Slurm of its own; an NVIDIA driver whose libraries only root's
#      LD_LIBRARY_PATH names gets their folder in /etc/ld.so.conf.d;
#   2. unpacks Slurm, munge, Docker's engine and their libraries into
#      /opt/delegate-offline (its ELF files find their libraries there: the
#      host's /usr/lib is never touched), links the commands into
#      /usr/local/{bin,sbin}, /usr/sbin/slurmstepd (the path slurmd runs)
#      and Slurm's plugin directory;
#   3. installs delegate's Debian packages' files (dpkg-deb -x: their Slurm
#      dependencies are the bundle's, not dpkg's);
#   4. then the project's own single-machine steps (build_cluster.d/local.sh,
#      carried in the bundle), with DELEGATE_ACCOUNTING=0: slurm.conf,
#      gres.conf and cgroup.conf for this node's facts, the lockdown (the
#      packaged SPANK plugin), munged, dockerd (no iptables, no bridge:
#      sandboxes have no network), slurmctld, slurmd, the site policy;
#   5. the sandbox image delegate-sandbox:host made from this machine's own
#      files (host-image.sh: its Python, the NVIDIA driver's libraries and
#      the real nvidia-smi), and the root agent.
set -euo pipefail

HERE=$(cd "$(dirname "$(readlink -f -- "${BASH_SOURCE[0]}")")" && pwd)
PREFIX=/opt/delegate-offline
# The project's scripts the bundle carries, laid out as in the repository.
REPO=$PREFIX/share/repo
GPUS=auto
STUDENT=delegate-student
CHECK=0
LOG=/var/log/delegate/offline.log

while (($#)); do
    case $1 in
        --gpus) GPUS=${2:?--gpus needs a value}; shift 2 ;;
        --student) STUDENT=${2:?--student needs a name}; shift 2 ;;
        --check) CHECK=1; shift ;;
        --log) LOG=${2:?--log needs a file}; shift 2 ;;
        -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "install.sh: run it as root" >&2; exit 1; }
[[ $STUDENT =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || { echo "install.sh: '$STUDENT' is not a user name" >&2; exit 2; }
install -d -m 0711 "$(dirname "$LOG")"
exec > >(tee -a "$LOG") 2>&1
echo "=== delegate offline install, $(date -u '+%F %T') UTC, on $(hostname) ($(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}"))"
sed 's/^/    /' "$HERE/MANIFEST"

fail() { echo "install.sh: ERROR: $*" >&2; exit 1; }

# 1. The machine.
preflight() {
    local need have
    [[ $(uname -m) == x86_64 ]] || fail "the bundle is for x86_64, this machine is $(uname -m)"
    need=$(sed -n 's/^needs glibc >= //p' "$HERE/MANIFEST")
    have=$(getconf GNU_LIBC_VERSION | awk '{ print $2 }')
    [[ $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1) == "$need" ]] \
        || fail "this machine's glibc is $have; the bundle's programs need $need or later"
    if [[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm && ! -L /usr/lib/x86_64-linux-gnu/slurm-wlm ]] \
        || { command -v slurmctld >/dev/null && [[ $(readlink -f "$(command -v slurmctld)") != $PREFIX/* ]]; }; then
        fail "this machine has a Slurm of its own: the bundle is for a bare machine (docs/existing-site.md is for a site's Slurm)"
    fi
    addresses
    driver_libraries
    command -v python3 >/dev/null || echo "install.sh: no python3 here: the Python check and the sandbox image's Python will be missing"
    echo "1. machine: $(uname -r), glibc $have (needs $need), cgroup $(stat -fc %T /sys/fs/cgroup), $(nproc) CPUs"
}

# addresses: Slurm 22.05 listens where getaddrinfo(AI_ADDRCONFIG) finds an
# address, and that ignores loopback: a machine with no interface but lo
# gets a dummy one (with iproute2), or a clear stop.
addresses() {
    local probe='import socket; socket.getaddrinfo(None, 6817, socket.AF_INET, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG | socket.AI_PASSIVE)'
    command -v python3 >/dev/null || return 0
    python3 -c "$probe" 2>/dev/null && return 0
    if command -v ip >/dev/null && ip link add delegate0 type dummy 2>/dev/null; then
        ip addr add 10.254.254.1/32 dev delegate0 && ip link set delegate0 up
        python3 -c "$probe" 2>/dev/null && { echo "   network: only loopback here; added the dummy interface delegate0 (10.254.254.1)"; return 0; }
    fi
    # A kernel without the dummy driver: the address on loopback itself
    # (getaddrinfo ignores 127.0.0.1, not the interface).
    if command -v ip >/dev/null && ip addr add 10.254.254.1/32 dev lo 2>/dev/null; then
        python3 -c "$probe" 2>/dev/null && { echo "   network: only loopback here; added 10.254.254.1 to lo (no dummy interfaces in this kernel)"; return 0; }
    fi
    fail "this machine has no network address but loopback, and Slurm 22.05 cannot listen without one: add an interface (ip link add delegate0 type dummy; ip addr add 10.254.254.1/32 dev delegate0; ip link set delegate0 up)"
}

# driver_libraries: the NVIDIA driver's libraries known to the system's
# loader. A GPU machine may name them only on root's LD_LIBRARY_PATH (its
# driver folder, say /usr/local/nvidia/lib64), but the root agent asks
# nvidia-smi with a clean environment and the sandbox image takes what
# ldconfig knows: their folders go into /etc/ld.so.conf.d.
driver_libraries() {
    local d dirs=() conf=/etc/ld.so.conf.d/delegate-nvidia.conf
    ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so' && return 0
    IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in "${dirs[@]}" /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
        if [[ -n $d ]] && compgen -G "$d/libnvidia-ml.so*" >/dev/null; then echo "$d"; fi
    done | awk '!seen[$0]++' >"$conf.new"
    if [[ ! -s $conf.new ]]; then
        rm -f "$conf.new"
        return 0
    fi
    mv "$conf.new" "$conf"
    # A read-only driver folder gets no links of ldconfig's: the cache is
    # what counts.
    ldconfig 2>/dev/null || true
    ldconfig -p | grep -q 'libnvidia-ml\.so' || fail "the driver's libraries in $(tr '\n' ' ' <"$conf")are not found by ldconfig"
    echo "   driver libraries: $(tr '\n' ' ' <"$conf")added to the loader's paths ($conf)"
}

# 2. Slurm, munge and the engine into the prefix, and their links.
unpack() {
    if cmp -s "$HERE/MANIFEST" "$PREFIX/MANIFEST"; then
        echo "2. $PREFIX holds this bundle already"
        return
    fi
    rm -rf "$PREFIX"
    if command -v xz >/dev/null; then
        xz -dc "$HERE/payload.tar.xz" | tar --no-same-owner -x -C /
    else
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall("/", filter="fully_trusted")' \
            "$HERE/payload.tar.xz"
    fi
    install -m 0644 "$HERE/MANIFEST" "$PREFIX/MANIFEST"
    local f
    for f in "$PREFIX"/bin/*; do ln -sfn "$f" "/usr/local/bin/$(basename "$f")"; done
    for f in "$PREFIX"/sbin/*; do ln -sfn "$f" "/usr/local/sbin/$(basename "$f")"; done
    [[ -e /usr/sbin/slurmstepd && ! -L /usr/sbin/slurmstepd ]] || ln -sfn "$PREFIX/sbin/slurmstepd" /usr/sbin/slurmstepd
    ln -sfn "$PREFIX/lib/slurm" /usr/lib/x86_64-linux-gnu/slurm-wlm
    slurmd -V >/dev/null || fail "the bundle's slurmd does not run here: $(slurmd -V 2>&1 | tail -n 3)"
    dockerd --version >/dev/null || fail "the bundle's dockerd does not run here: $(dockerd --version 2>&1 | tail -n 3)"
    echo "2. unpacked into $PREFIX: $(slurmd -V), $(dockerd --version), munge $(munged -V 2>&1 | awk '{ print $2 }')"
}

# 3. delegate's packages' files.
delegate_packages() {
    local deb
    command -v dpkg-deb >/dev/null || fail "dpkg-deb is missing (Debian and Ubuntu have it)"
    for deb in "$PREFIX"/debs/*.deb; do dpkg-deb -x "$deb" /; done
    install -d -m 0750 /var/log/delegate
    echo "3. delegate's packages: $(find "$PREFIX/debs" -name '*.deb' -printf '%f ')"
}

# The accounts the daemons and the check need.
accounts() {
    getent group munge >/dev/null || groupadd --system munge
    id munge >/dev/null 2>&1 || useradd --system --gid munge --home-dir /nonexistent --shell /usr/sbin/nologin munge
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 0755 /run/munge
    getent group adm >/dev/null || groupadd --system adm
    id "$STUDENT" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$STUDENT"
    echo "   accounts: munge, $STUDENT (uid $(id -u "$STUDENT"))"
}

# The project's own single-machine steps need these of common.sh, which
# the bundle's prebuilt programs answer instead of cargo and gcc.
offline_overrides() {
    deploy_build() { :; }
    deploy_render() {
        local out=$1
        shift
        (export "${!DELEGATE_@}"; exec /usr/bin/delegate-deploy "$@") >"$out" \
            || die "cannot render $1 (delegate-deploy's error above)"
    }
    lockdown_build_spank() { install -m 0755 /usr/lib/delegate/delegate_lockdown.so "$2"; }
    if ! command -v pgrep >/dev/null; then
        # procps is not on every bare machine: local.sh's `pgrep -x NAME`.
        pgrep() {
            [[ $1 == -x ]] || return 2
            local d
            for d in /proc/[0-9]*; do
                [[ $(cat "$d/comm" 2>/dev/null) == "$2" ]] && echo "${d#/proc/}"
            done | sort -n | grep .
        }
    fi
}

# 4. The cluster on this machine, by build_cluster.d/local.sh's own steps.
cluster() {
    export DELEGATE_ACCOUNTING=0 DELEGATE_LOCAL_GPUS=$GPUS DELEGATE_SANDBOX_IMAGE=delegate-sandbox:host \
        DELEGATE_PREFIX=/usr/bin DELEGATE_SPANK_PLUGIN=/usr/lib/delegate/delegate_lockdown.so
    # shellcheck source=../../build_cluster.d/common.sh
    source "$REPO/build_cluster.d/common.sh"
    eval "$(/usr/bin/delegate-deploy settings --file "$REPO/cluster.toml")" || fail "the settings are not valid"
    # shellcheck source=../../build_cluster.d/local.sh
    source "$REPO/build_cluster.d/local.sh"
    offline_overrides
    SLURM_CONF=/etc/slurm/slurm.conf
    install -d -m 0755 /etc/slurm "$DELEGATE_STATE_DIR" "$DELEGATE_RUN_DIR"
    private_logs "$DELEGATE_LOG_DIR"
    install -d -m 0755 /etc/logrotate.d /etc/sysctl.d
    local_write_slurm_conf
    local_install_lockdown
    # No iptables and no bridge: the sandboxes have no network, and a bare
    # machine may have no iptables at all.
    if [[ ! -e /etc/docker/daemon.json ]]; then
        install -d -m 0755 /etc/docker
        echo '{"iptables": false, "ip-masq": false, "bridge": "none"}' >/etc/docker/daemon.json
    fi
    local_start_daemons
    local_install_policy
    # Stand-in GPUs (test scaffolding) get no max_gpus of their own.
    if [[ $GPUS == standin:* ]]; then
        sed -i "s/^max_gpus = .*/max_gpus = ${GPUS#standin:}/" "$DELEGATE_POLICY_FILE"
    fi
    echo "4. cluster: $(sinfo -h -N -o '%N %T %G' | tr '\n' ' ')"
}

# 5. The sandbox image from this machine's files, and the agent.
image_and_agent() {
    "$PREFIX/share/host-image.sh" "$DELEGATE_SANDBOX_IMAGE" || fail "the sandbox image from this machine's files failed"
    # The callers' side: delegate's wheels for this machine's Python
    # (PYTHONPATH=/opt/delegate-offline/python; no pip needed).
    local whl
    for whl in /usr/share/delegate/wheels/*.whl; do python3 -m zipfile -e "$whl" "$PREFIX/python"; done
    chmod -R a+rX "$PREFIX/python"
    local_new_deployment
    DELEGATE_PREFIX=/usr/sbin local_start_agent
    echo "5. image $DELEGATE_SANDBOX_IMAGE, agent on $DELEGATE_AGENT_SOCKET"
}

preflight
unpack
delegate_packages
accounts
cluster
image_and_agent
echo "=== installed; the log is $LOG"
if ((CHECK)); then
    exec "$PREFIX/share/gpu-check.sh" --student "$STUDENT" --logged-to "$LOG"
fi

#!/bin/bash
# packaging/build-debs.sh -- delegate's three Debian packages from the
# workspace (packaging/README.md): delegate, delegate-node, delegate-controller.
#
#   packaging/build-debs.sh [--out DIR] [--slurm-headers DIR]
#
#   --out DIR            where the .deb files go (default target/debian)
#   --slurm-headers DIR  the Slurm headers the SPANK plugin is built against
#                        (spank.h, slurm_version.h; default /usr/include/slurm):
#                        those of the Slurm release the nodes run. The node
#                        package's version names that release (0.1.0+slurm24.11).
#
# Needs: cargo (release build of the workspace), gcc, dpkg-deb, and maturin
# (from $DELEGATE_VENV, default /var/lib/delegate/venv, or PATH) for the
# wheel. Prints the path of each package built. The packages install no file
# under /etc/slurm and no file a site already has (tests/site/ checks it).
set -euo pipefail

REPO=$(cd "$(dirname "$(readlink -f -- "${BASH_SOURCE[0]}")")/.." && pwd)
OUT=$REPO/target/debian
HEADERS=/usr/include/slurm
VENV=${DELEGATE_VENV:-/var/lib/delegate/venv}
export PATH="$HOME/.cargo/bin:$PATH"

die() { echo "build-debs: $*" >&2; exit 1; }

while (($#)); do
    case $1 in
        --out) OUT=${2:?--out needs a directory}; shift 2 ;;
        --slurm-headers) HEADERS=${2:?--slurm-headers needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,17{s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/delegate-debs.XXXXXX")
trap 'rm -rf -- "$STAGE"' EXIT

# The workspace's version (Cargo.toml's [workspace.package]).
workspace_version() {
    sed -n '/^\[workspace.package\]/,/^\[/{s/^version = "\([^"]*\)"/\1/p}' "$REPO/Cargo.toml"
}

# slurm_release HEADERS: "MAJOR.MINOR" of the Slurm whose headers these are.
slurm_release() {
    local hex
    hex=$(sed -n 's/^#define SLURM_VERSION_NUMBER 0x\([0-9a-fA-F]*\)$/\1/p' "$1/slurm_version.h") \
        || return 1
    [[ -n $hex ]] || return 1
    printf '%d.%02d\n' "$((16#$hex >> 16 & 255))" "$((16#$hex >> 8 & 255))"
}

# control DIR PACKAGE VERSION ARCH DEPENDS DESCRIPTION: DIR/DEBIAN/control.
control() {
    local dir=$1
    install -d -m 0755 "$dir/DEBIAN"
    {
        echo "Package: $2"
        echo "Version: $3"
        echo "Architecture: $4"
        echo "Maintainer: delegate <delegate@localhost>"
        echo "Section: admin"
        echo "Priority: optional"
        [[ -n $5 ]] && echo "Depends: $5"
        if [[ $2 == delegate-node ]]; then
            echo "Recommends: slurmd, docker.io | docker-ce"
            # A SPANK plugin of another Slurm release would fail every job
            # step (its plugstack line is `required`).
            echo "Breaks: slurmd (<< $SLURM), slurmd (>= $SLURM_NEXT~)"
        fi
        echo "Installed-Size: $(du -sk --exclude=DEBIAN "$dir" | cut -f1)"
        echo "Description: $6"
    } >"$dir/DEBIAN/control"
}

# build DIR: the package of DIR into $OUT; prints its path.
build() {
    local deb
    deb=$OUT/$(sed -n 's/^Package: //p' "$1/DEBIAN/control")_$(sed -n 's/^Version: //p' "$1/DEBIAN/control")_$(sed -n 's/^Architecture: //p' "$1/DEBIAN/control").deb
    dpkg-deb --root-owner-group -Zxz --build "$1" "$deb" >/dev/null || die "dpkg-deb failed for $1"
    echo "$deb"
}

# doc DIR PACKAGE FILE...: the files into DIR/usr/share/doc/PACKAGE.
doc() {
    local dir=$1/usr/share/doc/$2; shift 2
    install -d -m 0755 "$dir"
    install -m 0644 "$@" "$dir/"
}

# unit_scripts DIR UNIT WHAT [SETUP]: the package's maintainer scripts for
# its systemd UNIT (WHAT names the service in their comments): postinst runs
# SETUP, makes systemd learn the unit and restarts the service when it runs
# (an upgrade); prerm stops it before its binary goes on removal; postrm
# makes systemd forget the unit. The site enables the service itself.
unit_scripts() {
    local d=$1 unit=$2 what=$3 setup=${4:-:}
    cat >"$d/DEBIAN/postinst" <<SH
#!/bin/sh
# $what: systemd learns the unit, and a service that runs (an upgrade) is
# restarted on the new binary. The site enables it itself.
set -e
if [ "\$1" = configure ]; then
    $setup
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
        systemctl try-restart $unit || true
    fi
fi
exit 0
SH
    cat >"$d/DEBIAN/prerm" <<SH
#!/bin/sh
# $what: on removal the service stops before its binary goes (an upgrade
# restarts it in postinst instead).
set -e
if [ "\$1" = remove ] || [ "\$1" = deconfigure ]; then
    if [ -d /run/systemd/system ]; then systemctl stop $unit || true; fi
fi
exit 0
SH
    cat >"$d/DEBIAN/postrm" <<SH
#!/bin/sh
# $what: systemd forgets the removed unit.
set -e
if [ "\$1" = remove ] || [ "\$1" = purge ]; then
    if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
fi
exit 0
SH
    chmod 0755 "$d/DEBIAN/postinst" "$d/DEBIAN/prerm" "$d/DEBIAN/postrm"
}

pkg_delegate() {
    local d=$STAGE/delegate wheel
    install -d -m 0755 "$d/usr/bin" "$d/usr/sbin" "$d/usr/share/delegate/wheels" "$d/usr/lib/systemd/system"
    install -m 0755 "$REPO/target/release/delegate" "$REPO/target/release/delegate-deploy" "$d/usr/bin/"
    install -m 0755 "$REPO/target/release/delegate-place" "$d/usr/sbin/"
    install -m 0644 "$REPO/packaging/delegate-place.service" "$d/usr/lib/systemd/system/"
    for wheel in "$STAGE"/wheel/*.whl; do install -m 0644 "$wheel" "$d/usr/share/delegate/wheels/"; done
    doc "$d" delegate "$REPO/README.md" "$REPO/docs/students.md" "$REPO/docs/existing-site.md" \
        "$REPO/docs/configuration.md"
    control "$d" delegate "$VERSION" "$ARCH" "libc6 (>= $GLIBC)" \
        "delegate: Python functions and CFiddle experiments in sandboxes on Slurm
 The delegate CLI, delegate-deploy (the site policy, the job gate, the SPANK
 line), the place helper for login nodes (the service delegate-place) and
 the Python wheel with cloudpickle at its pin (/usr/share/delegate/wheels)."
    unit_scripts "$d" delegate-place.service "the place helper"
    build "$d"
}

pkg_node() {
    local d=$STAGE/node
    install -d -m 0755 "$d/usr/bin" "$d/usr/sbin" "$d/usr/lib/delegate" "$d/usr/lib/systemd/system"
    install -m 0755 "$REPO/target/release/sandbox-runner" "$d/usr/bin/"
    install -m 0755 "$REPO/target/release/sandbox-agent" "$d/usr/sbin/"
    install -m 0644 "$STAGE/delegate_lockdown.so" "$d/usr/lib/delegate/"
    install -m 0755 "$REPO/slurm-conf/epilog.sh" "$d/usr/lib/delegate/epilog.sh"
    install -m 0644 "$REPO/packaging/delegate-agent.service" "$d/usr/lib/systemd/system/"
    control "$d" delegate-node "$VERSION+slurm$SLURM" "$ARCH" "delegate (= $VERSION), libc6 (>= $GLIBC)" \
        "delegate worker node: sandbox-runner, the root agent, the SPANK plugin
 For Slurm $SLURM (the SPANK plugin is built against its headers). The agent
 is the service delegate-agent; nothing under /etc/slurm is written."
    unit_scripts "$d" delegate-agent.service "the agent" \
        "install -d -m 0750 -o root -g adm /var/log/delegate"
    build "$d"
}

pkg_controller() {
    local d=$STAGE/controller
    install -d -m 0755 "$d/usr/share/delegate"
    install -m 0644 "$REPO/slurm-conf/site_job_submit.example.lua" "$d/usr/share/delegate/"
    doc "$d" delegate-controller "$REPO/docs/existing-site.md"
    control "$d" delegate-controller "$VERSION" all "delegate (= $VERSION)" \
        "delegate's job gate for slurmctld (JobSubmitPlugins=lua)
 delegate-deploy gate --module renders the gate a site's own job_submit.lua
 loads (/usr/share/delegate/site_job_submit.example.lua shows the lines)."
    build "$d"
}

main() {
    command -v dpkg-deb >/dev/null || die "dpkg-deb not found (apt-get install dpkg-dev)"
    [[ -r $HEADERS/spank.h && -r $HEADERS/slurm.h && -r $HEADERS/slurm_version.h ]] \
        || die "$HEADERS has no spank.h, slurm.h and slurm_version.h (libslurm-dev, or --slurm-headers)"
    VERSION=$(workspace_version)
    [[ -n $VERSION ]] || die "no version in $REPO/Cargo.toml's [workspace.package]"
    SLURM=$(slurm_release "$HEADERS") || die "cannot read the Slurm release of $HEADERS/slurm_version.h"
    # Slurm's releases are YY.MM: the next one is above YY.(MM+1).
    SLURM_NEXT=${SLURM%%.*}.$(printf '%02d' "$((10#${SLURM#*.} + 1))")
    ARCH=$(dpkg --print-architecture)
    # The binaries need the glibc they were built against, or newer.
    GLIBC=$(dpkg-query -W -f '${Version}' libc6 | sed 's/-.*//') || die "cannot read this machine's libc6 version"
    local maturin=$VENV/bin/maturin
    [[ -x $maturin ]] || maturin=$(command -v maturin) || die "maturin not found (tests/venv.sh makes $VENV)"
    (cd "$REPO" && cargo build -q --release --workspace --bins) || die "cargo build failed"
    (cd "$REPO/python" && "$maturin" build -q --release -o "$STAGE/wheel" >"$STAGE/maturin.log" 2>&1) \
        || { cat "$STAGE/maturin.log" >&2; die "maturin build failed"; }
    # Beside it, the one dependency at its pin (python/pyproject.toml), so a
    # student's `pip install --no-index --find-links /usr/share/delegate/wheels
    # delegate` needs no index.
    local pin
    pin=$(python3 -c 'import sys, tomllib; d = tomllib.load(open(sys.argv[1], "rb")); print(*[r for r in d["project"]["dependencies"] if r.startswith("cloudpickle==")])' \
        "$REPO/python/pyproject.toml") || die "cannot read the cloudpickle pin from python/pyproject.toml"
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$STAGE/wheel" "$pin" \
        || die "cannot download $pin (pip download)"
    # -I of a directory holding slurm/: the plugin includes <slurm/spank.h>.
    install -d "$STAGE/include"
    ln -s "$(readlink -f "$HEADERS")" "$STAGE/include/slurm"
    gcc -std=gnu11 -Wall -Wextra -Werror -O2 -fPIC -shared -I"$STAGE/include" \
        -o "$STAGE/delegate_lockdown.so" "$REPO/slurm-conf/spank/delegate_lockdown.c" \
        || die "cannot build the SPANK plugin against $HEADERS"
    install -d -m 0755 "$OUT"
    pkg_delegate
    pkg_node
    pkg_controller
}

main

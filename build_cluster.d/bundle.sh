# shellcheck shell=bash
# build_cluster.d/bundle.sh -- `./build_cluster.sh bundle [--out FILE]`: the
# offline bundle, everything a bare GPU machine without network needs to
# run delegate's GPU check (docs/ml.md, "An offline GPU check").
#
# Sourced by build_cluster.sh after common.sh. Packs, from this Debian 12
# machine's own installed packages and build:
#   - Slurm 22.05 (controller, node daemon, step daemon, the commands
#     delegate calls, the plugins whose libraries are carried too), munge,
#     and Docker's engine (dockerd, containerd, its shim, runc, tini as
#     docker-init, the docker CLI);
#   - the shared libraries they load beyond glibc's own (a non-Debian host
#     may lack them), with every carried ELF file's RUNPATH set to the
#     bundle's prefix, so nothing of the host's /usr/lib is replaced;
#   - delegate's own Debian packages (`build_cluster.sh packages`), whose
#     SPANK plugin is built against this Slurm;
#   - the CUDA check program (packaging/offline/cuda_check.c, the driver
#     API through dlopen: no CUDA toolkit here or there);
#   - the install half (packaging/offline/: install.sh, gpu-check.sh,
#     host-image.sh) and the project's own single-machine steps it runs
#     (build_cluster.d/common.sh and local.sh, cluster.toml, the epilog).
# The bundle is one tar (FILE, default target/bundle/delegate-offline.tar):
# delegate-offline/{install.sh, payload.tar.xz, MANIFEST}. It must fit a
# GPU machine's 64 MiB transfer with the repository beside it: over
# BUNDLE_MAX_MIB it is refused. glibc 2.36 (Debian 12) is the oldest the
# binaries run on: Ubuntu 22.04's 2.35 is too old, 24.04's 2.39 is fine.

BUNDLE_PREFIX=/opt/delegate-offline
BUNDLE_MAX_MIB=58
# Slurm's binaries (Debian's -wlm names are the real files behind the
# alternatives), munge's and the engine's, by their Debian paths:
# "path:bin|sbin[:name]".
BUNDLE_PROGRAMS=(
    /usr/sbin/slurmctld-wlm:sbin:slurmctld /usr/sbin/slurmd-wlm:sbin:slurmd
    /usr/sbin/slurmstepd-wlm:sbin:slurmstepd
    /usr/bin/sbatch:bin /usr/bin/squeue:bin /usr/bin/scontrol:bin /usr/bin/sinfo:bin
    /usr/bin/scancel:bin /usr/bin/srun:bin /usr/bin/sacct:bin
    /usr/sbin/munged:sbin /usr/sbin/mungekey:sbin /usr/bin/munge:bin /usr/bin/unmunge:bin
    /usr/sbin/dockerd:bin /usr/bin/containerd:bin /usr/bin/containerd-shim-runc-v2:bin
    /usr/sbin/runc:bin /usr/bin/tini-static:bin:docker-init /usr/bin/docker:bin
)
# The Debian packages they come from (installed when missing).
BUNDLE_PACKAGES=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge docker.io containerd runc tini
                 patchelf xz-utils libslurm-dev dpkg-dev gcc)
BUNDLE_SLURM_LIBDIR=/usr/lib/x86_64-linux-gnu/slurm-wlm
# glibc's own libraries: the host's are used (never carried).
BUNDLE_GLIBC_RE='^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libmvec\.so\.1|libnss_.*)$'
# The libraries a carried Slurm plugin may need; a plugin that needs any
# other (MySQL, IPMI, HDF5, RRD, curl, JWT...) is left out: delegate's
# slurm.conf loads none of those.
BUNDLE_PLUGIN_LIBS_RE='^(libmunge|liblua5\.1|libdbus-1|libsystemd|libcap|libgcrypt|liblzma|libzstd|liblz4|libgpg-error|libjson-c|libyaml-0|libnuma|libhwloc|libudev)\.so'

# bundle_elf_deps FILE...: the non-glibc libraries FILE... load (resolved
# paths, one per line).
bundle_elf_deps() {
    ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' \
        | while read -r name path; do
            [[ $name =~ $BUNDLE_GLIBC_RE || $name == libslurmfull.so ]] || echo "$path"
        done | sort -u
}

# bundle_plugin_ok PLUGIN: every library PLUGIN needs is one a plugin may.
bundle_plugin_ok() {
    local lib
    for lib in $(bundle_elf_deps "$1"); do
        [[ $(basename "$lib") =~ $BUNDLE_PLUGIN_LIBS_RE ]] || return 1
    done
    return 0
}

# bundle_programs ROOT: the programs into ROOT$BUNDLE_PREFIX/{bin,sbin}.
bundle_programs() {
    local root=$1 spec src dir name
    for spec in "${BUNDLE_PROGRAMS[@]}"; do
        IFS=: read -r src dir name <<<"$spec"
        name=${name:-$(basename "$src")}
        [[ -f $src ]] || die "bundle: $src is missing (apt-get install ${BUNDLE_PACKAGES[*]})"
        install -D -m 0755 "$src" "$root$BUNDLE_PREFIX/$dir/$name"
    done
}

# bundle_slurm_libs ROOT: libslurmfull and the plugins delegate can load,
# into ROOT$BUNDLE_PREFIX/lib/slurm (the node's PluginDir).
bundle_slurm_libs() {
    local root=$1 so kept=0 left=()
    install -d "$root$BUNDLE_PREFIX/lib/slurm"
    install -m 0755 "$BUNDLE_SLURM_LIBDIR/libslurmfull.so" "$root$BUNDLE_PREFIX/lib/slurm/"
    for so in "$BUNDLE_SLURM_LIBDIR"/*.so; do
        [[ $(basename "$so") == libslurm* ]] && continue
        if bundle_plugin_ok "$so"; then
            install -m 0755 "$so" "$root$BUNDLE_PREFIX/lib/slurm/"
            kept=$((kept + 1))
        else
            left+=("$(basename "$so" .so)")
        fi
    done
    log "bundle: $kept Slurm plugins; left out (libraries not carried): ${left[*]}"
}

# bundle_libraries ROOT: the non-glibc libraries of every carried ELF file,
# transitively, into ROOT$BUNDLE_PREFIX/lib.
bundle_libraries() {
    local root=$1 lib n=-1 files
    while :; do
        mapfile -t files < <(find "$root$BUNDLE_PREFIX" -type f \( -perm -u+x -o -name '*.so*' \) ! -name '*.deb')
        for lib in $(bundle_elf_deps "${files[@]}"); do
            install -m 0644 "$lib" "$root$BUNDLE_PREFIX/lib/$(basename "$lib")"
        done
        ((n == ${#files[@]})) && break
        n=${#files[@]}
    done
}

# bundle_runpath ROOT: every carried ELF file (but the static ones) finds
# its libraries in the prefix first.
bundle_runpath() {
    local root=$1 f n=0
    while IFS= read -r -d '' f; do
        [[ $(head -c 4 "$f" | od -An -c | tr -d ' ') == 177ELF ]] || continue
        readelf -d "$f" 2>/dev/null | grep -q '(NEEDED)' || continue
        patchelf --set-rpath "$BUNDLE_PREFIX/lib/slurm:$BUNDLE_PREFIX/lib" "$f" \
            || die "bundle: patchelf --set-rpath failed on $f"
        n=$((n + 1))
    done < <(find "$root$BUNDLE_PREFIX" -type f ! -name '*.deb' -print0)
    log "bundle: RUNPATH $BUNDLE_PREFIX/lib{/slurm,} set on $n ELF files"
}

# bundle_cuda_check ROOT: the CUDA check program, built here.
bundle_cuda_check() {
    gcc -std=gnu11 -O2 -Wall -Wextra -Werror -o "$1$BUNDLE_PREFIX/bin/delegate-cuda-check" \
        "$REPO/packaging/offline/cuda_check.c" -ldl || die "bundle: cannot build the CUDA check program"
}

# bundle_manifest ROOT: what is in the bundle, and from which versions.
bundle_manifest() {
    local root=$1
    {
        echo "delegate offline bundle, made $(date -u '+%F %T') UTC on $(. /etc/os-release && echo "$PRETTY_NAME")"
        echo "delegate $(sed -n '/^\[workspace.package\]/,/^\[/{s/^version = "\([^"]*\)"/\1/p}' "$REPO/Cargo.toml") ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown))"
        dpkg-query -W -f '${Package} ${Version}\n' slurmd munge docker.io containerd runc tini libc6
        echo "needs glibc >= $(dpkg-query -W -f '${Version}' libc6 | sed 's/-.*//')"
    } >"$root/MANIFEST"
}

# bundle_pack OUT: the bundle, as OUT.
bundle_pack() {
    local out=$1 stage root missing=()
    need_root bundle
    mapfile -t missing < <(missing_packages "${BUNDLE_PACKAGES[@]}")
    if ((${#missing[@]})); then
        log "bundle: installing ${missing[*]}"
        apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
            || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } \
            || die "apt-get install ${missing[*]} failed"
    fi
    stage=$(mktemp -d -p "$BC_TMP")
    root=$stage/payload
    log "bundle: delegate's packages for Slurm $(dpkg-query -W -f '${Version}' slurmd) (build_cluster.sh packages)"
    "$REPO/packaging/build-debs.sh" --out "$root$BUNDLE_PREFIX/debs" >"$stage/debs.log" 2>&1 \
        || { tail -n 20 "$stage/debs.log"; die "bundle: build_cluster.sh packages failed"; }
    bundle_programs "$root"
    bundle_slurm_libs "$root"
    bundle_cuda_check "$root"
    install -d "$root$BUNDLE_PREFIX/lib"
    bundle_libraries "$root"
    bundle_runpath "$root"
    install -D -m 0755 -t "$root$BUNDLE_PREFIX/share" "$REPO"/packaging/offline/*.sh
    local f
    for f in build_cluster.d/common.sh build_cluster.d/local.sh cluster.toml slurm-conf/epilog.sh slurm-conf/logrotate.conf slurm-conf/cgroup-slice.sh; do
        install -D -m "$(stat -c %a "$REPO/$f")" "$REPO/$f" "$root$BUNDLE_PREFIX/share/repo/$f"
    done
    install -d "$stage/delegate-offline"
    install -m 0755 "$REPO/packaging/offline/install.sh" "$stage/delegate-offline/install.sh"
    bundle_manifest "$stage/delegate-offline"
    log "bundle: compressing ($(du -sm "$root" | cut -f1) MiB; xz, a minute)"
    tar --numeric-owner --owner=0 --group=0 -C "$root" -cf - . | xz -6 -T0 >"$stage/delegate-offline/payload.tar.xz" \
        || die "bundle: xz failed"
    install -d "$(dirname "$out")"
    tar -C "$stage" -cf "$out.tmp" delegate-offline && mv "$out.tmp" "$out"
    local mib=$(( ($(stat -c %s "$out") + 1048575) / 1048576 ))
    ((mib <= BUNDLE_MAX_MIB)) || die "bundle: $out is $mib MiB, over $BUNDLE_MAX_MIB MiB"
    log "bundle: $out ($mib MiB). On the GPU machine, as root:"
    log "  tar -xf $(basename "$out") && delegate-offline/install.sh --check"
}

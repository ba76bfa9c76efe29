#!/bin/bash
# host-image.sh TAG -- the offline bundle's sandbox image, made from this
# machine's own files (no registry, no network; docs/ml.md, "An offline GPU
# check"): its Python (the program behind `python3`, a virtual
# environment's too) with the standard library, a shell and a few tools,
# the NVIDIA driver's user-space libraries and the real nvidia-smi (a
# wrapper script such as `exec /usr/local/nvidia/bin/nvidia-smi` is
# followed to the program it runs), the bundle's CUDA check, delegate's
# sandbox side (delegate_sandbox and cloudpickle from delegate's wheels),
# and every shared library those load, at the paths they have here.
# Imported into the engine as TAG (docker import).
set -euo pipefail

TAG=${1:?usage: host-image.sh TAG}
PREFIX=/opt/delegate-offline
WHEELS=/usr/share/delegate/wheels
WORK=$(mktemp -d "${TMPDIR:-/tmp}/delegate-host-image.XXXXXX")
trap 'rm -rf -- "$WORK"' EXIT
ROOT=$WORK/root
# The Python: the real program behind `python3` (a virtual environment's
# python3, as the GPU machine's PyTorch one, is a link to it), asked as
# itself so that its paths are the ones the image's python3 sees: the
# image has no pyvenv.cfg.
PY=$(readlink -f -- "$(command -v python3)")
# Every file put in the image, by its path here: ldd reads these, not the
# copies (a noexec /tmp would make the copies "not a dynamic executable").
SOURCES=$WORK/sources

say() { echo "   image: $*"; }

# is_elf FILE
is_elf() { [[ -f $1 && $(head -c 4 "$1" | od -An -c | tr -d ' ') == 177ELF ]]; }

# put FILE...: each file at its own path in the image, its symlinks too.
put() {
    local f real
    for f in "$@"; do
        [[ -e $f ]] || continue
        real=$(readlink -f -- "$f")
        echo "$real" >>"$SOURCES"
        install -D -m "$(stat -c %a "$real")" "$real" "$ROOT$real"
        if [[ $f != "$real" ]]; then
            install -d "$ROOT$(dirname "$f")"
            ln -sfn "$real" "$ROOT$f"
        fi
    done
}

# nvidia_smi: the real nvidia-smi program (not a wrapper script), or nothing.
nvidia_smi() {
    local f cand
    f=$(command -v nvidia-smi 2>/dev/null) || true
    for cand in "$f" $( [[ -n $f ]] && grep -aoE '/[A-Za-z0-9_./-]*nvidia-smi' "$f" 2>/dev/null ) \
        /usr/local/nvidia/bin/nvidia-smi /usr/bin/nvidia-smi; do
        [[ -n $cand ]] && is_elf "$(readlink -f -- "$cand")" && { readlink -f -- "$cand"; return; }
    done
    return 0
}

# driver_libs: the NVIDIA driver's user-space libraries ldconfig knows.
driver_libs() {
    ldconfig -p 2>/dev/null | awk '$1 ~ /^lib(cuda|nvidia-[a-z-]+|nvcuvid|nvoptix)\.so/ && /x86-64/ { print $NF }' | sort -u
}

python_files() {
    local stdlib site
    stdlib=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
    put "$PY"
    # The sandbox runs `python3` from the image's PATH.
    [[ $PY == /usr/bin/python3 ]] || { install -d "$ROOT/usr/bin"; ln -sfn "$PY" "$ROOT/usr/bin/python3"; }
    tar -C / --exclude=test --exclude=tests --exclude=idlelib --exclude=tkinter --exclude=ensurepip \
        --exclude=__pycache__ --exclude=site-packages --exclude=dist-packages -cf - "${stdlib#/}" | tar -C "$ROOT" -xf -
    # delegate's sandbox side where this Python looks for packages.
    site=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
    local whl
    for whl in "$WHEELS"/cloudpickle-*.whl "$WHEELS"/delegate-*.whl; do
        [[ -f $whl ]] || { echo "host-image.sh: no $whl" >&2; exit 1; }
        python3 -m zipfile -e "$whl" "$ROOT$site"
    done
    say "python $("$PY" -c 'import sys; print(sys.version.split()[0])') ($PY), delegate_sandbox and cloudpickle in $site"
}

programs() {
    local p smi
    for p in sh bash env ls cat id uname sleep true false; do
        put "$(command -v "$p")"
    done
    put "$PREFIX/bin/delegate-cuda-check"
    install -d "$ROOT/usr/local/bin"
    ln -sfn "$PREFIX/bin/delegate-cuda-check" "$ROOT/usr/local/bin/delegate-cuda-check"
    smi=$(nvidia_smi)
    if [[ -n $smi ]]; then
        put "$smi"
        install -d "$ROOT/usr/bin"
        [[ $smi == /usr/bin/nvidia-smi ]] || ln -sfn "$smi" "$ROOT/usr/bin/nvidia-smi"
        say "nvidia-smi: $smi$( [[ $(command -v nvidia-smi) != "$smi" ]] && echo " (behind $(command -v nvidia-smi))")"
    else
        say "no nvidia-smi on this machine"
    fi
    local libs
    mapfile -t libs < <(driver_libs)
    ((${#libs[@]})) && put "${libs[@]}"
    say "${#libs[@]} NVIDIA driver libraries"
}

# closure: every shared library of every ELF file in the image (the
# standard library's extension modules too), and the loader.
closure() {
    local n=-1 f lib
    find "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" -name '*.so' >>"$SOURCES"
    while :; do
        sort -u -o "$SOURCES" "$SOURCES"
        (($(wc -l <"$SOURCES") == n)) && break
        n=$(wc -l <"$SOURCES")
        cp "$SOURCES" "$WORK/round"
        while read -r f; do
            is_elf "$f" || continue
            for lib in $(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }'); do
                [[ -e $ROOT$lib || -L $ROOT$lib ]] || put "$lib"
            done
        done <"$WORK/round"
    done
}

skeleton() {
    install -d -m 1777 "$ROOT/tmp"
    install -d -m 0755 "$ROOT/job" "$ROOT/etc" "$ROOT/dev" "$ROOT/proc" "$ROOT/sys"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$ROOT/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$ROOT/etc/group"
    [[ -e $ROOT/bin/sh || -L $ROOT/bin/sh ]] || { install -d "$ROOT/bin"; ln -sfn "$(readlink -f "$(command -v sh)")" "$ROOT/bin/sh"; }
    find "$ROOT" -perm /6000 -type f -exec chmod a-s {} +
    chmod -R a+rX "$ROOT"
}

# loader_cache: the image's own ld.so.cache over the folders its libraries
# are in (a driver folder such as /usr/local/nvidia/lib64 is none of the
# loader's defaults).
loader_cache() {
    grep -E '\.so(\.[0-9.]+)?$' "$SOURCES" | xargs -r -n1 dirname | sort -u >"$ROOT/etc/ld.so.conf"
    ldconfig -r "$ROOT" 2>/dev/null || true
    [[ -s $ROOT/etc/ld.so.cache ]] || { echo "host-image.sh: ldconfig made no cache for the image" >&2; exit 1; }
    chmod 0644 "$ROOT/etc/ld.so.conf" "$ROOT/etc/ld.so.cache"
}

python_files
programs
closure
skeleton
loader_cache
say "$(du -sm "$ROOT" | cut -f1) MiB"
tar --numeric-owner --owner=0 --group=0 -C "$ROOT" -c . \
    | docker import -c 'ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1' -m "delegate offline: this machine's files" - "$TAG" >/dev/null
say "$TAG imported"

# The sandbox image every delegate job runs in (default delegate-sandbox:latest).
# Built by build_cluster.sh on top of BASE_IMAGE: a registry image such as
# debian:bookworm-slim where a registry is reachable, otherwise a local
# debootstrap import (delegate-base:bookworm).
ARG BASE_IMAGE=delegate-base:bookworm
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1

# Lean on purpose: Python for the payloads, a C toolchain for the
# measurements students build in their job directory, libpfm4 for CFiddle's
# libcfiddle.so (perf counter names).
# Then strip every setuid/setgid bit: jobs run as the submitting user with
# no-new-privileges, and nothing in the image needs to gain privileges.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 gcc make libc6-dev libpfm4 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && find / -xdev -perm /6000 -type f -exec chmod a-s {} + \
 && python3 --version && gcc --version | head -n1

# The Python side of delegate (build_cluster.sh sends a context of docker/,
# python/pyproject.toml, the executor and wheels/): cloudpickle at exactly
# the version pinned in python/pyproject.toml -- the one place it is pinned,
# so the wheel and the sandbox cannot drift; its pure-Python wheel is
# downloaded on the host and unpacked here, no pip or network in the image --
# and the executor module the runner starts for a Python job
# (python3 -m delegate_sandbox /job).
COPY python/pyproject.toml /tmp/delegate/pyproject.toml
COPY python/pysrc/delegate_sandbox /tmp/delegate/delegate_sandbox
COPY wheels /tmp/delegate/wheels
RUN set -e; \
    pin=$(python3 -c 'import tomllib; d = tomllib.load(open("/tmp/delegate/pyproject.toml", "rb")); print(*[r for r in d["project"]["dependencies"] if r.startswith("cloudpickle==")])'); \
    ver=${pin#cloudpickle==}; test -n "$ver"; \
    whl=/tmp/delegate/wheels/cloudpickle-$ver-py3-none-any.whl; \
    test -f "$whl" || { echo "missing $whl (build_cluster.sh downloads it)" >&2; exit 1; }; \
    site=$(python3 -c 'import site; print([p for p in site.getsitepackages() if p.startswith("/usr/local/")][0])'); \
    mkdir -p "$site"; \
    python3 -m zipfile -e "$whl" "$site"; \
    cp -r /tmp/delegate/delegate_sandbox "$site/"; rm -rf /tmp/delegate; \
    find "$site" -name __pycache__ -prune -exec rm -rf {} +; \
    chmod -R a+rX "$site"; \
    python3 -m compileall -q "$site"; \
    python3 -c 'import cloudpickle, delegate_sandbox; assert cloudpickle.__version__ == "'"$ver"'"; print("cloudpickle", cloudpickle.__version__)'

# CFiddle and its run-time needs (delegate.cfiddle runs cfiddle-run here on
# the executables CFiddle built on the caller's side), and Dask (a graph's
# tasks run here, docs/ml.md), at exactly the versions
# of python/requirements-cfiddle.txt -- the one place they are pinned, which
# the user image and the test venv install too. Their wheels are downloaded
# on the host (build_cluster.sh, for this image's Python) and unpacked with
# --no-deps semantics: only the pinned files, each checked present.
# CFIDDLE=0 (build_cluster.sh's DELEGATE_SANDBOX_CFIDDLE=0): an image
# without CFiddle (nor Dask), for a Python its pins have no wheels for.
ARG CFIDDLE=1
COPY python/requirements-cfiddle.txt /tmp/cfiddle/requirements-cfiddle.txt
COPY wheels-cfiddle /tmp/cfiddle/wheels
RUN set -e; \
    if [ "$CFIDDLE" = 0 ]; then rm -rf /tmp/cfiddle; echo "no CFiddle in this image (CFIDDLE=0)"; exit 0; fi; \
    site=$(python3 -c 'import site; print([p for p in site.getsitepackages() if p.startswith("/usr/local/")][0])'); \
    n=0; \
    for pin in $(sed -e 's/#.*//' /tmp/cfiddle/requirements-cfiddle.txt); do \
        name=$(echo "${pin%%==*}" | tr 'A-Z.-' 'a-z__'); ver=${pin#*==}; found=; \
        for whl in /tmp/cfiddle/wheels/*.whl; do \
            base=$(basename "$whl"); wname=$(echo "${base%%-*}" | tr 'A-Z.-' 'a-z__'); rest=${base#*-}; \
            if [ "$wname" = "$name" ] && [ "${rest%%-*}" = "$ver" ]; then found=$whl; fi; \
        done; \
        test -n "$found" || { echo "missing the wheel of $pin (build_cluster.sh downloads it)" >&2; exit 1; }; \
        python3 -m zipfile -e "$found" "$site"; n=$((n + 1)); \
    done; \
    rm -rf /tmp/cfiddle; \
    find "$site" -name __pycache__ -prune -exec rm -rf {} +; \
    chmod -R a+rX "$site"; \
    python3 -m compileall -q "$site" >/dev/null 2>&1 || true; \
    python3 -c 'import ctypes, importlib.metadata as m, os, cfiddle, cfiddle.Runner, cfiddle.paths; lib = cfiddle.paths.cfiddle_lib_path(); ctypes.CDLL(os.path.join(lib, "libcfiddle.so")); print("cfiddle", m.version("cfiddle"), "pandas", m.version("pandas"), "libcfiddle in", lib)'; \
    python3 -c 'import importlib.metadata as m, dask, dask.array, dask.local; print("dask", m.version("dask"))'; \
    python3 -c 'import importlib.metadata as m, tensorboardX; print("tensorboardX", m.version("tensorboardX"), "protobuf", m.version("protobuf"))'; \
    echo "$n CFiddle wheels unpacked"

LABEL org.opencontainers.image.title="delegate-sandbox" \
      org.opencontainers.image.description="Sandbox image for delegate jobs"

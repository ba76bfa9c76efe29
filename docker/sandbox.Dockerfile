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
# measurements students build in their job directory.
# Then strip every setuid/setgid bit: jobs run as the submitting user with
# no-new-privileges, and nothing in the image needs to gain privileges.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 gcc make libc6-dev \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && find / -xdev -perm /6000 -type f -exec chmod a-s {} + \
 && python3 --version && gcc --version | head -n1

LABEL org.opencontainers.image.title="delegate-sandbox" \
      org.opencontainers.image.description="Sandbox image for delegate jobs"

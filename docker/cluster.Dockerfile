# The image of the stack's head, slurmdbd and worker nodes (docker/cluster.Dockerfile),
# and the base of the user node's image (docker/user.Dockerfile).
# Built by `build_cluster.sh deploy|update` with a context of docker/,
# slurm-conf/epilog.sh and cgroup-slice.sh, slurm-conf/spank/ and bin/ (the workspace's release binaries and the
# host's Docker CLI), on top of BASE_IMAGE (a registry image such as
# debian:bookworm-slim, or the local debootstrap import).
ARG BASE_IMAGE=delegate-base:bookworm

# The lockdown's SPANK plugin (slurm-conf/spank/delegate_lockdown.c), built
# against the same Debian Slurm as the final image's (libslurm-dev's
# spank.h); only the .so is copied out of this stage.
FROM ${BASE_IMAGE} AS spank
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libslurm-dev \
 && rm -rf /var/lib/apt/lists/*
COPY slurm-conf/spank/delegate_lockdown.c /src/delegate_lockdown.c
RUN gcc -std=gnu11 -Wall -Wextra -Werror -O2 -fPIC -shared \
        -o /src/delegate_lockdown.so /src/delegate_lockdown.c

FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8

# Slurm (controller, node daemon, accounting daemon, client commands) and
# munge from Debian.
# The packages' postinst scripts try to start services: harmless here (no
# init in the build), the entrypoint starts the daemons itself.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        slurmctld slurmd slurmdbd slurm-client munge ca-certificates procps curl \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && slurmd -V

# The Docker CLI, for the epilog's sweep by label (root only: the agent
# talks to the engine's API itself). It is the host's own client binary: the
# engine it talks to is the host's, and Debian has no CLI-only package. No
# engine runs in this image: workers use the host's engine through its
# socket, mounted in the root-only directory /run/delegate-engine (0700).
COPY bin/docker /usr/bin/docker

# delegate: the CLI (user node, and `delegate doctor` anywhere), the runner
# and the root agent (docs/security.md, "Who starts containers"). The runner
# is an ordinary program (root:root 0755, no setgid): it asks the agent,
# which the worker's entrypoint starts as root and which alone reaches the
# Docker socket. Students are in no group that owns the socket.
COPY bin/delegate bin/sandbox-runner bin/sandbox-agent bin/delegate-deploy bin/delegate-power bin/delegate-place /tmp/bin/
RUN set -e; \
    install -o root -g root -m 0755 /tmp/bin/delegate /usr/local/bin/delegate; \
    install -o root -g root -m 0755 /tmp/bin/sandbox-runner /usr/local/bin/sandbox-runner; \
    install -o root -g root -m 0755 /tmp/bin/sandbox-agent /usr/local/sbin/sandbox-agent; \
    install -o root -g root -m 0755 /tmp/bin/delegate-deploy /usr/local/sbin/delegate-deploy; \
    install -o root -g root -m 0755 /tmp/bin/delegate-power /usr/local/sbin/delegate-power; \
    install -o root -g root -m 0755 /tmp/bin/delegate-place /usr/local/sbin/delegate-place; \
    install -d -o root -g root -m 0700 /run/delegate-engine; \
    rm -rf /tmp/bin; \
    ls -l /usr/local/bin/sandbox-runner /usr/local/sbin/sandbox-agent

# The lockdown's SPANK plugin (slurm.conf's PlugStackConfig names it through
# /etc/slurm/delegate-plugstack.conf, installed by the entrypoint).
COPY --from=spank /src/delegate_lockdown.so /usr/local/lib/delegate/delegate_lockdown.so

# The Slurm epilog (sweeps leftover sandbox containers of the ending job).
COPY slurm-conf/epilog.sh /etc/slurm/delegate-epilog.sh
# slurmd's slice on cgroup v2 without systemd (the worker entrypoint runs it).
COPY slurm-conf/cgroup-slice.sh /usr/local/lib/delegate/cgroup-slice.sh
COPY docker/cluster-entrypoint.sh /usr/local/sbin/cluster-entrypoint
RUN chmod 0755 /etc/slurm/delegate-epilog.sh /usr/local/sbin/cluster-entrypoint \
 && install -d -m 0755 /var/lib/delegate /var/log/delegate /run/delegate /etc/delegate

ENTRYPOINT ["/usr/local/sbin/cluster-entrypoint"]
CMD ["worker"]
LABEL org.opencontainers.image.title="delegate-cluster" \
      org.opencontainers.image.description="delegate head/dbd/worker node: munge, Slurm, sandbox-runner, sandbox-agent, delegate-power"

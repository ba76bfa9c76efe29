# An emulated machine for the multi-machine tests (tests/machines/): what a
# course's server is before delegate touches it: Debian with its own Docker
# engine (Debian's docker.io: 20.10 on bookworm, 26 on trixie), an ssh
# server, iptables, and GlusterFS (the home's server on the machine `home`,
# its FUSE client on the others: a network filesystem that caches). Run privileged,
# with its own hostname and address on a private network, its engine's data
# on a volume (tests/machines/machines.sh). Nothing of delegate is in it:
# the instructor's commands put it there.
ARG BASE_IMAGE=delegate-base:bookworm
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
# (Debian 13 ships the docker CLI as its own package, docker-cli.)
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        $(apt-cache show docker-cli >/dev/null 2>&1 && echo docker-cli) \
        docker.io iptables openssh-server openssh-client sshfs fuse3 \
        glusterfs-server glusterfs-client \
        procps iproute2 ca-certificates curl python3 util-linux \
 && rm -rf /var/lib/apt/lists/*
COPY machine-entrypoint.sh /usr/local/sbin/machine-entrypoint
ENTRYPOINT ["/usr/local/sbin/machine-entrypoint"]

# The stack's accounting database (docker/db-entrypoint.sh): Debian's
# MariaDB server, built locally on top of BASE_IMAGE (no registry image).
# Built by `build_cluster.sh deploy|update` (build_cluster.d/stack_accounting.sh)
# with a context of docker/db-entrypoint.sh. Its data lives on a named
# volume (the stack file), its users' password in a swarm secret.
ARG BASE_IMAGE=delegate-base:bookworm
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
RUN apt-get update \
 && apt-get install -y --no-install-recommends mariadb-server mariadb-client \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/lib/mysql/* \
 && mariadbd --version
COPY docker/db-entrypoint.sh /usr/local/sbin/db-entrypoint
RUN chmod 0755 /usr/local/sbin/db-entrypoint
ENTRYPOINT ["/usr/local/sbin/db-entrypoint"]
LABEL org.opencontainers.image.title="delegate-db" \
      org.opencontainers.image.description="delegate stack: MariaDB for slurmdbd (Slurm accounting)"

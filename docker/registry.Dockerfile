# The course's image registry (build_cluster.d/registry.sh): Debian's
# docker-registry, from which worker machines pull the cluster and sandbox
# images. Its TLS certificate, htpasswd file and storage are mounted at run
# time; the settings below override the package's config.yml.
ARG BASE_IMAGE=delegate-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends docker-registry apache2-utils \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
ENV REGISTRY_HTTP_TLS_CERTIFICATE=/etc/delegate-registry/server.crt \
    REGISTRY_HTTP_TLS_KEY=/etc/delegate-registry/server.key \
    REGISTRY_AUTH_HTPASSWD_PATH=/etc/delegate-registry/htpasswd \
    REGISTRY_AUTH_HTPASSWD_REALM=delegate
EXPOSE 5000
ENTRYPOINT ["/usr/bin/docker-registry", "serve", "/etc/docker/registry/config.yml"]

# A node of the test site (tests/site/): Debian 13 with its own Slurm (24.11)
# and munge from Debian's archive, as a site runs them. delegate is NOT in
# the image: tests/site/site.sh installs delegate's packages into the
# running containers with dpkg, as a site admin would.
ARG BASE_IMAGE=delegate-site-base:trixie
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie trixie-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        >/etc/apt/sources.list.d/debian.sources \
 && rm -f /etc/apt/sources.list \
 && apt-get update -q \
 && apt-get install -y -q --no-install-recommends \
        slurmctld slurmd slurm-client slurm-wlm-basic-plugins libslurm-dev munge \
        procps util-linux iproute2 docker-cli systemd python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && dpkg-query -W slurmctld slurmd munge

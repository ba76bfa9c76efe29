# The stack's user node: everything of the cluster image (munge and the
# Slurm client commands to submit; the delegate CLI) plus Python with the
# delegate package, JupyterLab and JupyterHub in /opt/delegate/venv, and
# configurable-http-proxy (Node.js) for the hub.
# Built by `build_cluster.sh deploy|update` with a context of docker/,
# wheels/ (the delegate wheel built with maturin; JupyterLab, JupyterHub,
# jupyterhub-idle-culler, cloudpickle and their dependencies, downloaded on
# the host: the build has no PyPI access), chp/ (configurable-http-proxy,
# `npm install`ed on the host) and stack/jupyterhub_config.py. The pinned
# versions are in stack/hub-versions.
# CFiddle at the pins of python/requirements-cfiddle.txt (the same file the
# sandbox image installs), copied beside the wheels.
ARG CLUSTER_IMAGE=delegate-cluster:latest
FROM ${CLUSTER_IMAGE}

# nodejs: configurable-http-proxy; openssl: a fallback certificate;
# iptables: the per-student limit of queries to Slurm (the entrypoint);
# gcc, g++, make, libc6-dev: CFiddle's build() compiles on the caller's side
# (here), the sandbox runs what it built.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv nodejs openssl iptables \
        gcc g++ make libc6-dev \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

ARG HUB_PIP_PINS=""
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/delegate/venv \
 && /opt/delegate/venv/bin/pip install -q --no-index --find-links /tmp/wheels jupyterlab ${HUB_PIP_PINS} delegate \
 && /opt/delegate/venv/bin/pip install -q --no-index --no-deps --find-links /tmp/wheels -r /tmp/wheels/requirements-cfiddle.txt \
 && rm -rf /tmp/wheels /root/.cache \
 && /opt/delegate/venv/bin/python -c 'import delegate, cloudpickle, jupyterlab, jupyterhub, jupyterhub_idle_culler, pamela; print("delegate ok, cloudpickle", cloudpickle.__version__, "jupyterlab", jupyterlab.__version__, "jupyterhub", jupyterhub.__version__)' \
 && /opt/delegate/venv/bin/python -c 'import delegate._jupyter, tensorboard, tensorboardX; print("tensorboard", tensorboard.__version__)'

# Every student's Jupyter server serves their jobs' TensorBoard
# (delegate._jupyter, a jupyter_server extension of the delegate package).
RUN install -d /opt/delegate/venv/etc/jupyter/jupyter_server_config.d \
 && printf '%s\n' '{"ServerApp": {"jpserver_extensions": {"delegate._jupyter": true}}}' \
        >/opt/delegate/venv/etc/jupyter/jupyter_server_config.d/delegate.json

# JupyterLab's defaults for every student: no "get notified about official
# Jupyter news?" popup over the first screen, no update check (no internet).
RUN install -d /opt/delegate/venv/share/jupyter/lab/settings \
 && printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' \
        >/opt/delegate/venv/share/jupyter/lab/settings/overrides.json

COPY chp /opt/configurable-http-proxy
RUN ln -s /opt/configurable-http-proxy/node_modules/.bin/configurable-http-proxy /usr/local/bin/configurable-http-proxy \
 && configurable-http-proxy --version

COPY stack/jupyterhub_config.py /etc/jupyterhub/jupyterhub_config.py
COPY stack/rush_page.py /etc/jupyterhub/rush_page.py
COPY docker/keep-passwords.sh /usr/local/lib/delegate/keep-passwords
RUN chmod 0644 /etc/jupyterhub/jupyterhub_config.py /etc/jupyterhub/rush_page.py \
 && chmod 0755 /usr/local/lib/delegate/keep-passwords \
 && install -d -m 0700 /var/lib/jupyterhub /etc/jupyterhub/tls

# Users' shells and Jupyter kernels find the venv first.
ENV PATH=/opt/delegate/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN echo 'PATH=/opt/delegate/venv/bin:$PATH' >/etc/profile.d/delegate.sh

CMD ["user"]
LABEL org.opencontainers.image.title="delegate-user" \
      org.opencontainers.image.description="delegate user node: Python, delegate, JupyterLab, JupyterHub"

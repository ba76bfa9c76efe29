# The stack's user node: everything of the cluster image (munge and the
# Slurm client commands to submit; the delegate CLI) plus Python with the
# delegate package and JupyterLab in /opt/delegate/venv.
# Built by `build_cluster.sh deploy|update` with a context of docker/ and
# wheels/ (the delegate wheel built with maturin, JupyterLab, cloudpickle and
# their dependencies, downloaded on the host: the build has no PyPI access;
# CFiddle at the pins of python/requirements-cfiddle.txt, the same file the
# sandbox image installs, copied beside them).
ARG CLUSTER_IMAGE=delegate-cluster:latest
FROM ${CLUSTER_IMAGE}

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

COPY wheels /tmp/wheels
RUN python3 -m venv /opt/delegate/venv \
 && /opt/delegate/venv/bin/pip install -q --no-index --find-links /tmp/wheels jupyterlab delegate \
 && /opt/delegate/venv/bin/pip install -q --no-index --no-deps --find-links /tmp/wheels -r /tmp/wheels/requirements-cfiddle.txt \
 && rm -rf /tmp/wheels /root/.cache \
 && /opt/delegate/venv/bin/python -c 'import delegate, cloudpickle, jupyterlab; print("delegate ok, cloudpickle", cloudpickle.__version__, "jupyterlab", jupyterlab.__version__)'

# Users' shells and Jupyter kernels find the venv first.
ENV PATH=/opt/delegate/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN echo 'PATH=/opt/delegate/venv/bin:$PATH' >/etc/profile.d/delegate.sh

CMD ["user"]
LABEL org.opencontainers.image.title="delegate-user" \
      org.opencontainers.image.description="delegate user node: Python, delegate, JupyterLab"

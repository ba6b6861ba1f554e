# syntax=docker/dockerfile:1
#
# inplace-extension: the CAPI Runtime Extension (`inplace-extension serve`) with ansible-core,
# ansible-runner and an OpenSSH client. Two stages: "build" installs the project into a virtualenv,
# the final stage copies that virtualenv onto a fresh slim Debian Python and runs as a non-root user.
#
#   docker build -t inplace-extension:0.1.0 .
#
# BASE_IMAGE is the Python both stages start from. The default is the official slim image; any Debian
# bookworm image with python3, python3-venv, python-is-python3 and passwd works the same (the tests
# build one from Debian packages with mmdebstrap: tests/deploy/image.py).
#
# Mounts expected at run time (deploy/deployment.yaml wires each of them):
#   /etc/inplace-extension/tls/        tls.crt + tls.key (cert-manager Secret)   INPLACE_TLS_CERT/KEY
#   /etc/inplace-extension/ssh/        SSH private key named by the inventory     (inventory.yaml)
#   /etc/inplace-extension/inventory/  inventory.yaml                             INPLACE_INVENTORY
#   /var/lib/inplace-extension/        state: runs/ (artifacts), ansible/ (home)  INPLACE_RUNS_DIR
#   /tmp                               scratch for Python and Ansible
# The root filesystem can be read-only: everything written goes to the last two.

ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/inplace-extension/venv
COPY pyproject.toml README.md ./
COPY inplace_extension/ inplace_extension/
RUN /opt/inplace-extension/venv/bin/pip install .

FROM ${BASE_IMAGE}
# openssh-client is what Ansible's ssh connection runs. Debian's bookworm security updates move its
# version, so it is not pinned (DL3008): a rebuild picks up the patched client.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-client \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 inplace \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /var/lib/inplace-extension --shell /usr/sbin/nologin inplace \
    && install -d -o 10001 -g 10001 -m 0750 \
        /var/lib/inplace-extension /var/lib/inplace-extension/runs /var/lib/inplace-extension/ansible
COPY --from=build /opt/inplace-extension/venv /opt/inplace-extension/venv
COPY playbooks/ /opt/inplace-extension/playbooks/
COPY schemas/ /opt/inplace-extension/schemas/
ENV PATH=/opt/inplace-extension/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/inplace-extension \
    ANSIBLE_HOME=/var/lib/inplace-extension/ansible \
    ANSIBLE_LOCAL_TEMP=/tmp/ansible-local \
    INPLACE_LISTEN=0.0.0.0:9443 \
    INPLACE_TLS_CERT=/etc/inplace-extension/tls/tls.crt \
    INPLACE_TLS_KEY=/etc/inplace-extension/tls/tls.key \
    INPLACE_TLS_DIR=/var/lib/inplace-extension/tls \
    INPLACE_RUNS_DIR=/var/lib/inplace-extension/runs \
    INPLACE_PLAYBOOKS_DIR=/opt/inplace-extension/playbooks
WORKDIR /var/lib/inplace-extension
VOLUME ["/var/lib/inplace-extension"]
USER 10001:10001
EXPOSE 9443
# Liveness of this process over loopback. The serving certificate names the Service, not 127.0.0.1,
# so this one probe skips verification; it sends nothing and reads only the status.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import ssl, urllib.request as u; u.urlopen('https://127.0.0.1:9443/healthz', context=ssl._create_unverified_context(), timeout=4)"]
ENTRYPOINT ["inplace-extension"]
CMD ["serve"]

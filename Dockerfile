# tuneplane-node as an image: the wheel and its pinned dependencies (constraints.txt) in a
# venv on a slim Python base. The build reads only the wheels you made, no index:
#   .venv/bin/pip wheel -c constraints.txt -w dist/wheels .
#   docker build -t tuneplane-node:0.1.0 .
# Run it with the host's network and the engine's socket (docs/operating.md, "An image"; the
# Kubernetes example is contrib/k8s/daemonset.yaml). BASE must be a Debian with Python
# 3.11 (the wheels are built for it): a private mirror's copy, or one made from Debian
# packages (tests/engines/test_image.py does that where no registry is reachable).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
COPY constraints.txt /tmp/constraints.txt
COPY dist/wheels/ /tmp/wheels/
RUN python3 -m venv /opt/tuneplane-node \
    && /opt/tuneplane-node/bin/pip install --no-cache-dir --no-index \
        --find-links /tmp/wheels -c /tmp/constraints.txt tuneplane-node

FROM ${BASE}
COPY --from=build /opt/tuneplane-node /opt/tuneplane-node
# Not root: give it the engine socket's group (docker run --group-add <gid>). Podman's
# socket has no group, and a Kubernetes hostPath state dir is root's: run those as root
# with every capability dropped (contrib/k8s/daemonset.yaml).
RUN useradd --system --uid 10001 --user-group --no-create-home \
        --home-dir /var/lib/tuneplane-node tuneplane-node \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/tuneplane-node
ENV PATH=/opt/tuneplane-node/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TUNEPLANE_NODE_STATE_DIR=/var/lib/tuneplane-node
USER 10001
WORKDIR /var/lib/tuneplane-node
EXPOSE 8470
# /healthz needs no token. Plain HTTP on the configured port: with TLS the check takes
# https (certificate unchecked: it asks only whether the process serves).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, ssl, urllib.request as u; tls = bool(os.environ.get('TUNEPLANE_TLS_CERT_FILE')); port = os.environ.get('TUNEPLANE_NODE_PORT') or '8470'; u.urlopen(('https' if tls else 'http') + '://127.0.0.1:' + port + '/healthz', timeout=4, context=ssl._create_unverified_context() if tls else None)"]
ENTRYPOINT ["tuneplane-node"]
CMD ["serve"]

# syntax=docker/dockerfile:1
# rnic-exporter container image: a small, non-root image that runs `rnic-exporter serve`.
#
#   docker build -t rnic-exporter:0.1.0 .
#   docker run -d --name rnic-exporter --network host --read-only \
#     -v /sys:/host/sys:ro -v /var/lib/rnic-exporter:/var/lib/rnic-exporter \
#     -v /run/NetworkManager:/host/root/run/NetworkManager:ro \
#     -v /etc/machine-id:/etc/machine-id:ro \
#     rnic-exporter:0.1.0
#
# The host's /sys and the host network must be visible: RDMA devices are read from the host's sysfs
# (mounted at /host/sys, read-only), and netdevs, their addresses and uevents exist only in the
# host's network namespace (with --network host, /proc/sys/net is the host's too). The state volume
# keeps the NIC inventory across restarts; it must be writable by uid 65534
# (`install -d -o 65534 -g 65534 -m 0700 /var/lib/rnic-exporter`). NetworkManager's run directory
# (optional) lets it warn that a port flap will drop the addresses; the machine id (optional) is
# the OTLP resource's host.id.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build stage: install the package and its dependencies (with the OTLP extra) into a venv. The
# runtime stage copies only the venv: no compilers, wheels or pip caches in the final image.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md CHANGELOG.md ./
COPY rnic_exporter/ rnic_exporter/
COPY dashboards/ dashboards/
COPY alerts/ alerts/
COPY packaging/ packaging/
COPY docs/runbooks/ docs/runbooks/
RUN python -m venv /opt/rnic-exporter \
    && /opt/rnic-exporter/bin/pip install --no-cache-dir ".[otel]"

# Runtime stage: the same Python base (the venv points at its interpreter). libudev1, which pyudev
# loads, is already in every Debian base image (util-linux pre-depends on it).
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="rnic-exporter" \
      org.opencontainers.image.description="Prometheus/OpenTelemetry exporter for RDMA NICs" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/rnic-exporter /opt/rnic-exporter
# The state directory for when no volume is mounted; owned by the unprivileged user.
RUN install -d -o 65534 -g 65534 -m 0700 /var/lib/rnic-exporter
# Read-only root filesystem friendly: no .pyc writes; logs straight to stderr.
ENV PATH=/opt/rnic-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65534:65534
EXPOSE 19879
# /-/healthy at the address and scheme the exporter (PID 1) was started with: it reads that command
# line's --web.listen-address and --web.config.file (HTTPS when the web config has TLS; the health
# endpoints need no basic auth). See docs/http-front.md.
HEALTHCHECK --interval=30s --timeout=5s \
    CMD ["python", "-m", "rnic_exporter.commands.healthcheck"]
ENTRYPOINT ["rnic-exporter"]
CMD ["serve", "--path.sysfs=/host/sys", "--path.rootfs=/host/root", "--state.dir=/var/lib/rnic-exporter"]

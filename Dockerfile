# syntax=docker/dockerfile:1
# cdcd container image: PostgreSQL logical replication -> Kafka CDC daemon.
#
# Build:  docker build -t cdcd:0.1.0 .
# Run:    docker run --rm -p 9187:9187 \
#           -v "$PWD/cdcd.yaml:/etc/cdcd/cdcd.yaml:ro" \
#           -e CDCD_SOURCE__DSN='host=db dbname=app user=cdcd password=...' \
#           cdcd:0.1.0
#         (the default command is `cdcd run --config /etc/cdcd/cdcd.yaml`; any cdcd subcommand works:
#          docker run --rm cdcd:0.1.0 --help)
# Spill directory: /var/lib/cdcd/spill (a volume; writable by uid 10001). Metrics, /healthz, /readyz: 9187.
# Stop: SIGTERM (docker stop -t 60): cdcd flushes Kafka, confirms the flushed LSN and exits 0.
# Kubernetes manifests: deploy/kubernetes. Checked (statically) by tests/unit/test_deploy.py.

ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: wheels of cdcd (with its compiled row stage, cdcd._native) and of every runtime dependency ---
# cdcd's wheel here has a plain linux tag (built against this base image's glibc): right for an image that builds
# and installs it on the same base; the portable manylinux wheel, to publish, is `make wheel`'s (docs/development.md: Packaging).
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup PATH=/usr/local/cargo/bin:$PATH
# cargo and rustc from the official Rust image (Debian's are too old for PyO3); gcc links the module.
COPY --from=rust:1-slim /usr/local/cargo /usr/local/cargo
COPY --from=rust:1-slim /usr/local/rustup /usr/local/rustup
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY native ./native
COPY cdcd ./cdcd
RUN pip wheel --wheel-dir /wheels .

# --- runtime: the wheels installed, nothing else ---
FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    CDCD_LOG__FORMAT=json
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels cdcd \
 && groupadd --system --gid 10001 cdcd \
 && useradd --system --uid 10001 --gid cdcd --home-dir /var/lib/cdcd --shell /usr/sbin/nologin cdcd \
 && install -d -o cdcd -g cdcd -m 0750 /var/lib/cdcd /var/lib/cdcd/spill \
 && install -d -m 0755 /etc/cdcd
COPY config/cdcd.example.yaml /etc/cdcd/cdcd.yaml
USER 10001:10001
WORKDIR /var/lib/cdcd
VOLUME ["/var/lib/cdcd"]
EXPOSE 9187
STOPSIGNAL SIGTERM
# Assumes metrics.listen on port 9187 (the default); drop or override it if you move the port.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:9187/healthz', timeout=4).status != 200)"]
ENTRYPOINT ["cdcd"]
CMD ["run", "--config", "/etc/cdcd/cdcd.yaml"]

# syntax=docker/dockerfile:1
# dracpu node daemon image.
#
#   docker build -t ghcr.io/dracpu/dracpu:v0.1.0 .
#
# Stage 1 builds dracpu's wheel and fetches the wheels of its dependencies, exactly the
# versions and files (sha256) locked in requirements/image.txt; stage 2 installs them from a
# build-time bind mount, so neither the wheels, pip's cache nor any build tool ends up in a
# layer of the final image. Needs BuildKit (the default builder since Docker 23).
#
# The lock holds the daemon's dependencies only: the simulated node is its own distribution
# (sim/, with grpcio and cel-python) and is not in the image. Regenerate it after a dependency change in
# pyproject.toml (docs/image.md):
#   pip-compile --generate-hashes --strip-extras --output-file requirements/image.txt pyproject.toml
#
# Pin the base by digest for a reproducible build:
#   --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the build reads (.dockerignore keeps everything else out of the context).
COPY pyproject.toml README.md ./
COPY requirements/image.txt ./requirements/
COPY src ./src
# Dependencies come as prebuilt manylinux wheels whose hashes must match the lock;
# `--only-binary :all:` makes a missing one fail the build here instead of compiling it.
# dracpu itself is pure Python, built without its dependencies (the lock has them). The
# lock goes next to the wheels, for the final stage.
RUN python -m pip wheel --wheel-dir /wheels --only-binary :all: --require-hashes \
      -r requirements/image.txt \
 && python -m pip wheel --wheel-dir /wheels --no-deps . \
 && cp requirements/image.txt /wheels/requirements.txt

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dracpu" \
      org.opencontainers.image.description="Kubernetes DRA driver for exclusive, topology-aligned CPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
# Offline install of exactly the wheels built above; then pip and setuptools go too, as
# nothing at run time imports them.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links=/wheels --require-hashes \
      -r /wheels/requirements.txt \
 && python -m pip install --no-cache-dir --no-index --find-links=/wheels --no-deps dracpu \
 && python -m pip uninstall --yes pip setuptools wheel \
 && ln -s /usr/local/bin/dracpu /dracpu \
 && ln -s /usr/local/bin/dracpu-gatherinfo /dracpu-gatherinfo
# Set after the install so pip still precompiled the modules (the root filesystem is
# read-only in the pod, so nothing could be written later anyway).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Root, deliberately: the cgroupfs fallback writer rewrites cpuset.cpus of other
# containers. Those files belong to uid 0 (mode 0644), so uid 0 can write them with every
# capability dropped (see deploy/base/daemonset.yaml); a non-root user would need
# CAP_DAC_OVERRIDE, a wider grant. The same holds for the root-owned NRI socket and the
# kubelet's plugin directories.
USER 0:0
EXPOSE 8080
# `dracpu run` is the daemon; `dracpu-gatherinfo` (and /dracpu, /dracpu-gatherinfo, the
# upstream image's paths) are there for support bundles and old manifests.
ENTRYPOINT ["dracpu"]
CMD ["run"]

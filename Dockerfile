# syntax=docker/dockerfile:1
# dracpu node daemon image.
#
#   docker build -t ghcr.io/dracpu/dracpu:v0.1.0 .
#
# Stage 1 builds dracpu's wheel and the wheels of its dependencies; stage 2 installs them
# from a build-time bind mount, so neither the wheels, pip's cache nor any build tool ends
# up in a layer of the final image. Needs BuildKit (the default builder since Docker 23).
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the build reads (.dockerignore keeps everything else out of the context).
COPY pyproject.toml README.md ./
COPY src ./src
# Dependencies come as prebuilt manylinux wheels; `--only-binary :all:` makes a missing
# one fail the build here instead of compiling it. dracpu itself is pure Python.
RUN python -m pip wheel --wheel-dir /wheels --only-binary :all: --no-binary dracpu .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dracpu" \
      org.opencontainers.image.description="Kubernetes DRA driver for exclusive, topology-aligned CPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
# Offline install of exactly the wheels built above; then pip and setuptools go too, as
# nothing at run time imports them.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links=/wheels dracpu \
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

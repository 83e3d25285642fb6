# silofl container images: one image per torch variant, three roles (docs/images.md).
#
#   docker build --target cpu  -t silofl:cpu  .    # torch CPU wheels (the default target)
#   docker build --target cuda -t silofl:cuda .    # torch CUDA wheels from PyPI (run with --gpus)
#
# Roles (docker/entrypoint.sh; TLS unless --insecure is given explicitly):
#   docker run --rm silofl:cpu [simulation ARGS]             python -m app.launch (default CMD)
#   docker run -p 8000:8000 -v superlink-state:/state -v $PWD/certs:/certs:ro silofl:cpu superlink
#   docker run -v silo0-state:/state -v $PWD/certs/ca.crt:/certs/ca.crt:ro silofl:cpu supernode \
#       --superlink SUPERLINK_HOST:8000 --node-config "partition-id=0 num-partitions=2 state-dir='/state'"
#
# Ports (Flower 1.42): the SuperLink serves its Fleet API (SuperNodes connect), Control API
# (`flwr run`, `flwr ls`) and Runtime API (its own SuperExec) over HTTP(S) on ONE port, --port,
# default 8000, with GET /health. The SuperNode opens no port to the outside: it connects out to
# the SuperLink and serves its runtime API to its own SuperExec on 127.0.0.1:9094. The 9091-9093
# gRPC ports of older Flower releases are gone (9092/9093 only behind internal FLWR_INTERNAL_GRPC_*).
#
# The base is pinned by version tag. Pin the digest too where a registry is reachable:
#   docker buildx imagetools inspect python:3.11.17-slim-bookworm   # -> Digest: sha256:...
#   docker build --build-arg PYTHON_IMAGE=python:3.11.17-slim-bookworm@sha256:... .
ARG PYTHON_IMAGE=python:3.11.17-slim-bookworm
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1

# ---------------------------------------------------------------------------------------------
# base: OS packages, the non-root user and the state directory, shared by builder and runtime.
FROM ${PYTHON_IMAGE} AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# dataset-fashion-mnist: the Fashion-MNIST files app/data/sources.py reads from
# /usr/share/datasets/fashion-mnist; tini: PID 1 (signal forwarding, reaps the ServerApp /
# ClientApp subprocesses Flower's SuperExec starts).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        dataset-fashion-mnist=0.0~git20200523.55506a9-1 \
        tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 silofl \
    && useradd --uid 10001 --gid 10001 --no-log-init --create-home --home-dir /home/silofl \
        --shell /usr/sbin/nologin silofl \
    && install -d -o 10001 -g 10001 -m 0750 /state \
    && install -d -o 10001 -g 10001 -m 0750 /run/silofl \
    && install -d -m 0755 /certs

# ---------------------------------------------------------------------------------------------
# builder: a virtual environment at the path it keeps in the runtime stage (/silofl/.venv).
FROM base AS builder
ARG PIP_VERSION=26.3
WORKDIR /silofl
RUN python3 -m venv /silofl/.venv \
    && /silofl/.venv/bin/pip install --no-cache-dir "pip==${PIP_VERSION}"
ENV PATH=/silofl/.venv/bin:$PATH
COPY pyproject.toml ./
COPY scripts/print_requirements.py scripts/
COPY docker/constraints.txt docker/

# torch and torchvision alone from the variant's index (--no-deps); everything else, torch's own
# dependencies included, from PyPI within docker/constraints.txt; then the whole set is checked.
# The project itself is not pip-installed: a .pth puts /silofl on sys.path, as the editable
# install of `make setup` does (app.launch reads pyproject.toml and stages the app from there).
FROM builder AS venv-cpu
ARG TORCH_VERSION
ARG TORCHVISION_VERSION
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --no-deps --index-url "${TORCH_INDEX_URL}" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && python scripts/print_requirements.py > /tmp/requirements.txt \
    && pip install --no-cache-dir -c docker/constraints.txt -r /tmp/requirements.txt \
    && pip check \
    && echo /silofl > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/silofl.pth"

FROM builder AS venv-cuda
ARG TORCH_VERSION
ARG TORCHVISION_VERSION
ARG TORCH_INDEX_URL=https://pypi.org/simple
RUN pip install --no-cache-dir --no-deps --index-url "${TORCH_INDEX_URL}" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && python scripts/print_requirements.py > /tmp/requirements.txt \
    && pip install --no-cache-dir -c docker/constraints.txt -r /tmp/requirements.txt \
    && pip check \
    && echo /silofl > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/silofl.pth"

# ---------------------------------------------------------------------------------------------
# runtime: the venv and the sources, owned by root and read-only to the service user.
FROM base AS runtime
WORKDIR /silofl
ENV PATH=/silofl/.venv/bin:$PATH \
    FLWR_HOME=/state/flwr \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    OMP_NUM_THREADS=1 \
    SILOFL_CERTS_DIR=/certs \
    SILOFL_SUPERLINK_DB=/state/superlink.db
# The SuperLink's single port (Fleet, Control and Runtime APIs, /health). A SuperNode needs none.
EXPOSE 8000
VOLUME ["/state"]
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["/silofl/.venv/bin/python", "/silofl/docker/healthcheck.py"]
ENTRYPOINT ["/usr/bin/tini", "--", "/silofl/docker/entrypoint.sh"]
CMD ["simulation"]

FROM runtime AS cuda
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=venv-cuda /silofl/.venv /silofl/.venv
COPY . /silofl/
# outputs/ (the simulation's results, relative to the checkout) lands in the /state volume.
RUN python -m compileall -q app strategies clients scripts docker \
    && ln -s /state/outputs /silofl/outputs
USER 10001:10001

# Last stage: the default target.
FROM runtime AS cpu
COPY --from=venv-cpu /silofl/.venv /silofl/.venv
COPY . /silofl/
RUN python -m compileall -q app strategies clients scripts docker \
    && ln -s /state/outputs /silofl/outputs
USER 10001:10001

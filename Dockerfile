# silofl image: runs a simulation, a SuperLink or a SuperNode (first version; deployment with TLS
# gets its own issue). Build: docker build -t silofl .
#   simulation:  docker run --rm silofl            (the embedded default, python -m app.launch)
#   SuperLink:   docker run -p 9091-9093:9091-9093 silofl flower-superlink --insecure
#   SuperNode:   docker run silofl flower-supernode --insecure --superlink HOST:9092 \
#                  --node-config "partition-id=0 num-partitions=2 state-dir='/state'"
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends make dataset-fashion-mnist \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /silofl
COPY pyproject.toml Makefile ./
COPY scripts/print_requirements.py scripts/
RUN python -m venv .venv && .venv/bin/pip install -q --upgrade pip \
    && .venv/bin/pip install -q torch==2.14.1 torchvision==0.29.1 \
    && .venv/bin/python scripts/print_requirements.py > /tmp/req.txt \
    && .venv/bin/pip install -q -r /tmp/req.txt
COPY . .
RUN .venv/bin/pip install -q --no-deps -e .
ENV PATH=/silofl/.venv/bin:$PATH FLWR_HOME=/silofl/.flwr FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 OMP_NUM_THREADS=1
VOLUME ["/state"]
CMD ["python", "-m", "app.launch"]

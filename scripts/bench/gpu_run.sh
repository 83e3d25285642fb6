#!/usr/bin/env bash
# The federation on one GPU (flwr run, simulation, device=cuda, fractional client-resources-num-gpus),
# LeNet-5 and ResNet-18 on CIFAR-10-shaped synthetic images, and CPU-vs-GPU agreement: see
# scripts/bench/gpu_run.py and docs/results.md ("The federation on one GPU").
#
#   scripts/bench/gpu_run.sh                        # on a CUDA machine
#   scripts/bench/gpu_run.sh --device cpu --small   # the same path on the CPU, small sizes
#   SILOFL_GPU_RUN_DEVICE=cpu SILOFL_GPU_RUN_SMALL=1 scripts/bench/gpu_run.sh   # the same, by environment
#
# Every other option goes to gpu_run.py (--models, --configs, --steps, --rounds, --num-gpus, --outdir).
# The whole script is stopped after SILOFL_GPU_RUN_TIMEOUT seconds (default 540: a 15-minute device
# lease with room for one rerun); it then still stops the SuperLink it started.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    if [[ -x .venv/bin/python ]]; then PY="$PWD/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
export FLWR_HOME="${FLWR_HOME:-$PWD/.flwr}"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 PYTHONUNBUFFERED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

args=()
[[ -n "${SILOFL_GPU_RUN_DEVICE:-}" ]] && args+=(--device "$SILOFL_GPU_RUN_DEVICE")
[[ "${SILOFL_GPU_RUN_SMALL:-0}" == "1" ]] && args+=(--small)

exec timeout --signal=TERM --kill-after=30 "${SILOFL_GPU_RUN_TIMEOUT:-540}" \
    "$PY" -m scripts.bench.gpu_run "${args[@]}" "$@"

#!/usr/bin/env bash
# Deployment smoke run on one machine: a SuperLink (deployment mode, insecure) and two SuperNodes
# with their own node config (state dir, privacy policy), then the embedded default through the
# launcher with `--superlink deploy`. TLS and multi-machine launchers belong to the deployment issue.
#
#   bash scripts/deploy/local_smoke.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-5}
WORK=$(mktemp -d)
export PATH="$PWD/.venv/bin:$PATH" FLWR_HOME="$WORK/.flwr" FLWR_TELEMETRY_ENABLED=0 \
       FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 OMP_NUM_THREADS=1
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "deploy"
[superlink.deploy]
address = "127.0.0.1:8000"
insecure = true
TOML
cleanup() { kill $(jobs -p) 2>/dev/null || true; }
trap cleanup EXIT
flower-superlink --insecure >"$WORK/superlink.log" 2>&1 &
sleep 4
for i in 0 1; do
  flower-supernode --insecure --superlink 127.0.0.1:8000 --port $((9094 + i)) \
    --node-config "partition-id=$i num-partitions=2 state-dir='$WORK/state$i' noise-seed='os' epsilon-cap=3.0" \
    >"$WORK/supernode$i.log" 2>&1 &
done
sleep 5
python -m app.launch --superlink deploy --run-config "num-rounds=$ROUNDS"
echo "ledgers:"; ls "$WORK"/state*/

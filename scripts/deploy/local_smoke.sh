#!/usr/bin/env bash
# Deployment smoke run on one machine, through the same launchers a real federation uses:
# a CA and SuperLink certificate (make_certs.py), two SuperNode keys (make_node_key.py), a SuperLink
# with TLS, node authentication and a database (superlink.sh), the two keys registered
# (register_node.sh), two SuperNodes with their own node config (supernode.sh: state dir,
# noise-seed='os', epsilon-cap=3.0), then the embedded default through the launcher
# (python -m app.launch --superlink smoke) and the two ledgers.
#
#   bash scripts/deploy/local_smoke.sh [ROUNDS] [--insecure] [--own-data] [--executor]
#
# --executor: each SuperNode runs its ClientApp tasks in one long-lived silofl executor
# (supernode.sh --executor) instead of a flwr-clientapp process per message; on a loaded machine a
# fresh process may not start within Flower's 60 s task-token lifetime.
# --own-data (make deploy-smoke-own-data; docs/your-data.md): three SuperNodes, each reading its own
# CSV (node config data-file; written here from scikit-learn's WBCD by own_data_files.py, split
# three ways), the run checks them against data.schema, and the server reads its own trust file
# (Grad-BANT) and test file; the run must reach OWN_DATA_ACCURACY (default 0.85) on the server's
# test file, else the script exits 1. ROUNDS defaults to 5 (20 with --own-data). Everything lives in a fresh temporary directory (printed; kept for the
# logs): free ports are picked at start, each process gets its own FLWR_HOME, and only the
# processes started here are stopped at the end. --insecure runs the same federation without TLS
# and node authentication (loopback only). Exit code: the launcher's (0: run completed).
# shellcheck disable=SC2174,SC2317  # mkdir -m applies to the leaf on purpose; trap handlers
set -euo pipefail
# shellcheck source=_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

ROUNDS="" INSECURE=0 OWN=0 SN_MODE=()
for a in "$@"; do
  case "$a" in
    --insecure) INSECURE=1 ;;
    --own-data) OWN=1 ;;
    --executor) SN_MODE=(--executor) ;;
    -h|--help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) [[ "$a" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer, not $a"; ROUNDS=$a ;;
  esac
done

NODES=2
if [[ $OWN == 1 ]]; then NODES=3; ROUNDS=${ROUNDS:-20}; fi
ROUNDS=${ROUNDS:-5}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/silofl-smoke.XXXXXX")
CONN=smoke
note "work dir $WORK"
mapfile -t PORTS < <("$PYTHON" "$UTIL" free-ports $((NODES + 1)))
SL_PORT=${PORTS[0]}
note "SuperLink port $SL_PORT, SuperNode runtime ports ${PORTS[*]:1}"
RUN_CONFIG="num-rounds=$ROUNDS outputs-dir='$WORK/outputs'"
NODE_EXTRA=()
if [[ $OWN == 1 ]]; then  # each silo's own CSV, the server's own trust and test files
  (cd "$REPO_ROOT" && "$PYTHON" -m scripts.deploy.own_data_files "$WORK/data" --silos "$NODES") >&2
  for ((i = 0; i < NODES; i++)); do
    NODE_EXTRA+=(" data-file='$WORK/data/silo$i/records.csv' data-schema='$WORK/data/schema.json'")
  done
  RUN_CONFIG+=" num-silos=$NODES silos-per-round=$NODES data.schema='$WORK/data/schema.json'"
  RUN_CONFIG+=" algorithm='robust' aggregator='gradbant' gradbant.noise-aware=true gradbant.smoothness=0.1"
  RUN_CONFIG+=" gradbant.silo-records='80,140'"
  RUN_CONFIG+=" server.trust-file='$WORK/data/server/trust.csv' server.test-file='$WORK/data/server/test.csv'"
fi

PIDS=()
cleanup() {
  local p i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    p=${PIDS[i]}
    if kill -0 "$p" 2>/dev/null; then kill -TERM "$p" 2>/dev/null || true; fi
  done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 75); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$p" 2>/dev/null || true
  done
  note "stopped pids ${PIDS[*]:-none}; logs in $WORK"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

if [[ $INSECURE == 1 ]]; then
  insecure_warning
  SL_TLS=(--insecure) SN_TLS=(--insecure) REG_TLS=(--insecure)
else
  (cd "$REPO_ROOT" && "$PYTHON" -m scripts.deploy.make_certs --out "$WORK/certs" --host 127.0.0.1)
  for ((i = 0; i < NODES; i++)); do
    (cd "$REPO_ROOT" && "$PYTHON" -m scripts.deploy.make_node_key --out "$WORK/keys" --name "silo$i" >/dev/null)
  done
  SL_TLS=(--certs "$WORK/certs") REG_TLS=(--root-cert "$WORK/certs/ca.crt")
  PUBS=()
  for ((i = 0; i < NODES; i++)); do PUBS+=("$WORK/keys/silo$i.pub"); done
fi

FLWR_HOME="$WORK/superlink/flwr-home" "$DEPLOY_DIR/superlink.sh" "${SL_TLS[@]}" \
  --database "$WORK/superlink/superlink.db" --host 127.0.0.1 --port "$SL_PORT" >"$WORK/superlink.log" 2>&1 &
PIDS+=($!)
if [[ $INSECURE == 1 ]]; then
  "$PYTHON" "$UTIL" wait "127.0.0.1:$SL_PORT" --timeout 120 --pid "${PIDS[0]}" || { tail -20 "$WORK/superlink.log"; exit 1; }
else
  "$PYTHON" "$UTIL" wait "127.0.0.1:$SL_PORT" --ca "$WORK/certs/ca.crt" --timeout 120 --pid "${PIDS[0]}" \
    || { tail -20 "$WORK/superlink.log"; exit 1; }
fi

# The researcher's side: its own FLWR_HOME with the [superlink.smoke] connection.
export FLWR_HOME="$WORK/flwr-home"
if [[ $INSECURE == 1 ]]; then
  "$PYTHON" "$UTIL" connection --name "$CONN" --address "127.0.0.1:$SL_PORT" --insecure >/dev/null
else
  "$DEPLOY_DIR/register_node.sh" --superlink "$CONN" --address "127.0.0.1:$SL_PORT" "${REG_TLS[@]}" \
    --record "$WORK/nodes.txt" "${PUBS[@]}" 2>>"$WORK/register.log"
fi

for ((i = 0; i < NODES; i++)); do
  [[ $INSECURE == 1 ]] || SN_TLS=(--root-cert "$WORK/certs/ca.crt" --auth-key "$WORK/keys/silo$i.key")
  FLWR_HOME="$WORK/state$i/flwr-home" "$DEPLOY_DIR/supernode.sh" --superlink "127.0.0.1:$SL_PORT" "${SN_TLS[@]}" \
    --state-dir "$WORK/state$i" "${SN_MODE[@]}" --runtime-port "${PORTS[$((i + 1))]}" \
    --node-config "partition-id=$i num-partitions=$NODES noise-seed='os' epsilon-cap=3.0${NODE_EXTRA[i]:-}" \
    >"$WORK/supernode$i.log" 2>&1 &
  PIDS+=($!)
done
# Every SuperNode connected: each has logged its node id.
for ((i = 0; i < NODES; i++)); do
  for _ in $(seq 600); do
    grep -q "SuperNode ID:" "$WORK/supernode$i.log" 2>/dev/null && break
    kill -0 "${PIDS[$((i + 1))]}" 2>/dev/null || { tail -20 "$WORK/supernode$i.log"; die "SuperNode $i exited"; }
    sleep 0.2
  done
  grep -q "SuperNode ID:" "$WORK/supernode$i.log" || { tail -20 "$WORK/supernode$i.log"; die "SuperNode $i did not connect within 120 s"; }
  note "SuperNode $i: $(grep -o 'SuperNode ID: [0-9]*' "$WORK/supernode$i.log" | head -1)"
done

set +e
show "$PYTHON" -m app.launch --superlink "$CONN" --run-config "$RUN_CONFIG"
(cd "$REPO_ROOT" && "$PYTHON" -m app.launch --superlink "$CONN" --run-config "$RUN_CONFIG")
RC=$?
set -e
if [[ $OWN == 1 ]] && compgen -G "$WORK/outputs/*/summary.json" >/dev/null; then  # the stated accuracy
  "$PYTHON" - "$WORK/outputs" "${OWN_DATA_ACCURACY:-0.85}" <<'PY' || { [[ $RC != 0 ]] || RC=1; }
import json, sys
from pathlib import Path
summary = json.loads(next(Path(sys.argv[1]).glob("*/summary.json")).read_text())
acc, need = summary.get("server_test_accuracy"), float(sys.argv[2])
print(f"own-data smoke: accuracy {acc:.4f} on the server's {summary.get('server_test_records')} test records "
      f"(stated: >= {need}); silos' mean test error {summary.get('test_error')}")
for d in summary["silos"]:
    print(f"  silo {d.get('silo')}: n {d.get('n')}, batch {d.get('batch')}, delta {d.get('delta')}, "
          f"eps spent {d.get('eps_spent')} of {d.get('eps_budget')}" + (f", error {d['error']}" if "error" in d else ""))
sys.exit(0 if acc is not None and acc >= need else 1)
PY
fi
echo "ledgers:"
for ((i = 0; i < NODES; i++)); do
  for f in "$WORK/state$i"/ledger-*.json; do
    [[ -f "$f" ]] || { echo "  state$i: no ledger"; continue; }
    PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$f" <<'PY'
import sys
from app.privacy.ledger import read_ledger
doc = read_ledger(sys.argv[1])
rel = doc["releases"]
print(f"  {sys.argv[1]}: epsilon budget {doc.get('epsilon_budget')}, delta {doc.get('delta')}, "
      f"{len(rel)} release(s) in rounds {sorted({r.get('round') for r in rel})}")
PY
  done
done
exit $RC

#!/usr/bin/env bash
# Register SuperNode public keys with a SuperLink that runs with node authentication
# (`flwr supernode register` through the SuperLink's Control API), or list / unregister nodes.
#
#   scripts/deploy/register_node.sh --superlink NAME [--name NODE_NAME] KEY.pub [KEY.pub ...]
#   scripts/deploy/register_node.sh --superlink NAME --address HOST:PORT --root-cert ca.crt KEY.pub
#   scripts/deploy/register_node.sh --superlink NAME --list
#   scripts/deploy/register_node.sh --superlink NAME --unregister NODE_ID
#
#   --superlink NAME   a connection in $FLWR_HOME/config.toml ([superlink.NAME]: address, root-certificates)
#   --address HOST:PORT --root-cert F   first write (or replace) that connection, then use it
#   --insecure         with --address: a connection without TLS (loopback tests only)
#   --name NODE_NAME   a name for the node (one key only; default: the key file's stem)
#   --record FILE      append "<node id> <key file>" for every node registered
#
# Each KEY.pub is an OpenSSH ECDSA public key line (make_node_key.py). Exit code: 0 when every
# key was registered, 1 when one was refused (e.g. already registered), 2 for bad arguments.
# shellcheck disable=SC2174,SC2317  # mkdir -m applies to the leaf on purpose; trap handlers
set -euo pipefail
# shellcheck source=_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

CONN="" ADDRESS="" ROOT_CERT="" INSECURE=0 NAME="" RECORD="" ACTION=register NODE_ID=""
KEYS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --superlink) need_value "$1" $#; CONN=$2; shift 2 ;;
    --address) need_value "$1" $#; ADDRESS=$2; shift 2 ;;
    --root-cert|--root-certificates|--ca-cert) need_value "$1" $#; ROOT_CERT=$2; shift 2 ;;
    --insecure) INSECURE=1; shift ;;
    --name) need_value "$1" $#; NAME=$2; shift 2 ;;
    --record) need_value "$1" $#; RECORD=$2; shift 2 ;;
    --list) ACTION=list; shift ;;
    --unregister) need_value "$1" $#; ACTION=unregister; NODE_ID=$2; shift 2 ;;
    -h|--help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown argument $1 (see --help)" ;;
    *) KEYS+=("$1"); shift ;;
  esac
done

[[ -n "$CONN" ]] || die "--superlink NAME (a connection in \$FLWR_HOME/config.toml) is required"
[[ "$CONN" =~ ^[A-Za-z0-9_-]+$ ]] || die "--superlink $CONN: a connection name is letters, digits, '_' and '-'"
[[ -n "${FLWR_HOME:-}" ]] || note "note: FLWR_HOME is not set: using Flower's default ~/.flwr"
if [[ -n "$ADDRESS" ]]; then
  if [[ $INSECURE == 1 ]]; then
    [[ -z "$ROOT_CERT" ]] || die "--insecure and --root-cert exclude each other"
    insecure_warning
    CONN_ARGS=(--insecure)
  else
    need_file --root-cert "$ROOT_CERT"
    CONN_ARGS=(--root-certificates "$(abspath "$ROOT_CERT")")
  fi
  show "$PYTHON" "$UTIL" connection --name "$CONN" --address "$ADDRESS" "${CONN_ARGS[@]}"
  "$PYTHON" "$UTIL" connection --name "$CONN" --address "$ADDRESS" "${CONN_ARGS[@]}" >&2 || exit 2
elif [[ -n "$ROOT_CERT" || $INSECURE == 1 ]]; then
  die "--root-cert and --insecure go with --address"
fi

case $ACTION in
  list)
    [[ ${#KEYS[@]} == 0 ]] || die "--list takes no key files"
    show flwr supernode list "$CONN"
    exec flwr supernode list "$CONN" ;;
  unregister)
    [[ ${#KEYS[@]} == 0 ]] || die "--unregister takes no key files"
    [[ "$NODE_ID" =~ ^[0-9]+$ ]] || die "--unregister $NODE_ID is not a node id"
    show flwr supernode unregister "$NODE_ID" "$CONN"
    exec flwr supernode unregister "$NODE_ID" "$CONN" ;;
esac

[[ ${#KEYS[@]} -gt 0 ]] || die "give at least one public key file (KEY.pub)"
[[ -z "$NAME" || ${#KEYS[@]} == 1 ]] || die "--name goes with a single key file"
for k in "${KEYS[@]}"; do
  need_file key "$k"
  head -c 20 "$k" | grep -q '^ecdsa-sha2-nistp' || die "$k is not an OpenSSH ECDSA public key (ecdsa-sha2-nistp...); make_node_key.py writes one"
done

FAILED=0
for k in "${KEYS[@]}"; do
  n=${NAME:-$(basename "$k" .pub)}
  CMD=(flwr supernode register "$(abspath "$k")" "$CONN" --name "$n" --format json)
  show "${CMD[@]}"
  set +e
  OUT=$("${CMD[@]}" 2>&1)
  RC=$?
  set -e
  ID=$(printf '%s\n' "$OUT" | "$PYTHON" -c '
import json, sys
text = sys.stdin.read()
start = text.find("{")
try:
    doc = json.loads(text[start:]) if start >= 0 else {}
except ValueError:
    doc = {}
print(doc.get("node-id", "") if doc.get("success") else "")')
  if [[ $RC == 0 && -n "$ID" ]]; then
    echo "registered $k as node $ID (name $n)"
    [[ -z "$RECORD" ]] || echo "$ID $(abspath "$k")" >> "$RECORD"
  else
    echo "$PROG: error: registering $k failed (flwr exit code $RC): $(printf '%s' "$OUT" | tr '\n' ' ' | cut -c1-400)" >&2
    FAILED=1
  fi
done
exit $FAILED

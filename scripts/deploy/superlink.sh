#!/usr/bin/env bash
# Start the federation's SuperLink: TLS, SuperNode authentication and a durable database by default.
#
#   scripts/deploy/superlink.sh --certs DIR [options] [-- extra flower-superlink flags]
#
#   --certs DIR          DIR/ca.crt, DIR/server.pem, DIR/server.key (as make_certs.py writes them)
#   --ca-cert F --cert F --key F   the same three files named one by one (override --certs)
#   --database PATH      SQLite state (runs, registered SuperNodes); default ./superlink-state/superlink.db
#   --in-memory          keep state in memory only (lost on restart; tests)
#   --host HOST          address to listen on (default 0.0.0.0: every interface)
#   --port PORT          the one port for the Fleet, Control and Runtime APIs (default 8000)
#   --no-node-auth       accept any SuperNode (Flower's automatic authentication only); not recommended
#   --pid-file F         where the flower-superlink pid goes (default: next to the database)
#   --insecure           no TLS and no node authentication: loopback tests only (loud warning)
#
# Runs in the foreground until stopped (SIGTERM / Ctrl-C), then stops flower-superlink.
# Exit code: flower-superlink's; 2 for bad arguments.
# shellcheck disable=SC2174,SC2317  # mkdir -m applies to the leaf on purpose; trap handlers
set -euo pipefail
# shellcheck source=_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

CERTS="" CA="" CERT="" KEY="" DB="" IN_MEMORY=0 HOST=0.0.0.0 PORT=8000 NODE_AUTH=1 INSECURE=0 PID_FILE=""
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --certs) need_value "$1" $#; CERTS=$2; shift 2 ;;
    --ca-cert) need_value "$1" $#; CA=$2; shift 2 ;;
    --cert) need_value "$1" $#; CERT=$2; shift 2 ;;
    --key) need_value "$1" $#; KEY=$2; shift 2 ;;
    --database) need_value "$1" $#; DB=$2; shift 2 ;;
    --in-memory) IN_MEMORY=1; shift ;;
    --host) need_value "$1" $#; HOST=$2; shift 2 ;;
    --port) need_value "$1" $#; PORT=$2; shift 2 ;;
    --no-node-auth) NODE_AUTH=0; shift ;;
    --pid-file) need_value "$1" $#; PID_FILE=$2; shift 2 ;;
    --insecure) INSECURE=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

need_port --port "$PORT"
[[ -n "$HOST" && "$HOST" != *" "* ]] || die "--host must be an address or name"
[[ $IN_MEMORY == 1 && -n "$DB" ]] && die "--database and --in-memory exclude each other"

CMD=(flower-superlink --host "$HOST" --port "$PORT")
if [[ $INSECURE == 1 ]]; then
  [[ -n "$CERTS$CA$CERT$KEY" ]] && die "--insecure and certificates exclude each other"
  insecure_warning
  CMD+=(--insecure)
else
  if [[ -n "$CERTS" ]]; then
    [[ -d "$CERTS" ]] || die "--certs $CERTS: no such directory"
    CA=${CA:-$CERTS/ca.crt} CERT=${CERT:-$CERTS/server.pem} KEY=${KEY:-$CERTS/server.key}
  fi
  [[ -n "$CA$CERT$KEY" ]] || die "no TLS certificates: give --certs DIR (make them with make_certs.py), or --insecure for a loopback test"
  need_file --ca-cert "$CA"; need_file --cert "$CERT"; need_file --key "$KEY"
  warn_key_mode "$KEY"
  CA=$(abspath "$CA") CERT=$(abspath "$CERT") KEY=$(abspath "$KEY")
  "$PYTHON" "$UTIL" check-cert --ca "$CA" --cert "$CERT" --key "$KEY" --host "$HOST" >&2 || exit 2
  CMD+=(--ssl-ca-certfile "$CA" --ssl-certfile "$CERT" --ssl-keyfile "$KEY")
  if [[ $NODE_AUTH == 1 ]]; then
    CMD+=(--enable-supernode-auth)
  else
    note "note: --no-node-auth: any SuperNode that trusts the CA can join this federation"
  fi
fi

if [[ $IN_MEMORY == 1 ]]; then
  if [[ -n "$PID_FILE" ]]; then STATE_DIR=$(dirname "$(abspath "$PID_FILE")"); else STATE_DIR=$(abspath superlink-state); fi
  mkdir -p -m 700 "$STATE_DIR"
  note "note: --in-memory: runs and registered SuperNodes are lost when the SuperLink stops"
else
  DB=$(abspath "${DB:-superlink-state/superlink.db}")
  STATE_DIR=$(dirname "$DB")
  mkdir -p -m 700 "$STATE_DIR"
  CMD+=(--database "$DB")
fi
PID_FILE=$(abspath "${PID_FILE:-$STATE_DIR/superlink.pid}")
mkdir -p "$(dirname "$PID_FILE")"
old=$(cat "$PID_FILE" 2>/dev/null || true)
if running_as "$old" flower-superlink; then
  die "$PID_FILE: pid $old is still running (a SuperLink with this state is up); stop it first"
fi
export FLWR_HOME=${FLWR_HOME:-$STATE_DIR/flwr-home}
mkdir -p -m 700 "$FLWR_HOME"
CMD+=("${EXTRA[@]}")

note "FLWR_HOME=$FLWR_HOME"
show "${CMD[@]}"
CHILD=""
stop() {
  if [[ -n "$CHILD" ]] && kill -0 "$CHILD" 2>/dev/null; then
    kill -TERM "$CHILD" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$CHILD" 2>/dev/null || true
  fi
  rm -f "$PID_FILE"
}
trap stop EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
"${CMD[@]}" &
CHILD=$!
echo "$CHILD" > "$PID_FILE"
note "flower-superlink pid $CHILD (in $PID_FILE); listening on $HOST:$PORT"
set +e
wait "$CHILD"
RC=$?
CHILD=""
exit $RC

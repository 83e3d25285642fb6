#!/usr/bin/env bash
# Start one silo's SuperNode (or the shuffler's): TLS and SuperNode authentication by default.
#
#   scripts/deploy/supernode.sh --superlink HOST:PORT --root-cert ca.crt --auth-key silo0.key \
#       --state-dir /srv/silofl/state --node-config "partition-id=0 num-partitions=2 epsilon-cap=3.0"
#
#   --superlink HOST:PORT  the SuperLink (HOST as named in its certificate; default port 8000)
#   --root-cert F          the federation CA certificate (ca.crt) that signed the SuperLink's certificate
#   --auth-key F           this node's private key (make_node_key.py; its .pub registered on the SuperLink)
#   --no-node-auth         connect without a registered key (only to a SuperLink run with --no-node-auth)
#   --state-dir DIR        this node's persistent state (privacy ledger, keys); becomes state-dir in the
#                          node config (required unless the node config sets state-dir)
#   --node-config "k=v .." passed through to flower-supernode (partition-id, num-partitions, caps, ...)
#   --role shuffler        this node is the shuffle-DP shuffler (adds role="shuffler"; no partition-id)
#   --runtime-port PORT    this node's local Runtime API port (default 9094; one per SuperNode on a host)
#   --no-silo-service      do not start the long-lived silo service (app.runtime.silo_service)
#   --service-max-frame-bytes B  the silo service's largest request (e.g. 256MiB; default: derived
#                          from the node config's max-model-params: 258 MB for a silo, 1 GiB for
#                          the shuffler)
#   --service-memory-budget B    bytes of requests the silo service reads or holds at once, over all
#                          connections (default: 2 x its frame limit)
#   --service-max-connections N  requests the silo service reads or handles at once (default 8)
#   --executor             run every ClientApp task in one long-lived silofl executor (app.runtime.executor)
#                          instead of a flwr-clientapp process per message (flower-supernode
#                          --isolation process); no silo service is needed then
#   --max-wait-time S      give up connecting to the SuperLink after S seconds (default: keep trying)
#   --pid-dir DIR          where supernode.pid and silo-service.pid go (default: the state dir)
#   --insecure             no TLS, no authentication: loopback tests only (loud warning)
#   -- ...                 further flags for flower-supernode
#
# The silo service, when app.runtime.silo_service is importable, is started first (socket
# <state-dir>/silo-service.sock, silo-service='<socket>' added to the node config) and stopped
# when this script exits, as are flower-supernode's process group and the log's tee. Runs in the foreground, output also appended to <state-dir>/supernode.log.
# Exit code: flower-supernode's (1 for every Flower error; the line "Flower exit code N" names it,
# 305: the SuperLink refused the connection, e.g. an unregistered key), 2 for bad arguments.
# shellcheck disable=SC2174,SC2317  # mkdir -m applies to the leaf on purpose; trap handlers
set -euo pipefail
# shellcheck source=_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

SUPERLINK="" ROOT_CERT="" AUTH_KEY="" NODE_AUTH=1 STATE_DIR="" NODE_CONFIG="" ROLE=silo RT_PORT=9094
SILO_SERVICE=1 EXECUTOR=0 MAX_WAIT="" PID_DIR="" INSECURE=0
SVC_LIMITS=()  # --max-frame-bytes / --memory-budget / --max-connections for app.runtime.silo_service
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --superlink) need_value "$1" $#; SUPERLINK=$2; shift 2 ;;
    --root-cert|--root-certificates|--ca-cert) need_value "$1" $#; ROOT_CERT=$2; shift 2 ;;
    --auth-key) need_value "$1" $#; AUTH_KEY=$2; shift 2 ;;
    --no-node-auth) NODE_AUTH=0; shift ;;
    --state-dir) need_value "$1" $#; STATE_DIR=$2; shift 2 ;;
    --node-config) need_value "$1" $#; NODE_CONFIG=$2; shift 2 ;;
    --role) need_value "$1" $#; ROLE=$2; shift 2 ;;
    --runtime-port) need_value "$1" $#; RT_PORT=$2; shift 2 ;;
    --no-silo-service) SILO_SERVICE=0; shift ;;
    --service-max-frame-bytes|--service-memory-budget)
      need_value "$1" $#
      [[ "$2" =~ ^[0-9]+([KMG]i?B|[kmg]i?b)?$ ]] || die "$1 $2 is not a byte count (e.g. 268435456, 256MiB, 1GiB)"
      SVC_LIMITS+=("--${1#--service-}" "$2"); shift 2 ;;
    --service-max-connections)
      need_value "$1" $#
      [[ "$2" =~ ^[0-9]+$ ]] || die "$1 $2 is not a whole number"
      SVC_LIMITS+=(--max-connections "$2"); shift 2 ;;
    --executor) EXECUTOR=1; SILO_SERVICE=0; shift ;;
    --max-wait-time) need_value "$1" $#; MAX_WAIT=$2; shift 2 ;;
    --pid-dir) need_value "$1" $#; PID_DIR=$2; shift 2 ;;
    --insecure) INSECURE=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[[ -n "$SUPERLINK" ]] || die "--superlink HOST:PORT is required"
[[ "$SUPERLINK" =~ ^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}$ ]] || die "--superlink $SUPERLINK is not HOST:PORT (no https:// prefix)"
need_port --runtime-port "$RT_PORT"
[[ "$ROLE" == silo || "$ROLE" == shuffler ]] || die "--role must be silo or shuffler, not $ROLE"
[[ -z "$MAX_WAIT" || "$MAX_WAIT" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--max-wait-time $MAX_WAIT is not a number of seconds"

CMD=(flower-supernode --superlink "$SUPERLINK" --port "$RT_PORT")
if [[ $INSECURE == 1 ]]; then
  [[ -n "$ROOT_CERT$AUTH_KEY" ]] && die "--insecure excludes --root-cert and --auth-key (Flower authenticates nodes only over TLS)"
  insecure_warning
  CMD+=(--insecure)
else
  need_file --root-cert "$ROOT_CERT"
  CMD+=(--root-certificates "$(abspath "$ROOT_CERT")")
  if [[ $NODE_AUTH == 1 ]]; then
    [[ -n "$AUTH_KEY" ]] || die "--auth-key is required (make it with make_node_key.py and register its .pub), or --no-node-auth"
    need_file --auth-key "$AUTH_KEY"
    grep -q "BEGIN OPENSSH PRIVATE KEY" "$AUTH_KEY" || die "--auth-key $AUTH_KEY is not an OpenSSH private key (make_node_key.py writes one)"
    warn_key_mode "$AUTH_KEY"
    CMD+=(--auth-supernode-private-key "$(abspath "$AUTH_KEY")")
  else
    [[ -n "$AUTH_KEY" ]] && die "--no-node-auth and --auth-key exclude each other"
    note "note: --no-node-auth: this node presents a throwaway key; a SuperLink with node authentication refuses it"
  fi
fi
[[ -n "$MAX_WAIT" ]] && CMD+=(--max-wait-time "$MAX_WAIT")

# Node config: the operator's string, plus state-dir and role from the flags (a conflict is an error).
SETS=()
[[ -n "$STATE_DIR" ]] && { STATE_DIR=$(abspath "$STATE_DIR"); SETS+=(--set "state-dir='$STATE_DIR'"); }
[[ "$ROLE" == shuffler ]] && SETS+=(--set "role='shuffler'")
NODE_CONFIG=$("$PYTHON" "$UTIL" node-config --base "$NODE_CONFIG" "${SETS[@]}") || exit 2
if [[ -z "$STATE_DIR" ]]; then
  STATE_DIR=$("$PYTHON" "$UTIL" node-config --base "$NODE_CONFIG" --get state-dir) || exit 2
  [[ -n "$STATE_DIR" ]] || die "--state-dir is required (where this node's privacy ledger and keys live)"
  STATE_DIR=$(abspath "$STATE_DIR")
fi
if [[ "$ROLE" == silo && "$NODE_CONFIG" != *partition-id=* ]]; then
  die "the node config must set partition-id (this silo's index) and num-partitions, or use --role shuffler"
fi
mkdir -p -m 700 "$STATE_DIR"
PID_DIR=$(abspath "${PID_DIR:-$STATE_DIR}")
mkdir -p "$PID_DIR"
for f in supernode.pid silo-service.pid executor.pid; do
  old=$(cat "$PID_DIR/$f" 2>/dev/null || true)
  case $f in supernode.pid) what=flower-supernode ;; silo-service.pid) what=app.runtime.silo_service ;; *) what=app.runtime.executor ;; esac
  if running_as "$old" "$what"; then
    die "$PID_DIR/$f: pid $old is still running (another SuperNode with this state dir?); stop it first"
  fi
done
export FLWR_HOME=${FLWR_HOME:-$STATE_DIR/flwr-home}
mkdir -p -m 700 "$FLWR_HOME"

SN_PID="" SN_GROUP="" SVC_PID="" EXE_PID="" TEE_PID="" LOG_FD=""
stop_pid() {  # stop_pid PID: SIGTERM, up to 10 s, then SIGKILL
  local p=$1
  [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null || return 0
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$p" 2>/dev/null || true
}
stop_group() {  # stop_group PGID: the process group flower-supernode leads (its flower-superexec and
  local g=$1    # flwr-clientapp children): SIGTERM, up to 10 s, then SIGKILL
  [[ -n "$g" ]] && kill -0 -- "-$g" 2>/dev/null || return 0
  kill -TERM -- "-$g" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 -- "-$g" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL -- "-$g" 2>/dev/null || true
}
close_log() {  # the log's tee: it ends when the last writer closes the pipe; at most 2 s, then TERM
  [[ -n "$LOG_FD" ]] && { exec {LOG_FD}>&-; LOG_FD=""; }
  [[ -n "$TEE_PID" ]] || return 0
  for _ in $(seq 20); do kill -0 "$TEE_PID" 2>/dev/null || break; sleep 0.1; done
  kill -TERM "$TEE_PID" 2>/dev/null || true
  wait "$TEE_PID" 2>/dev/null || true
  TEE_PID=""
}
stop() {
  stop_pid "$EXE_PID"
  if [[ -n "$SN_GROUP" ]]; then stop_group "$SN_GROUP"; else stop_pid "$SN_PID"; fi
  stop_pid "$SVC_PID"
  close_log
  rm -f "$PID_DIR/supernode.pid" "$PID_DIR/silo-service.pid" "$PID_DIR/executor.pid"
}
trap stop EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

if [[ ${#SVC_LIMITS[@]} -gt 0 && $SILO_SERVICE == 0 ]]; then
  note "note: --service-* limits are for the silo service, which is not started (--no-silo-service or --executor)"
fi
if [[ $SILO_SERVICE == 1 ]]; then
  if (cd "$REPO_ROOT" && "$PYTHON" -c "import app.runtime.silo_service") 2>/dev/null; then
    SOCK="$STATE_DIR/silo-service.sock"
    [[ ${#SOCK} -le 107 ]] || die "silo service socket path $SOCK is too long for a Unix socket; use a shorter --state-dir"
    SVC_CMD=("$PYTHON" -m app.runtime.silo_service --socket "$SOCK" --node-config "$NODE_CONFIG" ${SVC_LIMITS[@]+"${SVC_LIMITS[@]}"})
    show "${SVC_CMD[@]}"
    (cd "$REPO_ROOT" && exec "${SVC_CMD[@]}") &
    SVC_PID=$!
    echo "$SVC_PID" > "$PID_DIR/silo-service.pid"
    note "silo service pid $SVC_PID (in $PID_DIR/silo-service.pid)"
    (cd "$REPO_ROOT" && "$PYTHON" "$UTIL" wait-silo-service "$SOCK" --pid "$SVC_PID" --timeout 180) \
      || die "the silo service is not serving on $SOCK (see its output above)"
    NODE_CONFIG=$("$PYTHON" "$UTIL" node-config --base "$NODE_CONFIG" --set "silo-service='$SOCK'") || exit 2
  else
    note "note: app.runtime.silo_service is not importable here: no silo service, the ClientApp runs the silo in-process"
  fi
fi

[[ $EXECUTOR == 1 ]] && CMD+=(--isolation process)
CMD+=(--node-config "$NODE_CONFIG" "${EXTRA[@]}")
note "FLWR_HOME=$FLWR_HOME"
show "${CMD[@]}"
# flower-supernode's output goes to this terminal and to <state-dir>/supernode.log: Flower logs its
# own exit code ("Exit Code: 305") but the process exits 1, so the log tells the reasons apart.
LOG="$STATE_DIR/supernode.log"
LOG_START=$(stat -c %s "$LOG" 2>/dev/null || echo 0)
exec {LOG_FD}> >(tee -a "$LOG")
TEE_PID=$!
# its own process group (setsid), so that stopping it stops the flower-superexec it starts: left
# behind, that child held the log's pipe open and its tee outlived this script after a SIGTERM
if command -v setsid >/dev/null; then
  setsid "${CMD[@]}" >&"$LOG_FD" 2>&1 &
  SN_PID=$! SN_GROUP=$!
else
  "${CMD[@]}" >&"$LOG_FD" 2>&1 &
  SN_PID=$!
fi
echo "$SN_PID" > "$PID_DIR/supernode.pid"
note "flower-supernode pid $SN_PID (in $PID_DIR/supernode.pid), log $LOG"
if [[ $EXECUTOR == 1 ]]; then
  EXE_CMD=("$PYTHON" -m app.runtime.executor --runtime-api "127.0.0.1:$RT_PORT" --node-config "$NODE_CONFIG")
  show "${EXE_CMD[@]}"
  (cd "$REPO_ROOT" && exec "${EXE_CMD[@]}") >&"$LOG_FD" 2>&1 &
  EXE_PID=$!
  echo "$EXE_PID" > "$PID_DIR/executor.pid"
  note "silofl executor pid $EXE_PID (in $PID_DIR/executor.pid)"
fi
set +e
wait "$SN_PID"
RC=$?
SN_PID=""
stop_group "$SN_GROUP"  # what it left (its flower-superexec), before the log is closed
SN_GROUP=""
close_log
FLWR_CODE=$(tail -c +$((LOG_START + 1)) "$LOG" | sed -n 's/.*Exit Code: \([0-9][0-9]*\).*/\1/p' | tail -1)
if [[ "$FLWR_CODE" == 305 ]]; then
  note "flower-supernode stopped with Flower exit code 305: the SuperLink refused the connection (unregistered key? wrong CA? SuperLink down?)"
elif [[ -n "$FLWR_CODE" ]]; then
  note "flower-supernode stopped with Flower exit code $FLWR_CODE (https://flower.ai/docs/framework/ref-exit-codes/$FLWR_CODE.html)"
fi
exit $RC

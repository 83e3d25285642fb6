#!/usr/bin/env bash
# silofl container entrypoint (docs/images.md). The first argument picks the role:
#
#   simulation [launcher args]    python -m app.launch ... (the default CMD: the embedded simulation)
#   superlink  [flower-superlink flags]
#       adds, unless given: --host 0.0.0.0, --database $SILOFL_SUPERLINK_DB (/state/superlink.db)
#       and TLS from $SILOFL_CERTS_DIR (/certs): --ssl-ca-certfile ca.crt --ssl-certfile server.pem
#       --ssl-keyfile server.key, plus --enable-supernode-auth (SILOFL_NODE_AUTH=0 leaves it out).
#       No certificates and no explicit --insecure: refuses to start (exit 2).
#   supernode  [flower-supernode flags]
#       adds, unless given: --superlink $SILOFL_SUPERLINK, --root-certificates /certs/ca.crt (when
#       that file exists; otherwise the system CAs verify the SuperLink), and
#       --auth-supernode-private-key $SILOFL_NODE_KEY (when set). When the image has the module
#       app.runtime.silo_service it first starts `python -m app.runtime.silo_service --socket SOCK --node-config
#       ...` (SOCK: the node config's silo-service='PATH', else <state-dir>/silo-service.sock,
#       which is then added to the node config, as scripts/deploy/supernode.sh does) and
#       supervises both processes: either one exiting stops the other.
#       SILOFL_SILO_SERVICE=auto (default; without the module the silo runs in-process), on (refuse
#       to start without it) or off. The service's limits (docs/silo-service.md): the node config's
#       max-model-params, or SILOFL_SILO_SERVICE_MAX_FRAME_BYTES, SILOFL_SILO_SERVICE_MEMORY_BUDGET
#       (byte counts: 268435456, 256MiB, 1GiB) and SILOFL_SILO_SERVICE_MAX_CONNECTIONS, passed as
#       --max-frame-bytes, --memory-budget and --max-connections.
#   anything else                 run as given (flwr, bash, scripts/deploy/superlink.sh, ...)
#
# TLS is the default for both network roles; --insecure is passed through only when given.
# The health check (docker/healthcheck.py) reads what this script writes to $SILOFL_HEALTH_FILE.
set -euo pipefail

PROG=silofl-entrypoint
CERTS_DIR=${SILOFL_CERTS_DIR:-/certs}
HEALTH_FILE=${SILOFL_HEALTH_FILE:-/tmp/silofl-health.json}

die() { echo "$PROG: error: $*" >&2; exit 2; }
note() { echo "[$PROG] $*" >&2; }

# has_flag NAME ARGS...: NAME is among ARGS, as "NAME" or "NAME=value".
has_flag() {
  local name=$1 a
  shift
  for a in "$@"; do
    [[ "$a" == "$name" || "$a" == "$name="* ]] && return 0
  done
  return 1
}

# flag_value NAME DEFAULT ARGS...: the value of the last NAME VALUE / NAME=VALUE in ARGS, or DEFAULT.
flag_value() {
  local name=$1 value=$2
  shift 2
  while [[ $# -gt 0 ]]; do
    case "$1" in
      "$name") [[ $# -ge 2 ]] || die "$name needs a value"; value=$2; shift 2 ;;
      "$name="*) value=${1#"$name="}; shift ;;
      *) shift ;;
    esac
  done
  printf '%s' "$value"
}

# need_file FLAG PATH: PATH must be a regular file the service user can read.
need_file() {
  local dir
  dir=$(dirname "$2")
  if [[ -d "$dir" && ! -x "$dir" ]]; then
    die "$1 $2: directory $dir is not accessible to uid $(id -u) (chmod o+x it, or chgrp it to $(id -g) and chmod g+x)"
  fi
  [[ -e "$2" ]] || die "$1 $2: no such file (mount the certificates, e.g. -v \$PWD/certs:$CERTS_DIR:ro, or pass --insecure explicitly for a loopback test)"
  [[ -f "$2" ]] || die "$1 $2: not a regular file"
  [[ -r "$2" ]] || die "$1 $2: not readable by uid $(id -u) (chown it to $(id -u), or chgrp it to $(id -g) and chmod g+r)"
}

# loopback_host HOST: the address a local client uses to reach a server bound to HOST.
loopback_host() {
  case "$1" in
    0.0.0.0|"") printf '127.0.0.1' ;;
    ::|"[::]") printf '[::1]' ;;
    *:*) local h=${1#[}; printf '[%s]' "${h%]}" ;;
    *) printf '%s' "$1" ;;
  esac
}

# write_health URL CAFILE SOCKET: what the HEALTHCHECK probes (best effort: /tmp may be read-only).
write_health() {
  python - "$HEALTH_FILE" "$1" "$2" "${3:-}" <<'PY' || note "note: could not write $HEALTH_FILE; the health check will report healthy without probing"
import json, os, sys
path, url, cafile, socket = sys.argv[1:5]
tmp = f"{path}.{os.getpid()}"
with open(tmp, "w") as fh:
    json.dump({"url": url, "cafile": cafile or None, "socket": socket or None}, fh)
os.replace(tmp, path)
PY
}

mkdir -p "${FLWR_HOME:?FLWR_HOME must be set}" 2>/dev/null \
  || note "note: cannot create FLWR_HOME=$FLWR_HOME (mount a volume at /state writable by uid $(id -u))"
rm -f "$HEALTH_FILE" 2>/dev/null || true

run_superlink() {
  local args=("$@") ca cert key host port db scheme=http
  if has_flag --insecure "${args[@]}"; then
    if has_flag --ssl-certfile "${args[@]}" || has_flag --ssl-keyfile "${args[@]}" || has_flag --ssl-ca-certfile "${args[@]}"; then
      die "--insecure and --ssl-* certificates exclude each other"
    fi
    note "WARNING: --insecure: no TLS and no SuperNode authentication; loopback tests only"
  else
    if ! has_flag --ssl-ca-certfile "${args[@]}" && ! has_flag --ssl-certfile "${args[@]}" && ! has_flag --ssl-keyfile "${args[@]}"; then
      args+=(--ssl-ca-certfile "$CERTS_DIR/ca.crt" --ssl-certfile "$CERTS_DIR/server.pem" --ssl-keyfile "$CERTS_DIR/server.key")
    fi
    ca=$(flag_value --ssl-ca-certfile "" "${args[@]}")
    cert=$(flag_value --ssl-certfile "" "${args[@]}")
    key=$(flag_value --ssl-keyfile "" "${args[@]}")
    need_file --ssl-ca-certfile "$ca"; need_file --ssl-certfile "$cert"; need_file --ssl-keyfile "$key"
    if [[ "${SILOFL_NODE_AUTH:-1}" != 0 ]] && ! has_flag --enable-supernode-auth "${args[@]}"; then
      args+=(--enable-supernode-auth)
    fi
    scheme=https
  fi
  has_flag --host "${args[@]}" || args+=(--host 0.0.0.0)
  if ! has_flag --database "${args[@]}"; then
    db=${SILOFL_SUPERLINK_DB:-/state/superlink.db}
    mkdir -p "$(dirname "$db")"
    args+=(--database "$db")
  fi
  host=$(flag_value --host 0.0.0.0 "${args[@]}")
  port=$(flag_value --port 8000 "${args[@]}")
  write_health "$scheme://$(loopback_host "$host"):$port/health" "${ca:-}" ""
  exec flower-superlink "${args[@]}"
}

# silo_socket NODE_CONFIG: "given PATH" when the node config sets silo-service='PATH', else
# "added PATH" with PATH = <state-dir>/silo-service.sock (or /run/silofl/silo-service.sock without
# a state-dir), as scripts/deploy/supernode.sh does. Flower's own parser reads the string.
silo_socket() {
  python - "$1" <<'PY'
import sys
from flwr.common.config import parse_config_args
cfg = parse_config_args([sys.argv[1]]) if sys.argv[1].strip() else {}
if cfg.get("silo-service"):
    print("given", cfg["silo-service"])
else:
    print("added", f"{str(cfg.get('state-dir') or '/run/silofl').rstrip('/')}/silo-service.sock")
PY
}

# set_node_config VALUE: replace the --node-config value in the caller's args (or add one).
set_node_config() {
  local i
  for i in "${!args[@]}"; do
    if [[ "${args[i]}" == --node-config ]]; then
      args[i + 1]=$1
      return
    elif [[ "${args[i]}" == --node-config=* ]]; then
      args[i]="--node-config=$1"
      return
    fi
  done
  args+=(--node-config "$1")
}

run_supernode() {
  local args=("$@") node_config socket mode=${SILOFL_SILO_SERVICE:-auto} host port ca="" scheme=http
  if has_flag --insecure "${args[@]}"; then
    has_flag --root-certificates "${args[@]}" && die "--insecure and --root-certificates exclude each other"
    note "WARNING: --insecure: the connection to the SuperLink is not encrypted; loopback tests only"
  elif ! has_flag --root-certificates "${args[@]}"; then
    if [[ -f "$CERTS_DIR/ca.crt" ]]; then
      args+=(--root-certificates "$CERTS_DIR/ca.crt")
    else
      note "note: no $CERTS_DIR/ca.crt: the SuperLink's certificate is verified against the system CAs"
    fi
  fi
  if ! has_flag --superlink "${args[@]}" && [[ -n "${SILOFL_SUPERLINK:-}" ]]; then
    args+=(--superlink "$SILOFL_SUPERLINK")
  fi
  if ! has_flag --auth-supernode-private-key "${args[@]}" && [[ -n "${SILOFL_NODE_KEY:-}" ]]; then
    need_file --auth-supernode-private-key "$SILOFL_NODE_KEY"
    args+=(--auth-supernode-private-key "$SILOFL_NODE_KEY")
  fi
  if has_flag --ssl-certfile "${args[@]}"; then
    scheme=https
    ca=$(flag_value --ssl-ca-certfile "" "${args[@]}")
  fi
  host=$(flag_value --host 127.0.0.1 "${args[@]}")
  port=$(flag_value --port 9094 "${args[@]}")

  node_config=$(flag_value --node-config "" "${args[@]}")
  socket="" how=""
  case "$mode" in
    off) ;;
    auto|on)
      if python -c "import app.runtime.silo_service" 2>/dev/null; then
        read -r how socket < <(silo_socket "$node_config") || true
        [[ -n "$socket" ]] || die "cannot parse --node-config \"$node_config\""
        [[ ${#socket} -le 107 ]] || die "silo service socket $socket is longer than 107 bytes (a Unix socket limit); set a shorter silo-service='PATH'"
        if [[ "$how" == added ]]; then
          set_node_config "${node_config:+$node_config }silo-service='$socket'"
        fi
      elif [[ "$mode" == on ]]; then
        die "SILOFL_SILO_SERVICE=on but this image has no app.runtime.silo_service module"
      elif [[ "$node_config" == *silo-service* ]]; then
        note "WARNING: the node config names a silo service but this image has no app.runtime.silo_service; starting the SuperNode alone"
      else
        note "note: no app.runtime.silo_service in this image: the ClientApp runs the silo in-process"
      fi
      ;;
    *) die "SILOFL_SILO_SERVICE=$mode: expected auto, on or off" ;;
  esac

  write_health "$scheme://$(loopback_host "$host"):$port/health" "$ca" "$socket"
  if [[ -z "$socket" ]]; then
    exec flower-supernode "${args[@]}"
  fi

  # Silo service next to the SuperNode: start it, wait for its socket, then run both and stop
  # the other when either exits (the container's exit status is the first one's).
  local limits=() var flag
  for var in MAX_FRAME_BYTES:--max-frame-bytes MEMORY_BUDGET:--memory-budget MAX_CONNECTIONS:--max-connections; do
    flag=${var#*:}
    var=SILOFL_SILO_SERVICE_${var%%:*}
    [[ -n "${!var:-}" ]] || continue
    if [[ $flag == --max-connections ]]; then
      [[ "${!var}" =~ ^[0-9]+$ ]] || die "$var=${!var} is not a whole number"
    else
      [[ "${!var}" =~ ^[0-9]+([KMG]i?B|[kmg]i?b)?$ ]] || die "$var=${!var} is not a byte count (e.g. 268435456, 256MiB, 1GiB)"
    fi
    limits+=("$flag" "${!var}")
  done
  mkdir -p "$(dirname "$socket")"
  note "starting the silo service on $socket${limits[*]:+ (${limits[*]})}"
  python -m app.runtime.silo_service --socket "$socket" --node-config "$node_config" ${limits[@]+"${limits[@]}"} &
  local svc=$! node="" waited=0 limit=${SILOFL_SILO_SERVICE_WAIT:-180} rc=0 first="" stopping=0
  stop() { kill -TERM ${node:+"$node"} "$svc" 2>/dev/null || true; }
  trap 'stopping=1; stop' TERM INT
  until [[ -S "$socket" ]]; do
    kill -0 "$svc" 2>/dev/null || { wait "$svc" || rc=$?; die "the silo service exited (status $rc) before creating $socket"; }
    [[ $waited -lt $((limit * 10)) ]] || { stop; die "no socket $socket after ${limit}s (SILOFL_SILO_SERVICE_WAIT)"; }
    sleep 0.1
    waited=$((waited + 1))
  done
  flower-supernode "${args[@]}" &
  node=$!
  wait -n -p first "$svc" "$node" || rc=$?
  if [[ $stopping == 0 && "$first" == "$svc" ]]; then
    note "the silo service exited (status $rc); stopping the SuperNode"
    [[ $rc != 0 ]] || rc=1  # unasked for: a failure, so that a restart policy starts both again
  fi
  stop
  wait "$node" 2>/dev/null || true
  wait "$svc" 2>/dev/null || true
  exit "$rc"
}

role=${1:-simulation}
[[ $# -gt 0 ]] && shift
case "$role" in
  simulation)
    # outputs/ is a link into the volume (/silofl/outputs -> /state/outputs)
    mkdir -p /state/outputs 2>/dev/null || note "note: cannot create /state/outputs (mount a volume at /state writable by uid $(id -u))"
    exec python -m app.launch "$@" ;;
  superlink) run_superlink "$@" ;;
  supernode) run_supernode "$@" ;;
  *) exec "$role" "$@" ;;
esac

# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared by the deployment launchers (sourced, not run). Sets up the environment every Flower
# process needs, and small helpers: die (one-line error, exit 2), show (print a command as it will
# run), insecure_warning, need_file.

DEPLOY_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$DEPLOY_DIR/../.." && pwd)
# The project's virtual environment first: the SuperLink and SuperNode start flower-superexec,
# flwr-serverapp and flwr-clientapp from PATH, and they must import this app's packages.
# (Kept where it already is on PATH: what stands before it, e.g. a test's stand-in, stays first.)
if [[ -x "$REPO_ROOT/.venv/bin/python" && ":$PATH:" != *":$REPO_ROOT/.venv/bin:"* ]]; then
  PATH="$REPO_ROOT/.venv/bin:$PATH"
fi
export PATH
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_DISABLE_UPDATE_CHECK=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python}
UTIL="$DEPLOY_DIR/deploy_util.py"
PROG=$(basename "$0")

die() { echo "$PROG: error: $*" >&2; exit 2; }
note() { echo "[$PROG] $*" >&2; }

# show CMD ARGS...: print the command, shell-quoted, as it will run.
show() { local q; q=$(printf ' %q' "$@"); echo "[$PROG] +${q}" >&2; }

insecure_warning() {
  cat >&2 <<'EOF'
################################################################################
#  WARNING: --insecure: NO TLS, NO SUPERNODE AUTHENTICATION.                   #
#  Model updates, run configs and node identities cross the network in clear   #
#  text and any process that reaches the port can join or submit runs.         #
#  Use this only on loopback for tests, never between machines.                #
################################################################################
EOF
}

# need_file FLAG PATH: PATH must be a readable file.
need_file() {
  [[ -n "$2" ]] || die "$1 is required (or pass --insecure for a loopback test)"
  [[ -f "$2" ]] || die "$1 $2: no such file"
  [[ -r "$2" ]] || die "$1 $2: not readable"
}

# warn_key_mode PATH: a private key readable by group or others gets a note.
warn_key_mode() {
  local mode
  mode=$(stat -c %a "$1" 2>/dev/null || echo "")
  if [[ -n "$mode" && "${mode: -2}" != "00" ]]; then
    note "note: private key $1 has mode $mode; chmod 600 it"
  fi
}

# need_value FLAG "$#": an option that takes a value must have one.
need_value() { [[ "$2" -ge 2 ]] || die "$1 needs a value"; }
# need_port OPTION VALUE: VALUE is a TCP port number (1..65535)
need_port() { [[ "$2" =~ ^[0-9]+$ && "$2" -ge 1 && "$2" -le 65535 ]] || die "$1 $2 is not a port number"; }

abspath() { realpath -m -- "$1"; }

# running_as PID PATTERN: PID is a live process (not a zombie) whose command line contains
# PATTERN. A pid file left by a crash names a dead pid, a zombie nobody reaped, or a pid the
# kernel has since given to an unrelated process: none of those is "still running".
running_as() {
  local pid=$1 pattern=$2 state
  [[ "$pid" =~ ^[0-9]+$ && -r /proc/$pid/stat ]] || return 1
  state=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [[ "$state" != Z && "$state" != X ]] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pattern"
}

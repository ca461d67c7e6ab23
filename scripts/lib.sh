# shellcheck shell=bash disable=SC2034
# Shared settings for the operator scripts. Sourced, never run.

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
VENV_PYTHON="${REPO_ROOT}/.venv/bin/python"
# The server is started by this absolute path, and a PID only counts as ours if its command line names it.
APP_PY="${REPO_ROOT}/app.py"
LOG_DIR="${LOG_DIR:-${REPO_ROOT}/logs}"
PID_FILE="${LOG_DIR}/gradio_app.pid"
# start_gradio.sh takes this lock and the server inherits it for its whole life: while it is held, a server (or a
# start) for this LOG_DIR is alive; once the lock is ours, whatever the PID file says is stale.
LOCK_FILE="${LOG_DIR}/gradio_app.lock"
LOG_FILE="${LOG_DIR}/gradio_app.log"
CONSOLE_LOG="${LOG_DIR}/gradio_app.console.log"
# The server derives its socket from LOG_DIR unless CONTROL_SOCKET is set; only LOG_DIR is exported.
CONTROL_SOCKET="${CONTROL_SOCKET:-${LOG_DIR}/control.sock}"
CONTROL_TOKEN="${CONTROL_SOCKET%.sock}.token"
export LOG_DIR

# status_gradio.sh exit codes (LSB): 1 dead with a stale PID file, 3 stopped, 4 unknown (not allowed to look).
# 0 running and 150 starting come from serving/control_cli.py, which asks the live process.
STATUS_DEAD=1
STATUS_STOPPED=3
STATUS_UNKNOWN=4

die() {
  echo "error: $*" >&2
  exit 1
}

require_venv() {
  [[ -x "${VENV_PYTHON}" ]] || die "no virtual environment at ${REPO_ROOT}/.venv; run scripts/setup_env.sh first"
}

py() {
  PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" "${VENV_PYTHON}" "$@"
}

# One effective setting, read by the project's own Settings (no copy of a default here). Extra arguments go to
# the CLI (--env-file FILE).
setting() {
  py -m serving.settings get "$@"
}

# A setting in seconds, rounded up to whole seconds for shell arithmetic ("4.5" -> 5, "120.0" -> 120).
setting_seconds() {
  local value whole
  value=$(setting "$@") || return
  whole=${value%%.*}
  [[ "${value}" == *.* && "${value#*.}" =~ [1-9] ]] && whole=$((whole + 1))
  echo "${whole}"
}

# Is PID this checkout's server? Prints one word: ours, gone (no such process, or a zombie), foreign (a live
# process that is not this checkout's app.py), hidden (/proc does not let this user look).
# /proc, not kill -0: kill -0 fails with EPERM for another user's live process, which is not "dead".
process_identity() {
  local pid=$1
  local -a argv=()
  [[ -d "/proc/${pid}" ]] || { echo gone; return; }
  if ! mapfile -d '' -t argv <"/proc/${pid}/cmdline" 2>/dev/null; then
    echo hidden
    return
  fi
  if ((${#argv[@]} == 0)); then
    echo gone
  elif ((${#argv[@]} >= 2)) && [[ "${argv[1]}" == "${APP_PY}" ]]; then
    echo ours
  else
    echo foreign
  fi
}

# Prints the PID from the PID file when that process is this checkout's server. Returns 1: no PID file;
# 2: stale (the process is gone, or the PID now belongs to another program); 4: this user may not tell.
running_pid() {
  [[ -e "${PID_FILE}" ]] || return 1
  local pid
  pid=$(tr -dc '0-9' <"${PID_FILE}" 2>/dev/null) || return 4
  [[ -n "${pid}" ]] || return 2
  case $(process_identity "${pid}") in
    ours) echo "${pid}" ;;
    hidden) echo "${pid}"; return 4 ;;
    *) return 2 ;;
  esac
}

# Removes what a dead server leaves behind. Call only while holding LOCK_FILE (then no server of ours lives).
remove_stale_files() {
  rm -f "${PID_FILE}" "${CONTROL_SOCKET}" "${CONTROL_TOKEN}"
}

# Opens LOCK_FILE on descriptor 9 (read-only is enough for flock, so any user who may read LOG_DIR can test it).
open_lock() {
  [[ -e "${LOCK_FILE}" ]] || : >>"${LOCK_FILE}"
  exec 9<"${LOCK_FILE}"
}

control() {
  py -m serving.control_cli --socket "${CONTROL_SOCKET}" "$@"
}

# shellcheck shell=bash disable=SC2034
# Shared settings for the operator scripts. Sourced, never run.

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV_PYTHON="${REPO_ROOT}/.venv/bin/python"
LOG_DIR="${LOG_DIR:-${REPO_ROOT}/logs}"
PID_FILE="${LOG_DIR}/gradio_app.pid"
LOG_FILE="${LOG_DIR}/gradio_app.log"
CONSOLE_LOG="${LOG_DIR}/gradio_app.console.log"
# The server derives its socket from LOG_DIR unless CONTROL_SOCKET is set; only LOG_DIR is exported.
CONTROL_SOCKET="${CONTROL_SOCKET:-${LOG_DIR}/control.sock}"
export LOG_DIR

die() {
  echo "error: $*" >&2
  exit 1
}

require_venv() {
  [[ -x "${VENV_PYTHON}" ]] || die "no virtual environment at ${REPO_ROOT}/.venv; run scripts/setup_env.sh first"
}

# Prints the PID from the PID file if that process is alive and is our server; returns 1 otherwise.
running_pid() {
  [[ -f "${PID_FILE}" ]] || return 1
  local pid
  pid=$(tr -dc '0-9' <"${PID_FILE}")
  [[ -n "${pid}" ]] || return 1
  kill -0 "${pid}" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -q "app.py" || return 1
  echo "${pid}"
}

control() {
  PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" \
    "${VENV_PYTHON}" -m serving.control_cli --socket "${CONTROL_SOCKET}" "$@"
}

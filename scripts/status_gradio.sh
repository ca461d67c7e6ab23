#!/usr/bin/env bash
# Show whether the server runs and what it serves. Exit codes follow LSB: 0 running, 1 dead with a stale
# PID file, 3 stopped. Usage: status_gradio.sh [--json]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_venv

json=false
[[ "${1:-}" == "--json" ]] && json=true

if ! pid=$(running_pid); then
  code=3
  state="stopped"
  if [[ -f "${PID_FILE}" ]]; then
    code=1
    state="not running (stale PID file ${PID_FILE}; the server died; start_gradio.sh recovers)"
  fi
  if [[ "${json}" == true ]]; then
    printf '{"running": false, "state": "%s"}\n' "${state%% *}"
  else
    echo "Status: ${state}"
  fi
  exit "${code}"
fi

args=(status --pid "${pid}")
[[ "${json}" == true ]] && args+=(--json)
control "${args[@]}"

#!/usr/bin/env bash
# Show whether the server runs and what it serves: the mode, and for an engine bundle the executor that runs it
# (TensorRT, or onnxruntime-cpu and why) and whether its accuracy was measured there.
# Usage: status_gradio.sh [--json]   (--json: always JSON)
# Exit status (LSB, plus one application code):
#   0 running        1 dead, with a stale PID file        3 stopped        4 unknown: this user may not look
#   150 starting: the process lives but its control channel does not answer (loading the model, or hung)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

json=false
[[ "${1:-}" == "--json" ]] && json=true

# report CODE STATE RUNNING(true|false|null) PID TEXT: "Status: TEXT", or one JSON object; then exit CODE.
report() {
  local code=$1 state=$2 running=$3 pid=$4 detail=$5
  if [[ "${json}" != true ]]; then
    echo "Status: ${detail:-${state}}"
  elif [[ -x "${VENV_PYTHON}" ]]; then
    py -c 'import json, sys
state, running, pid, detail = sys.argv[1:]
print(json.dumps({"running": json.loads(running), "state": state, "pid": int(pid) if pid else None,
                  "ready": False if running == "false" else None, "detail": detail}))' \
      "${state}" "${running}" "${pid}" "${detail}"
  else  # fixed text only: nothing here needs escaping
    printf '{"running": %s, "state": "%s", "pid": null, "ready": null, "detail": "no .venv; run scripts/setup_env.sh"}\n' \
      "${running}" "${state}"
  fi
  exit "${code}"
}

[[ -x "${VENV_PYTHON}" ]] || report "${STATUS_UNKNOWN}" unknown null "" "unknown: no virtual environment in ${REPO_ROOT}/.venv"

state=0
pid=$(running_pid) || state=$?
case ${state} in
  0) ;;
  1) report "${STATUS_STOPPED}" stopped false "" "" ;;
  2) report "${STATUS_DEAD}" dead false "" \
       "not running (stale PID file ${PID_FILE}; the server died; start_gradio.sh recovers)" ;;
  *) report "${STATUS_UNKNOWN}" unknown null "${pid:-}" \
       "unknown: this user may not read ${PID_FILE} or /proc/${pid:-PID}; run as the service's user or root" ;;
esac

# Alive and ours: its control channel says the rest, or control_cli answers "starting" (150) for it.
args=(--timeout 10 status --pid "${pid}" --log "${LOG_FILE}")
[[ "${json}" == true ]] && args+=(--json)
code=0
control "${args[@]}" || code=$?
exit "${code}"

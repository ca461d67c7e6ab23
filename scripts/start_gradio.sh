#!/usr/bin/env bash
# Start the server (background by default), wait until the model is warmed up, and report the URL.
# Usage: start_gradio.sh [--foreground] [--mode pytorch|trt] [--engine_path DIR] [--model_path DIR]
#                        [--port N] [--host ADDR] [--timeout SECONDS]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

foreground=false
timeout_s=${START_TIMEOUT:-600}
host=${HOST:-127.0.0.1}
port=${PORT:-7860}
app_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --foreground) foreground=true; shift ;;
    --mode|--engine_path|--model_path|--device)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      app_args+=("$1" "$2"); shift 2 ;;
    --port) [[ $# -ge 2 ]] || die "--port needs a value"; port=$2; shift 2 ;;
    --host) [[ $# -ge 2 ]] || die "--host needs a value"; host=$2; shift 2 ;;
    --timeout) [[ $# -ge 2 ]] || die "--timeout needs a value"; timeout_s=$2; shift 2 ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
app_args+=(--host "${host}" --port "${port}" --log_file "${LOG_FILE}")

require_venv
mkdir -p "${LOG_DIR}"
if pid=$(running_pid); then
  die "already running (PID ${pid}); stop it first with scripts/stop_gradio.sh"
fi
if [[ -f "${PID_FILE}" ]]; then
  echo "removing stale PID file (the last server did not stop cleanly)"
  rm -f "${PID_FILE}"
fi
cd "${REPO_ROOT}"

if [[ "${foreground}" == true ]]; then
  echo $$ >"${PID_FILE}"
  exec "${VENV_PYTHON}" app.py "${app_args[@]}"
fi

nohup "${VENV_PYTHON}" app.py "${app_args[@]}" >>"${CONSOLE_LOG}" 2>&1 </dev/null &
pid=$!
echo "${pid}" >"${PID_FILE}"
echo "starting (PID ${pid}); waiting up to ${timeout_s} s for the model to warm up"

deadline=$((SECONDS + timeout_s))
until "${VENV_PYTHON}" - "${host}" "${port}" <<'PY' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/readyz", timeout=2) as reply:
    sys.exit(0 if reply.status == 200 else 1)
PY
do
  if ! kill -0 "${pid}" 2>/dev/null; then
    rm -f "${PID_FILE}"
    echo "error: the server exited during start-up. Last lines of ${LOG_FILE}:" >&2
    tail -n 25 "${LOG_FILE}" "${CONSOLE_LOG}" >&2 2>/dev/null || true
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "error: not ready after ${timeout_s} s; stopping it. Last lines of ${LOG_FILE}:" >&2
    tail -n 25 "${LOG_FILE}" >&2 || true
    "${REPO_ROOT}/scripts/stop_gradio.sh" >/dev/null || true
    exit 1
  fi
  sleep 1
done
echo "ready: http://${host}:${port} (PID ${pid}, log ${LOG_FILE})"

#!/usr/bin/env bash
# Stop the server gracefully (SIGTERM lets running requests finish), SIGKILL after a timeout.
# Usage: stop_gradio.sh [--timeout SECONDS]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

timeout_s=${STOP_TIMEOUT:-60}
if [[ "${1:-}" == "--timeout" ]]; then
  [[ $# -ge 2 ]] || die "--timeout needs a value"
  timeout_s=$2
fi

if ! pid=$(running_pid); then
  if [[ -f "${PID_FILE}" ]]; then
    rm -f "${PID_FILE}"
    echo "not running; removed a stale PID file"
  else
    echo "not running"
  fi
  exit 0
fi

echo "stopping PID ${pid} (SIGTERM; running requests may take up to ${timeout_s} s to finish)"
kill -TERM "${pid}"
deadline=$((SECONDS + timeout_s))
while kill -0 "${pid}" 2>/dev/null; do
  if ((SECONDS >= deadline)); then
    echo "still running after ${timeout_s} s: sending SIGKILL"
    kill -KILL "${pid}" 2>/dev/null || true
    break
  fi
  sleep 0.5
done
rm -f "${PID_FILE}" "${CONTROL_SOCKET}" "${CONTROL_SOCKET%.sock}.token"
echo "stopped"

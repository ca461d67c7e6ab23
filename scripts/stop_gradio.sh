#!/usr/bin/env bash
# Stop the server gracefully: SIGTERM lets running answers finish for up to DRAIN_TIMEOUT_S (the server's own
# setting, read through python -m medgemma_xray.serving.settings), then SIGKILL if it is still there. Cleans what a dead server left.
# Usage: stop_gradio.sh [--timeout SECONDS]   (default: DRAIN_TIMEOUT_S + 15 s for the server's own shutdown)
# Exit status: 0 stopped, or not running; 4 not allowed to signal it (run as the service's user or root).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# After the drain the server still closes uvicorn (3 s) and the backends: this is the allowance for that.
shutdown_allowance_s=15
timeout_s=""
if [[ "${1:-}" == "--timeout" ]]; then
  [[ $# -ge 2 ]] || die "--timeout needs a value"
  timeout_s=$2
fi

secure_log_dir  # a LOG_DIR others may write to: its PID file may name any process
state=0
pid=$(running_pid) || state=$?
case ${state} in
  0) ;;
  1) echo "not running"; exit 0 ;;
  2)
    open_lock
    if flock -w 3 9; then  # no start is under way, so nothing alive owns these files
      remove_stale_files
      echo "not running; removed a stale PID file, control socket and token"
    else
      echo "not running yet: a start is under way and owns ${PID_FILE}; run stop_gradio.sh again once it is up"
    fi
    exit 0 ;;
  *)
    echo "error: cannot tell whether the server runs: this user may not read ${PID_FILE} or /proc/${pid:-PID};" \
      "run stop_gradio.sh as the service's user or root" >&2
    exit 4 ;;
esac

require_venv
drain_s=$(setting_seconds drain_timeout_s) || die "cannot read DRAIN_TIMEOUT_S (see above)"
timeout_s=${timeout_s:-$((drain_s + shutdown_allowance_s))}
echo "stopping PID ${pid} (SIGTERM: running answers get up to ${drain_s} s to finish; SIGKILL after ${timeout_s} s)"
if ! kill -TERM "${pid}" 2>/dev/null && [[ -d "/proc/${pid}" ]]; then
  echo "error: not allowed to signal PID ${pid} (it runs as user $(stat -c %U "/proc/${pid}")); run" \
    "stop_gradio.sh as that user or root" >&2
  exit 4
fi
deadline=$((SECONDS + timeout_s))
while [[ $(process_identity "${pid}") == ours ]]; do
  if ((SECONDS >= deadline)); then
    echo "still running after ${timeout_s} s: sending SIGKILL"
    kill -KILL "${pid}" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while [[ $(process_identity "${pid}") == ours ]] && ((SECONDS < deadline)); do sleep 0.2; done
    break
  fi
  sleep 0.5
done
# Exited, perhaps still a zombie: give its parent (often init) a moment to reap it, so "stopped" means gone.
for _ in $(seq 25); do [[ -d "/proc/${pid}" ]] || break; sleep 0.2; done
open_lock
if flock -w 5 9; then  # the server has let go of the lock: its files are ours to clean
  remove_stale_files
else
  echo "warning: ${LOCK_FILE} is still held (a new start, or a process the server left); leaving the files" >&2
fi
echo "stopped"

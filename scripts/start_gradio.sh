#!/usr/bin/env bash
# Start the server (background by default), wait until this start's own server is warmed up, and report the URL.
# Usage: start_gradio.sh [--foreground] [--mode pytorch|trt] [--engine_path DIR] [--model_path DIR]
#                        [--port N] [--host ADDR] [--timeout SECONDS]
# Exit status: 0 ready; 1 already running, another start under way, or start-up failed; otherwise the server's
# own (serving/exit_codes.py): 2 bad configuration, 98 HOST:PORT taken (found before the model loads).
# --foreground (systemd) execs app.py in place, so its exit status is the server's.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

foreground=false
timeout_s=${START_TIMEOUT:-600}
host=""
port=""
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
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
require_venv
# HOST and PORT from the environment, with the defaults of serving/settings.py (read, not copied).
[[ -n "${host}" ]] || host=$(setting host) || die "bad HOST (see above)"
[[ -n "${port}" ]] || port=$(setting port) || die "bad PORT (see above)"
instance=$(</proc/sys/kernel/random/uuid)
app_args+=(--host "${host}" --port "${port}" --log_file "${LOG_FILE}" --instance_id "${instance}")
umask 077  # the console log, PID file and lock are this user's alone (0600), as the server's own files are
secure_log_dir create
if pid=$(running_pid); then
  die "already running (PID ${pid}); stop it first with scripts/stop_gradio.sh"
fi
open_lock
# A few seconds' grace: a killed server's threads may still be letting go of the lock.
if ! flock -w 3 9; then
  if pid=$(running_pid); then
    die "already running (PID ${pid}); stop it first with scripts/stop_gradio.sh"
  fi
  die "another start is under way for ${LOG_DIR} (${LOCK_FILE} is locked); wait for it, then run scripts/status_gradio.sh"
fi
# The lock is ours, so no server of this LOG_DIR lives (it would hold the lock): a PID file is stale.
if [[ -e "${PID_FILE}" ]]; then
  echo "removing stale PID file, control socket and token (the last server did not stop cleanly)"
  remove_stale_files
fi
rotate_console_log
cd "${REPO_ROOT}"

write_pid_file() {
  local fresh
  fresh=$(mktemp "${PID_FILE}.XXXXXX")  # a new file (O_EXCL, 0600): never a link someone left in its place
  printf '%s\n' "$1" >"${fresh}"
  mv -f "${fresh}" "${PID_FILE}"  # atomic: a concurrent status never reads a half-written file
}

if [[ "${foreground}" == true ]]; then
  write_pid_file $$
  # exec keeps this PID (the PID file stays right) and descriptor 9: the server holds the lock for its life.
  exec "${VENV_PYTHON}" "${APP_PY}" "${app_args[@]}"
fi

nohup "${VENV_PYTHON}" "${APP_PY}" "${app_args[@]}" >>"${CONSOLE_LOG}" 2>&1 </dev/null &
pid=$!
write_pid_file "${pid}"
echo "starting (PID ${pid}); waiting up to ${timeout_s} s for the model to warm up"

case "${host}" in
  0.0.0.0) probe_host=127.0.0.1 ;;
  ::|"[::]") probe_host="[::1]" ;;
  *:*) probe_host="[${host#[}"; probe_host="${probe_host%]}]" ;;
  *) probe_host=${host} ;;
esac
url="http://${probe_host}:${port}"
deadline=$((SECONDS + timeout_s))
someone_else=""
while :; do
  probe=0
  answer=$(py -m medgemma_xray.serving.readiness --url "${url}" --instance "${instance}") || probe=$?
  if ((probe == 0)); then
    break
  elif ((probe == 2)); then
    someone_else=${answer}
  fi
  if ! kill -0 "${pid}" 2>/dev/null; then  # our own child: kill -0 cannot meet EPERM here
    code=0
    wait "${pid}" || code=$?
    rm -f "${PID_FILE}"
    echo "error: the server exited during start-up with status ${code} (2: bad configuration, 98: the port" \
      "is taken; see serving/exit_codes.py). Last lines of ${LOG_FILE} and ${CONSOLE_LOG}:" >&2
    tail -n 25 "${LOG_FILE}" "${CONSOLE_LOG}" >&2 2>/dev/null || true
    exit $((code == 0 ? 1 : code))
  fi
  if ((SECONDS >= deadline)); then
    echo "error: not ready after ${timeout_s} s${someone_else:+ (${someone_else})}; stopping it." \
      "Last lines of ${LOG_FILE}:" >&2
    tail -n 25 "${LOG_FILE}" >&2 || true
    kill -TERM "${pid}" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "${pid}" 2>/dev/null || true
    wait "${pid}" || true
    remove_stale_files
    exit 1
  fi
  sleep 0.5
done
echo "ready: http://${host}:${port} (PID ${pid}, log ${LOG_FILE})"

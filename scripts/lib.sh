# shellcheck shell=bash disable=SC2034
# Shared settings for the operator scripts. Sourced, never run.

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
VENV_PYTHON="${REPO_ROOT}/.venv/bin/python"
# The server is started by this absolute path, and a PID only counts as ours if its command line names it.
APP_PY="${REPO_ROOT}/app.py"
LOG_DIR="${LOG_DIR:-${REPO_ROOT}/logs}"
# The path as given (absolute, "." and ".." removed, links not followed): secure_log_dir checks each of its parts.
LOG_DIR_GIVEN=$(realpath -s -m -- "${LOG_DIR}")
# One spelling of the folder (absolute, symbolic links resolved): the server's command line carries it, and stop
# and status recognise a server of this LOG_DIR by it.
LOG_DIR=$(realpath -m -- "${LOG_DIR}")
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

# A configuration error (serving/exit_codes.py: 2, which systemd does not restart).
die_config() {
  echo "error: $*" >&2
  exit 2
}

# LOG_DIR holds what a start writes as the service's user or root: logs, PID file, lock, control token. Anyone else
# who may write there can plant symbolic links that the start then follows (appending a log to, or truncating, any
# file the starter may write). So LOG_DIR must belong to this user and be closed to others; it is made 0700, and a
# symbolic link in place of one of our files is refused. With "create" (a start), a missing LOG_DIR is created 0700
# and an existing one must belong to this user; without it (stop), only the mode and the links are checked.
secure_log_dir() {
  local create=${1:-} owner mode name
  secure_log_dir_path
  if [[ ! -e "${LOG_DIR}" ]]; then
    [[ "${create}" == create ]] || return 0
    mkdir -p -- "$(dirname -- "${LOG_DIR}")"
    mkdir -m 0700 -- "${LOG_DIR}" 2>/dev/null || [[ -d "${LOG_DIR}" ]] || die_config "cannot create LOG_DIR ${LOG_DIR}"
  fi
  [[ -d "${LOG_DIR}" ]] || die_config "LOG_DIR ${LOG_DIR} is not a folder"
  owner=$(stat -c %u -- "${LOG_DIR}")
  mode=$(stat -c %a -- "${LOG_DIR}")
  # stop and status may run as root or an operator for the service's LOG_DIR: they check the mode only.
  if [[ "${create}" == create && "${owner}" != "${EUID}" ]]; then
    die_config "LOG_DIR ${LOG_DIR} belongs to $(stat -c %U -- "${LOG_DIR}"), not to $(id -un): another user could" \
      "plant links there that this start would follow. Use a LOG_DIR of this user's own (install_service.sh gives" \
      "the service one)."
  fi
  if (((8#${mode} & 8#022) != 0)); then
    die_config "LOG_DIR ${LOG_DIR} is writable by others (mode ${mode}): anyone who may write there can plant links" \
      "that this start would follow. Make it private (chmod 700 ${LOG_DIR}) or choose another LOG_DIR."
  fi
  [[ "${create}" == create ]] && chmod 0700 -- "${LOG_DIR}"
  for name in "${PID_FILE}" "${PID_FILE}.new" "${LOCK_FILE}" "${LOG_FILE}" "${CONSOLE_LOG}" "${CONTROL_TOKEN}"; do
    if [[ -L "${name}" ]]; then
      die_config "${name} is a symbolic link; this start never writes through one. Remove it and look into who" \
        "put it there."
    fi
  done
}

# LOG_DIR's own path, as given: a symbolic link in it, or a folder above it that others may write to, lets another
# user point it elsewhere (a link planted in /tmp sent the control socket, token, logs and uploads into a folder
# of their choosing) or swap it after the checks. So no part of the path may be a symbolic link, and every folder
# above it that others may write to must be sticky (as /tmp is: nobody may then rename or delete what is not
# theirs) and belong to root or to this user.
secure_log_dir_path() {
  local path="" part mode owner
  local -a parts=()
  IFS=/ read -r -a parts <<<"${LOG_DIR_GIVEN#/}"
  for part in "${parts[@]}"; do
    path="${path}/${part}"
    if [[ -L "${path}" ]]; then
      die_config "LOG_DIR ${LOG_DIR_GIVEN}: ${path} is a symbolic link. This start never follows one there (another" \
        "user could point it anywhere); set LOG_DIR to the real folder, $(realpath -m -- "${LOG_DIR_GIVEN}")," \
        "after checking it is yours."
    fi
    [[ -e "${path}" ]] || break
    [[ "${path}" == "${LOG_DIR_GIVEN}" ]] && break  # LOG_DIR itself: secure_log_dir checks its owner and mode
    mode=$(stat -c %a -- "${path}")
    owner=$(stat -c %u -- "${path}")
    if (((8#${mode} & 8#022) != 0)); then
      if (((8#${mode} & 8#1000) == 0)); then
        die_config "LOG_DIR ${LOG_DIR_GIVEN}: the folder ${path} above it is writable by others (mode ${mode})" \
          "and not sticky, so anyone may replace LOG_DIR there. Choose a LOG_DIR under a folder only you and root" \
          "may write to (chmod go-w ${path})."
      elif [[ "${owner}" != 0 && "${owner}" != "${EUID}" ]]; then
        die_config "LOG_DIR ${LOG_DIR_GIVEN}: the folder ${path} above it is writable by others and belongs to" \
          "$(stat -c %U -- "${path}"), who may replace LOG_DIR there. Choose a LOG_DIR elsewhere."
      fi
    fi
  done
}

# The console log holds only what bypasses the server's logging (the server routes what libraries print into its
# rotating log); it is rotated here, at a start, as the log is (10 MiB, 5 old files), so even that stays bounded.
CONSOLE_LOG_MAX_BYTES=$((10 << 20))
rotate_console_log() {
  local index
  [[ -f "${CONSOLE_LOG}" && ! -L "${CONSOLE_LOG}" ]] || return 0
  (($(stat -c %s -- "${CONSOLE_LOG}") > CONSOLE_LOG_MAX_BYTES)) || return 0
  for index in 4 3 2 1; do
    [[ -f "${CONSOLE_LOG}.${index}" && ! -L "${CONSOLE_LOG}.${index}" ]] && mv -f -- "${CONSOLE_LOG}.${index}" "${CONSOLE_LOG}.$((index + 1))"
  done
  mv -f -- "${CONSOLE_LOG}" "${CONSOLE_LOG}.1"
}

require_venv() {
  [[ -x "${VENV_PYTHON}" ]] || die "no virtual environment at ${REPO_ROOT}/.venv; run scripts/setup_env.sh first"
}

# The project is installed into .venv (scripts/setup_env.sh), so its modules need no PYTHONPATH.
py() {
  "${VENV_PYTHON}" "$@"
}

# One effective setting, read by the project's own Settings (no copy of a default here). Extra arguments go to
# the CLI (--env-file FILE).
setting() {
  py -m medgemma_xray.serving.settings get "$@"
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
  elif ((${#argv[@]} >= 2)) && [[ "${argv[1]}" == "${APP_PY}" ]] && names_our_log_file "${argv[@]:2}"; then
    echo ours
  else
    echo foreign  # not this checkout's app.py, or the server of another LOG_DIR (whose PID file was copied here)
  fi
}

# Does an app.py command line carry --log_file ${LOG_FILE}? start_gradio.sh always passes it, so it ties a
# server to its LOG_DIR.
names_our_log_file() {
  while (($# >= 2)); do
    [[ "$1" == --log_file && "$2" == "${LOG_FILE}" ]] && return 0
    shift
  done
  return 1
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
  [[ -L "${LOCK_FILE}" ]] && die_config "${LOCK_FILE} is a symbolic link; remove it"
  [[ -e "${LOCK_FILE}" ]] || (umask 077 && set -o noclobber && : >"${LOCK_FILE}") 2>/dev/null || true
  exec 9<"${LOCK_FILE}"
}

control() {
  py -m medgemma_xray.serving.control_cli --socket "${CONTROL_SOCKET}" "$@"
}

#!/usr/bin/env bash
# Write a hardened systemd unit that runs this checkout as an unprivileged service (Type=notify: "started" means
# warmed up and listening). Creates the service's user when missing, and gives it LOG_DIR.
# Usage: install_service.sh [--user USER] [--output FILE] [--env-file FILE] [--name NAME] [--gpu | --no-gpu]
#   --user: a dedicated account (default medgemma-xray, created as a system user); root is refused
#   --gpu: allow the NVIDIA device nodes (default: only when /dev/nvidiactl exists here)
#   default output: /etc/systemd/system/<name>.service (then: systemctl enable --now <name>)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

name=medgemma-xray
user=medgemma-xray
output=""
env_file="/etc/default/medgemma-xray"
gpu=auto
while [[ $# -gt 0 ]]; do
  case "$1" in
    --user) [[ $# -ge 2 ]] || die "--user needs a value"; user=$2; shift 2 ;;
    --output) [[ $# -ge 2 ]] || die "--output needs a value"; output=$2; shift 2 ;;
    --env-file) [[ $# -ge 2 ]] || die "--env-file needs a value"; env_file=$2; shift 2 ;;
    --name) [[ $# -ge 2 ]] || die "--name needs a value"; name=$2; shift 2 ;;
    --gpu) gpu=yes; shift ;;
    --no-gpu) gpu=no; shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ "${name}" =~ ^[A-Za-z0-9_.-]+$ ]] || die "--name may hold letters, digits, '_', '.' and '-' only"
require_venv
output=${output:-/etc/systemd/system/${name}.service}
if [[ "${gpu}" == auto ]]; then
  gpu=no
  [[ -e /dev/nvidiactl ]] && gpu=yes
fi

# The server's own settings, with the environment file applied: never a copy of a number.
service_setting() {
  setting "$1" --env-file "${env_file}" || die "bad setting in ${env_file} (see above)"
}
drain_s=$(setting_seconds drain_timeout_s --env-file "${env_file}") || die "bad setting in ${env_file} (see above)"
host=$(service_setting host)
model_path=$(service_setting model_path)
engine_path=$(service_setting engine_path)
memory_max_mb=$(service_setting memory_max_mb)
max_connections=$(service_setting max_connections)

# ProtectHome=yes hides /home, /root and /run/user, and PrivateTmp=yes gives the service its own /tmp and
# /var/tmp: nothing it runs, reads or writes may live there.
paths=("${REPO_ROOT}" "${LOG_DIR}" "$(readlink -m "${VENV_PYTHON}")" "$(readlink -m "${REPO_ROOT}/models")")
[[ -n "${model_path}" ]] && paths+=("$(readlink -m "${model_path}")")
[[ -n "${engine_path}" ]] && paths+=("$(readlink -m "${engine_path}")")
for path in "${paths[@]}"; do
  case "${path}/" in
    /home/*|/root/*|/run/user/*|/tmp/*|/var/tmp/*)
      die "${path} is under /home, /root, /run/user, /tmp or /var/tmp, which the unit hides from the service" \
        "(ProtectHome=yes, PrivateTmp=yes). Put the checkout, its models and LOG_DIR elsewhere" \
        "(e.g. /opt/medgemma-xray), and build .venv from a system Python (PYTHON=/usr/bin/python3 scripts/setup_env.sh)" ;;
  esac
done
# --- the service's account: dedicated, unprivileged, no login, no home -------------------------------------------
if ! id -u "${user}" >/dev/null 2>&1; then
  [[ $(id -u) -eq 0 ]] || die "no such user: ${user}; create it as root: useradd --system --user-group" \
    "--no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ${user}"
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "${user}"
  echo "created system user ${user}"
fi
[[ $(id -u "${user}") -ne 0 ]] || die "refusing to run the service as root (uid 0); give --user a dedicated account"
group=$(id -gn "${user}")
if [[ $(id -u) -eq 0 ]]; then
  runuser -u "${user}" -- test -r "${APP_PY}" -a -x "${VENV_PYTHON}" ||
    die "${user} cannot read ${APP_PY} or run ${VENV_PYTHON}; make the checkout readable by it (chmod o+rX)"
fi

# --- LOG_DIR belongs to the service (log, PID file, lock, control socket and token, upload cache) ----------------
if [[ $(id -u) -eq 0 ]]; then
  install -d -m 0700 -o "${user}" -g "${group}" "${LOG_DIR}"
  chown -R "${user}:${group}" "${LOG_DIR}"
  # systemd (as root) opens the console log for append: create it first so the service's user owns it.
  [[ -e "${CONSOLE_LOG}" ]] || install -m 0600 -o "${user}" -g "${group}" /dev/null "${CONSOLE_LOG}"
elif [[ $(id -un) == "${user}" ]]; then
  mkdir -p "${LOG_DIR}" && chmod 0700 "${LOG_DIR}"
else
  die "run as root (or as ${user}) so that ${LOG_DIR} can be given to ${user}"
fi

# stop_gradio.sh waits drain + 15 s before SIGKILL; systemd waits 15 s more before it kills the whole unit.
stop_timeout_s=$((drain_s + 30))
no_restart=$(py -m medgemma_xray.serving.exit_codes no-restart)

# Every connection is an open file, and systemd starts services at a soft limit of 1,024 (the server cannot raise
# it: @resources is filtered). Room for MAX_CONNECTIONS plus the model's files and sockets.
nofile=$((max_connections + 4096))
((nofile >= 65536)) || nofile=65536
# MEMORY_MAX_MB: the kernel reclaims and throttles above MemoryHigh (90 %) and kills at MemoryMax; 0: no limit.
if ((memory_max_mb > 0)); then
  memory=$'MemoryHigh='"$((memory_max_mb * 9 / 10))M"$'\nMemoryMax='"${memory_max_mb}M"
else
  memory="# MEMORY_MAX_MB=0: no memory limit (set it in ${env_file} and run install_service.sh again)"
fi

devices="PrivateDevices=yes"
if [[ "${gpu}" == yes ]]; then
  # The driver's character devices by the names it registered here (/dev/nvidia0 and nvidiactl are "nvidia", or
  # "nvidia-frontend" on older drivers; CUDA needs "nvidia-uvm"), or the usual names when none is loaded yet.
  mapfile -t nvidia < <(awk '/^Block/ {exit} $2 ~ /^nvidia/ {print $2}' /proc/devices | sort -u)
  ((${#nvidia[@]})) || nvidia=(nvidia nvidia-frontend nvidia-uvm nvidia-caps)
  devices="DevicePolicy=closed"
  for device in "${nvidia[@]}"; do
    devices+=$'\n'"DeviceAllow=char-${device} rw"
  done
fi
network=""
case "${host}" in
  127.*|::1|localhost)  # loopback only: no packet from or to anywhere else (nothing is fetched at run time)
    network=$'IPAddressAllow=localhost\nIPAddressDeny=any' ;;
esac

mkdir -p "$(dirname "${output}")"
cat >"${output}" <<UNIT
[Unit]
Description=MedGemma X-Ray assistant (Gradio, ${REPO_ROOT})
Documentation=file://${REPO_ROOT}/README.md
After=network-online.target
Wants=network-online.target

[Service]
# The app sends READY=1 to \$NOTIFY_SOCKET once the model is warm and the port listens.
Type=notify
NotifyAccess=main
User=${user}
Group=${group}
WorkingDirectory=${REPO_ROOT}
# MODEL_PATH, ENGINE_PATH, INFERENCE_MODE, PORT, HOST, DRAIN_TIMEOUT_S, ... (see README, Configuration).
# After changing DRAIN_TIMEOUT_S or HOST there, run install_service.sh again: this unit follows them.
EnvironmentFile=-${env_file}
Environment=LOG_DIR=${LOG_DIR}
Environment=HOME=%C/${name} XDG_CACHE_HOME=%C/${name} PYTHONDONTWRITEBYTECODE=1
Environment=TORCHINDUCTOR_CACHE_DIR=%C/${name}/torchinductor TRITON_CACHE_DIR=%C/${name}/triton HF_HUB_OFFLINE=1
ExecStart=${REPO_ROOT}/scripts/start_gradio.sh --foreground
ExecStop=${REPO_ROOT}/scripts/stop_gradio.sh
Restart=on-failure
RestartSec=5
# Exit statuses a restart cannot fix (serving/exit_codes.py): bad configuration, port taken by another program.
RestartPreventExitStatus=${no_restart}
TimeoutStartSec=900
# DRAIN_TIMEOUT_S=${drain_s} (serving/settings.py${env_file:+, ${env_file}}) + 30 s
TimeoutStopSec=${stop_timeout_s}
StandardOutput=append:${CONSOLE_LOG}
StandardError=append:${CONSOLE_LOG}
# MAX_CONNECTIONS=${max_connections} (serving/settings.py) + 4096, at least 65536
LimitNOFILE=${nofile}
${memory}

# Sandbox: read-only system, LOG_DIR and the cache writable, no privileges to gain, nothing else to see.
# Left out on purpose: MemoryDenyWriteExecute (torch.compile, Triton and libffi need W+X pages), ProcSubset=pid
# (transformers and the NVIDIA driver read /proc/meminfo and /proc/driver), PrivateNetwork (it serves HTTP).
UMask=0077
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths=${LOG_DIR}
CacheDirectory=${name}
CacheDirectoryMode=0700
ProtectHome=yes
PrivateTmp=yes
PrivateMounts=yes
${devices}
CapabilityBoundingSet=
AmbientCapabilities=
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
# HOST=${host} at install time: a loopback HOST allows loopback traffic only (run install_service.sh again after
# changing HOST).
${network}
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
PrivateUsers=yes
KeyringMode=private
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
# A refused call fails with EPERM instead of killing the process (ONNX Runtime's thread pinning just logs it).
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
UNIT

echo "wrote ${output} (user ${user}, LOG_DIR ${LOG_DIR}, TimeoutStopSec ${stop_timeout_s} s, GPU devices: ${gpu})"
if [[ "${output}" == /etc/systemd/system/* ]] && command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload || echo "warning: systemctl daemon-reload failed (is systemd running?)" >&2
  echo "enable and start it with: systemctl enable --now ${name}"
fi

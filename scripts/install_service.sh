#!/usr/bin/env bash
# Write a systemd unit that runs this checkout as a service (Restart=on-failure, the log, an environment file).
# Usage: install_service.sh [--user USER] [--output FILE] [--env-file FILE] [--name NAME]
#   default output: /etc/systemd/system/<name>.service (then: systemctl daemon-reload; systemctl enable --now <name>)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

name=medgemma-xray
user=$(id -un)
output=""
env_file="/etc/default/medgemma-xray"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --user) [[ $# -ge 2 ]] || die "--user needs a value"; user=$2; shift 2 ;;
    --output) [[ $# -ge 2 ]] || die "--output needs a value"; output=$2; shift 2 ;;
    --env-file) [[ $# -ge 2 ]] || die "--env-file needs a value"; env_file=$2; shift 2 ;;
    --name) [[ $# -ge 2 ]] || die "--name needs a value"; name=$2; shift 2 ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
id -u "${user}" >/dev/null 2>&1 || die "no such user: ${user}"
output=${output:-/etc/systemd/system/${name}.service}
mkdir -p "$(dirname "${output}")" "${LOG_DIR}"

cat >"${output}" <<UNIT
[Unit]
Description=MedGemma X-Ray assistant (Gradio, ${REPO_ROOT})
Documentation=file://${REPO_ROOT}/README.md
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
User=${user}
WorkingDirectory=${REPO_ROOT}
# MODEL_PATH, ENGINE_PATH, INFERENCE_MODE, PORT, HOST, ... (see README, Configuration)
EnvironmentFile=-${env_file}
Environment=LOG_DIR=${LOG_DIR}
ExecStart=${REPO_ROOT}/scripts/start_gradio.sh --foreground
ExecStop=${REPO_ROOT}/scripts/stop_gradio.sh --timeout 80
Restart=on-failure
RestartSec=5
TimeoutStartSec=900
TimeoutStopSec=90
StandardOutput=append:${LOG_DIR}/gradio_app.console.log
StandardError=append:${LOG_DIR}/gradio_app.console.log

[Install]
WantedBy=multi-user.target
UNIT

echo "wrote ${output}"
if [[ "${output}" == /etc/systemd/system/* ]] && command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload || echo "warning: systemctl daemon-reload failed (is systemd running?)" >&2
  echo "enable and start it with: systemctl enable --now ${name}"
fi

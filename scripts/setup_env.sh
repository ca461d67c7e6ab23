#!/usr/bin/env bash
# Create .venv, install this project into it (editable, every version from constraints.txt), and put the committed
# demo checkpoint where the server looks for it. --dev adds the test tools, chromium and poppler-utils.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

dev=false
if [[ "${1:-}" == "--dev" ]]; then
  dev=true
fi
target=.
${dev} && target=".[dev]"

if [[ ! -x "${VENV_PYTHON}" ]]; then
  echo "creating virtual environment in .venv"
  "${PYTHON:-python3}" -m venv .venv
fi
echo "installing ${target} (editable; versions from constraints.txt)"
"${VENV_PYTHON}" -m pip install --quiet --disable-pip-version-check -c constraints.txt -e "${target}"

if ${dev} && ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium for the browser test"
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "warning: not root; install chromium yourself (sudo apt-get install chromium) for the browser test" >&2
  fi
fi
if ${dev} && ! command -v pdftoppm >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
  echo "installing poppler-utils (pdftoppm, pdftotext) to check the teaching handout PDF"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq poppler-utils >/dev/null; } || echo "warning: poppler-utils not installed" >&2
fi
if ${dev} && ! command -v dciodvfy >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
  echo "installing dicom3tools (dciodvfy) to validate the teaching page's DICOM SR exports"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dicom3tools >/dev/null; } || echo "warning: dicom3tools not installed" >&2
fi
if ${dev} && ! command -v systemd-analyze >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
  echo "installing systemd's tools to verify the generated unit"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null || echo "warning: systemd not installed" >&2
fi

"${VENV_PYTHON}" -m medgemma_xray.demo_model.install --output models/medgemma-demo

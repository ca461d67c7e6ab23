#!/usr/bin/env bash
# Hot-switch the running server to PyTorch, without a restart. The current mode stays if PyTorch cannot load.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_venv
running_pid >/dev/null || die "the server is not running; start it with scripts/start_gradio.sh"
control switch pytorch

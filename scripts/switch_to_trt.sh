#!/usr/bin/env bash
# Hot-switch the running server to the TensorRT engine, without a restart. The current mode stays if the
# engine cannot load (no engine, manifest mismatch, out of memory); the exit status is then non-zero.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_venv
running_pid >/dev/null || die "the server is not running; start it with scripts/start_gradio.sh"
control switch trt

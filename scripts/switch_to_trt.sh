#!/usr/bin/env bash
# Hot-switch the running server to its engine bundle (ENGINE_PATH), without a restart. It prints what runs:
# "TensorRT" only where TensorRT executes the plans; otherwise the executor (onnxruntime-cpu) and why, e.g.
#   TRT Engine: Loaded (INT8, executor onnxruntime-cpu: no TensorRT plans in this bundle)
# The current mode stays if the bundle cannot load (no bundle, corrupt, of another checkpoint, unverified on the
# executor that would run it, out of memory); the exit status is then non-zero.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_venv
running_pid >/dev/null || die "the server is not running; start it with scripts/start_gradio.sh"
control switch trt

#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need, then runs pytest.
set -euo pipefail
# Not lib.sh: its LOG_DIR must not leak into the tests, which give every server its own.
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "${REPO_ROOT}"
"${REPO_ROOT}/scripts/setup_env.sh" --dev
exec "${REPO_ROOT}/.venv/bin/python" -m pytest "$@"

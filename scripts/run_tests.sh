#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need, then runs pytest.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"
"${REPO_ROOT}/scripts/setup_env.sh" --dev
exec "${VENV_PYTHON}" -m pytest "$@"

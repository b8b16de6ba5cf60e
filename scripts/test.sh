#!/usr/bin/env bash
# The test suite (the README's test command). Runs in the environment made by scripts/setup.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
       PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
# pytest's 5 means no test ran: that is a failure here, never a pass.
[[ $rc -eq 5 ]] && echo "no tests ran" >&2
exit $rc

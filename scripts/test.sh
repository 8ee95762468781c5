#!/usr/bin/env bash
# Set up a virtual environment (torch 2.13.0, the CPU build without a GPU; overdrive, test tools) and run lint, the type check and the tests.
#   bash scripts/test.sh            the whole suite (what CI runs)
#   bash scripts/test.sh --quick    everything but the tests marked slow (pytest -m "not slow")
# Other arguments go to pytest (e.g. -x, -k NAME, a test file). The set-up runs only when .venv is missing or
# pyproject.toml changed since (scripts/venv.sh). The tests run in 2 pytest-xdist workers, whole files to a
# worker (their module fixtures are shared by their tests): many tests wait on processes they started, so two
# at once fill 2 cores. OVERDRIVE_TEST_WORKERS=N sets the number of workers (0: all in the pytest process).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv test
quick=()
if [ "${1:-}" = "--quick" ]; then
    shift
    quick=(-m "not slow")
fi
.venv/bin/ruff check src tests bench examples scripts
# types over src/ (configuration: [tool.basedpyright] in pyproject.toml); any error or warning fails the run
.venv/bin/basedpyright --pythonpath .venv/bin/python --warnings
workers=(-n "${OVERDRIVE_TEST_WORKERS:-2}" --dist loadfile)
.venv/bin/python -m pytest "${workers[@]}" "${quick[@]}" "$@"

#!/usr/bin/env bash
# Set up a virtual environment (torch 2.13.0 CPU, overdrive, test tools) and run lint, the type check and the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".[test]"
.venv/bin/ruff check src tests bench examples
# types over src/ (configuration: [tool.basedpyright] in pyproject.toml); any error or warning fails the run
.venv/bin/basedpyright --pythonpath .venv/bin/python --warnings
.venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# Set up a virtual environment (torch 2.13.0 CPU, overdrive) and train the digits example on 2 CPU processes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".[examples]"
.venv/bin/overdrive launch --num_processes 2 examples/digits.py "$@"

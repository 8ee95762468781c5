#!/usr/bin/env bash
# Set up a virtual environment (torch 2.13.0, the CPU build without a GPU; overdrive) and train the digits example on 2 CPU processes.
# The set-up runs only when .venv is missing or pyproject.toml changed since (scripts/venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
venv_current test || ensure_venv examples   # the test extra includes the examples'
.venv/bin/overdrive launch --num_processes 2 examples/digits.py "$@"

#!/usr/bin/env bash
# The `newest` tier (not CI): overdrive on the newest torch and the newest release of every library of the test
# extra, unpinned, in a virtual environment of its own (.venv-newest; NEWEST_VENV=DIR for another), then the
# type check and the quick tier (pytest -m "not slow"; arguments go to pytest). It tells whether the next
# releases break overdrive before the test extra's pins move to them. The first run downloads a few GB (torch
# from the package index is its CUDA build, with its nvidia-* packages).
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${NEWEST_VENV:-.venv-newest}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv" || exit 1
# the test extra's packages without their pins (ray[train]==2.58.0 -> ray[train])
newest=$(python3 -c 'import re, tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]
print(" ".join(re.split(r"[=<>!~;, ]", requirement)[0] for requirement in extra))') || exit 1
# One resolve, so each library's newest release that fits the newest torch it allows. A machine's pip
# configuration may cap torch with a constraints file: it is lifted for these installs only.
# shellcheck disable=SC2086  # one word per package
PIP_CONSTRAINT=/dev/null "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade \
    --upgrade-strategy eager torch -e . $newest || exit 1
# shellcheck disable=SC2046  # one word per package
"$venv/bin/python" -c 'import sys
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"
print("newest tier on:", ", ".join(f"{name} {version(name)}" for name in sys.argv[1:]))' \
    torch $(echo "$newest" | sed -E 's/\[[^]]*\]//g')
"$venv/bin/pip" check --disable-pip-version-check || echo "newest tier: pip check found the conflicts above"
status=0
"$venv/bin/basedpyright" --pythonpath "$venv/bin/python" --warnings || status=1
"$venv/bin/python" -m pytest -n "${OVERDRIVE_TEST_WORKERS:-2}" --dist loadfile -m "not slow" "$@" || status=1
echo "newest tier: $([ "$status" = 0 ] && echo passed || echo FAILED)"
exit "$status"

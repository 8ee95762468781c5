# Sourced by scripts/demo.sh and scripts/test.sh: create .venv, or bring it up to date, only when needed.
# `ensure_venv EXTRA` installs torch 2.13.0 (CPU) and this checkout editable with the extra EXTRA and writes a
# stamp (pyproject.toml's hash and the checkout's path); while the stamp matches and overdrive imports from
# this checkout, pip is skipped (the source is installed editable: edits need no new install).

venv_current() {  # venv_current EXTRA: is .venv set up, with EXTRA, for this pyproject.toml and checkout?
    local stamp=".venv/.overdrive-installed-$1"
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(sha256sum pyproject.toml | cut -c1-16) $PWD" ] &&
        .venv/bin/python -c "import overdrive, sys; sys.exit(not overdrive.__file__.startswith('$PWD/src/'))" \
            2>/dev/null
}

ensure_venv() {  # ensure_venv EXTRA
    venv_current "$1" && return 0
    [ -x .venv/bin/python ] || python3 -m venv .venv
    echo "setting up .venv (torch 2.13.0 CPU, overdrive[$1]): a few minutes the first time" >&2
    .venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".[$1]"
    echo "$(sha256sum pyproject.toml | cut -c1-16) $PWD" > ".venv/.overdrive-installed-$1"
}

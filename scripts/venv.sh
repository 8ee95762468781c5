# Sourced by scripts/demo.sh and scripts/test.sh: create .venv, or bring it up to date, only when needed.
# `ensure_venv EXTRA` installs torch 2.13.0 and this checkout editable with the extra EXTRA, says which torch it
# installed (its version and whether it is a CUDA or a CPU build) and writes a stamp (pyproject.toml's hash and
# the checkout's path); while the stamp matches and overdrive imports from this checkout, pip is skipped (the
# source is installed editable: edits need no new install).
#
# Which torch build: the package index's torch 2.13.0 for Linux is the CUDA build (with ~3 GB of nvidia-*
# packages). On a machine without a GPU (no working nvidia-smi) the set-up adds PyTorch's CPU wheel index as an
# extra index, where torch 2.13.0+cpu is; pip takes it over the index's 2.13.0 (a local version sorts higher).
#   OVERDRIVE_TORCH_INDEX=URL   use this wheel index instead (a PEP 503 index as PyTorch's; http(s):// or file://)
#   OVERDRIVE_TORCH_INDEX=      (set, empty) add none: pip's own configuration decides
# When the index cannot be reached, the set-up says so and installs from pip's configuration alone.

CPU_TORCH_INDEX="https://download.pytorch.org/whl/cpu"

venv_current() {  # venv_current EXTRA: is .venv set up, with EXTRA, for this pyproject.toml and checkout?
    local stamp=".venv/.overdrive-installed-$1"
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(sha256sum pyproject.toml | cut -c1-16) $PWD" ] &&
        .venv/bin/python -c "import overdrive, sys; sys.exit(not overdrive.__file__.startswith('$PWD/src/'))" \
            2>/dev/null
}

has_gpu() {  # an NVIDIA driver that lists at least one GPU
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"
}

torch_index() {  # prints the extra wheel index for torch (nothing: none), with the reason on stderr
    local index
    if [ -n "${OVERDRIVE_TORCH_INDEX+set}" ]; then
        index="$OVERDRIVE_TORCH_INDEX"
    elif has_gpu; then
        echo "a GPU was found (nvidia-smi): torch from pip's configured index (its CUDA build)" >&2
        return 0
    else
        index="$CPU_TORCH_INDEX"
    fi
    [ -n "$index" ] || { echo "OVERDRIVE_TORCH_INDEX is empty: torch from pip's configuration alone" >&2; return 0; }
    if ! python3 - "$index" <<'EOF' 2>/dev/null
import os, sys, urllib.parse, urllib.request
url = sys.argv[1].rstrip("/")
if url.startswith("file:"):
    sys.exit(not os.path.isdir(urllib.parse.urlparse(url).path))
urllib.request.urlopen(url + "/torch/", timeout=10).close()
EOF
    then
        echo "the torch wheel index $index cannot be reached: torch from pip's configuration alone" \
             "(set OVERDRIVE_TORCH_INDEX to a reachable CPU wheel index)" >&2
        return 0
    fi
    echo "torch from $index (OVERDRIVE_TORCH_INDEX$( [ -n "${OVERDRIVE_TORCH_INDEX+set}" ] || echo "'s default without a GPU"))" >&2
    echo "$index"
}

installed_torch() {  # what .venv's torch is, read from torch itself
    .venv/bin/python -c "import torch; cuda = torch.version.cuda
print(f'torch {torch.__version__} installed: ' + (f'a CUDA {cuda} build' if cuda else 'a CPU build'))"
}

ensure_venv() {  # ensure_venv EXTRA
    venv_current "$1" && return 0
    [ -x .venv/bin/python ] || python3 -m venv .venv
    echo "setting up .venv (torch 2.13.0, overdrive[$1]): a few minutes the first time" >&2
    local index extra=()
    index="$(torch_index)"
    [ -z "$index" ] || extra=(--extra-index-url "$index")
    .venv/bin/pip install --quiet --disable-pip-version-check "${extra[@]}" "torch==2.13.0" -e ".[$1]"
    installed_torch >&2
    echo "$(sha256sum pyproject.toml | cut -c1-16) $PWD" > ".venv/.overdrive-installed-$1"
}

"""scripts/demo.sh and scripts/test.sh set up .venv only when it is missing or out of date (the demo used to
reinstall on every run: 2:14 for 3 s of training), install torch's CPU build on a machine without a GPU and say
which torch they installed, and ``--quick`` selects everything but the slow tests. Run in a copy of the scripts
whose .venv tools only record how they were called."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _checkout(tmp_path: Path) -> Path:
    """A checkout with the real scripts and pyproject.toml, and a .venv whose python runs this interpreter on
    the checkout's own (empty) overdrive package and whose other tools append their arguments to calls.log."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", root / "scripts", ignore=shutil.ignore_patterns("*.py"))
    shutil.copy(ROOT / "pyproject.toml", root)
    (root / "src" / "overdrive").mkdir(parents=True)
    (root / "src" / "overdrive" / "__init__.py").write_text("")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\ncase "$1" in -m) echo "python $*" >> {root}/calls.log; exit 0;; esac\n'
                                    f'PYTHONPATH={root}/src exec {sys.executable} "$@"\n')
    for tool in ("pip", "overdrive", "ruff", "basedpyright"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {root}/calls.log\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return root


def _run(root: Path, script: str, *args: str) -> list[str]:
    log = root / "calls.log"
    log.unlink(missing_ok=True)
    index = root / "cpu-index"  # a reachable wheel index, without the network
    index.mkdir(exist_ok=True)
    env = {**os.environ, "OVERDRIVE_TORCH_INDEX": f"file://{index}"}
    result = subprocess.run(["bash", f"scripts/{script}", *args], cwd=root, capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    if any(call.startswith("pip ") for call in calls):  # a set-up: torch from that index, and what was installed
        assert f"--extra-index-url file://{index} torch==2.13.0" in calls[0], calls[0]
        import torch

        build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU build"
        assert f"torch {torch.__version__} installed: {build}" in result.stderr, result.stderr
    return calls


def _torch_index(tmp_path: Path, gpu: str | None, **env: str) -> tuple[str, str]:
    """scripts/venv.sh's choice of wheel index for torch (stdout) and its reason (stderr), on a machine whose
    nvidia-smi prints ``gpu`` (None: no nvidia-smi at all; "fail": the driver is absent)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.unlink(missing_ok=True)
    if gpu is not None:
        smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'; exit 9\n" if gpu == "fail" else f"#!/bin/sh\necho '{gpu}'\n")
        smi.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if k != "OVERDRIVE_TORCH_INDEX"}
    # the default index (PyTorch's CPU wheels) replaced by a local one: the choice is tested without the network
    default = tmp_path / "default-index"
    default.mkdir(exist_ok=True)
    command = f'source {ROOT}/scripts/venv.sh; CPU_TORCH_INDEX="file://{default}"; torch_index'
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                            env={**clean, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), result.stderr.strip()


def test_the_cpu_build_of_torch_without_a_gpu_and_what_decides_it(tmp_path):
    default = f"file://{tmp_path / 'default-index'}"
    assert "PyTorch's CPU wheel" in (ROOT / "scripts" / "venv.sh").read_text()
    assert 'CPU_TORCH_INDEX="https://download.pytorch.org/whl/cpu"' in (ROOT / "scripts" / "venv.sh").read_text()
    # no GPU (no nvidia-smi, or one that fails without a driver): the CPU wheel index, as an extra index
    for gpu in (None, "fail"):
        index, why = _torch_index(tmp_path, gpu)
        assert index == default and "default without a GPU" in why, (gpu, why)
    # a GPU: the package index's build (CUDA), whatever the default
    index, why = _torch_index(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-1)")
    assert index == "" and "a GPU was found" in why
    # the variable chooses, GPU or not; set and empty: pip's configuration alone
    chosen = tmp_path / "my-index"
    chosen.mkdir()
    for gpu in (None, "GPU 0: NVIDIA H200 (UUID: GPU-1)"):
        assert _torch_index(tmp_path, gpu, OVERDRIVE_TORCH_INDEX=f"file://{chosen}")[0] == f"file://{chosen}"
    index, why = _torch_index(tmp_path, None, OVERDRIVE_TORCH_INDEX="")
    assert index == "" and "OVERDRIVE_TORCH_INDEX is empty" in why
    # an index that cannot be reached (this machine reaches no such host): said, and pip's configuration decides,
    # as on the development machine, whose pip configuration has torch's CPU wheel
    for unreachable in ("http://127.0.0.1:9/whl/cpu", f"file://{tmp_path / 'missing'}"):
        index, why = _torch_index(tmp_path, None, OVERDRIVE_TORCH_INDEX=unreachable)
        assert index == "" and f"the torch wheel index {unreachable} cannot be reached" in why, why


def test_demo_installs_once_and_again_only_when_pyproject_changes(tmp_path):
    root = _checkout(tmp_path)
    first = _run(root, "demo.sh")
    assert [call.split()[0] for call in first] == ["pip", "overdrive"] and first[0].endswith('-e .[examples]')
    assert _run(root, "demo.sh", "--epochs", "1") == ["overdrive launch --num_processes 2 examples/digits.py --epochs 1"]
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + "\n# changed\n")
    assert [call.split()[0] for call in _run(root, "demo.sh")] == ["pip", "overdrive"]


def test_test_script_installs_once_and_quick_skips_the_slow_tests(tmp_path):
    root = _checkout(tmp_path)
    first = _run(root, "test.sh", "-x")
    assert first[0].startswith("pip install") and first[0].endswith("-e .[test]")
    assert first[1:] == ["ruff check src tests bench examples scripts",
                         "basedpyright --pythonpath .venv/bin/python --warnings",
                         "python -m pytest -n 2 --dist loadfile -x"]
    assert _run(root, "test.sh", "--quick", "-q")[-1] == "python -m pytest -n 2 --dist loadfile -m not slow -q"
    assert "pip" not in " ".join(_run(root, "demo.sh"))  # the test extra includes the demo's

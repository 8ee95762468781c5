"""Accelerate 1.16.0's whole public surface (read from its source by scripts/accelerate_surface.py) resolves under
the alias, but for the names in the absent list (at most 15, each with its reason); the names new in 1.16.0 have
1.16.0's values and behaviour, compared with the real package in its own interpreter."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = str(ROOT / "src")


def _surface_script():
    spec = importlib.util.spec_from_file_location("accelerate_surface", ROOT / "scripts" / "accelerate_surface.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.requires("accelerate")
def test_every_public_name_resolves_or_is_listed_absent_with_its_reason():
    from overdrive.compat.surface_absent import ABSENT_NAMES

    script = _surface_script()
    surface = script.public_names(script.installed_package_root())
    assert sum(len(names) for names in surface.values()) > 700
    assert "get_torch_accelerator_backend" in surface["accelerate.utils.imports"]
    missing = {f"{module}.{name}" for module, names in script.unresolved(surface).items() for name in names}
    assert missing - set(ABSENT_NAMES) == set()
    assert set(ABSENT_NAMES) <= missing, "the absent list names names that resolve"
    assert len(ABSENT_NAMES) <= 15 and all(reason.strip() for reason in ABSENT_NAMES.values())


_NEW_NAMES = r"""
import json, logging, os, sys, warnings
warnings.simplefilter("ignore")
if sys.argv[1] == "alias":
    import overdrive
    overdrive.install_as_accelerate()
import accelerate.logging as alog
from accelerate.utils import (get_torch_accelerator_backend, get_distributed_backend, normalize_device,
                              get_accelerator_free_memory)
from accelerate.utils import imports, modeling
from accelerate.utils.constants import TORCH_DISTRIBUTED_BACKENDS, DEVICE_VISIBLE_DEVICES_ENV_VARS
from accelerate.commands.launch import CHILD_STDERR_CHUNK_SIZE, CHILD_STDERR_TAIL_CHUNKS
from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig
out = {"backends": TORCH_DISTRIBUTED_BACKENDS, "visible": DEVICE_VISIBLE_DEVICES_ENV_VARS,
       "chunks": [CHILD_STDERR_CHUNK_SIZE, CHILD_STDERR_TAIL_CHUNKS]}
kind, module = get_torch_accelerator_backend()
out["backend"] = [kind, getattr(module, "__name__", None)]
out["backend_unprobed"] = [get_torch_accelerator_backend(check_available=False)[0]]
out["distributed"] = {t: get_distributed_backend(t) for t in ("cuda", "cpu", "mps", "npu", "hpu", "neuron", None)}
out["normalize"] = [str(normalize_device(d)) for d in (0, 1, "cpu", "cuda:1", "npu", "disk")]
out["same_functions"] = [imports.get_torch_accelerator_backend is get_torch_accelerator_backend,
                         imports.get_distributed_backend is get_distributed_backend,
                         modeling.normalize_device is normalize_device,
                         modeling.get_accelerator_free_memory is get_accelerator_free_memory]
levels = []
for setter in (alog.set_verbosity_debug, alog.set_verbosity_info, alog.set_verbosity_warning, alog.set_verbosity_error):
    setter()
    levels.append(alog.get_verbosity())
alog.set_verbosity("warning")
levels.append(alog.get_verbosity())
alog.set_verbosity(logging.CRITICAL)
levels += [alog.get_verbosity(), logging.getLogger("accelerate.anything").getEffectiveLevel(),
           logging.getLogger().level]
out["levels"] = levels
config = DeepSpeedSequenceParallelConfig()
out["sp_defaults"] = [config.sp_allow_recurrent_layers, config.sp_disable_in_eval]
os.environ.update(PARALLELISM_CONFIG_SP_ALLOW_RECURRENT_LAYERS="TRUE", PARALLELISM_CONFIG_SP_DISABLE_IN_EVAL="false")
config = DeepSpeedSequenceParallelConfig()
out["sp_from_env"] = [config.sp_allow_recurrent_layers, config.sp_disable_in_eval]
config = DeepSpeedSequenceParallelConfig(sp_allow_recurrent_layers=False, sp_disable_in_eval=True)
out["sp_given"] = [config.sp_allow_recurrent_layers, config.sp_disable_in_eval]
print(json.dumps(out))
"""


def _new_names(side: str) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", _NEW_NAMES, side], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.requires("accelerate")
def test_names_new_in_1_16_behave_as_the_real_release():
    real, ours = _new_names("real"), _new_names("alias")
    assert ours == real
    assert real["chunks"] == [8192, 64] and real["distributed"]["cuda"] == "nccl"
    assert ours["same_functions"] == [True] * 4


_REMOVED = r"""
import importlib, json, sys, warnings
warnings.simplefilter("always")
side = sys.argv[1]
if side == "alias":
    import overdrive
    overdrive.install_as_accelerate()
import accelerate
CHECKS = [("accelerate", "prepare_pippy"), ("accelerate.inference", "prepare_pippy"),
          ("accelerate.inference", "find_pippy_batch_size"), ("accelerate.utils", "FP8RecipeKwargs"),
          ("accelerate.utils.dataclasses", "MSAMPRecipeKwargs"), ("accelerate.utils.imports", "is_msamp_available"),
          ("accelerate.utils", "is_pippy_available"), ("accelerate.utils.constants", "FSDP_PYTORCH_VERSION")]
out = {}
for module_name, name in CHECKS:
    with warnings.catch_warnings(record=True) as caught:
        try:
            value = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            out[f"{module_name}.{name}"] = type(exc).__name__
            continue
    out[f"{module_name}.{name}"] = [str(w.message) for w in caught if w.category is DeprecationWarning]
if side == "alias":
    from accelerate.utils import FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
    recipe = FP8RecipeKwargs(backend="TE", fp8_format="E4M3")
    out["te"] = [type(recipe) is TERecipeKwargs, recipe.fp8_format]
    out["msamp"] = MSAMPRecipeKwargs().opt_level
    with warnings.catch_warnings(record=True) as caught:
        own = overdrive.prepare_pippy  # overdrive's own pipeline inference: no warning
    out["own_warnings"] = len(caught)
print(json.dumps(out))
"""


@pytest.mark.requires("accelerate")
def test_names_removed_in_1_16_keep_working_under_the_alias_with_a_deprecation_warning():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = {}
    for side in ("real", "alias"):
        proc = subprocess.run([sys.executable, "-c", _REMOVED, side], capture_output=True, text=True, timeout=300,
                              env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    real, ours = runs["real"], runs["alias"]
    checked = [key for key in real if "." in key]
    assert all(real[key] in ("ModuleNotFoundError", "AttributeError") for key in checked), real  # gone in 1.16.0
    for key in checked:
        assert isinstance(ours[key], list) and ours[key], (key, ours[key])
        assert all(key.split(".")[-1] in message and "removed in Accelerate 1.16.0" in message for message in ours[key])
    assert ours["te"] == [True, "E4M3"] and ours["msamp"] == "O2" and ours["own_warnings"] == 0


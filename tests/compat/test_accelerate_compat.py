"""The compat table against the installed Accelerate: every module and name accounted for, the thin modules
generated from the table, every listed name importable, refusals clear, availability answers truthful."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from overdrive.compat.table import NAMES
from overdrive.compat.unsupported import UnsupportedFeatureError

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=240, cwd=ROOT)


def test_accelerate_paths_are_served_from_the_table_not_files():
    """Every path of the table imports, no file stands at one, and a same-module path is that module."""
    from overdrive.compat.paths import SERVED_ROOTS, served_paths
    from overdrive.compat.table import SAME_MODULE

    assert SERVED_ROOTS == {path.split(".")[1] for path in served_paths()}
    src = ROOT / "src"
    on_disk = [p for p in served_paths()
               if (src / (p.replace(".", "/") + ".py")).exists() or (src / p.replace(".", "/")).is_dir()]
    assert not on_disk, f"files at served paths (the table serves them): {on_disk}"
    for path in served_paths():
        module = importlib.import_module(path)
        if path in SAME_MODULE:
            assert module is importlib.import_module(SAME_MODULE[path])
        else:
            assert sorted(module.__all__) == sorted(NAMES[path]) == sorted(dir(module))


@pytest.mark.requires("accelerate")
def test_every_accelerate_module_and_name_is_accounted_for_and_the_parity_page_is_current():
    proc = _script("accelerate_parity.py", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_table_name_imports_from_its_module():
    """Every name of the table is importable from its served module and is the object its source defines: a
    name the table lists but no module defines fails here."""
    missing = []
    for module_name, names in NAMES.items():
        module = importlib.import_module(module_name)
        for name, source in names.items():
            try:
                value = getattr(module, name)
            except (ImportError, AttributeError):
                missing.append(f"{module_name}.{name} ({source})")
                continue
            path, _, attribute = source.partition(":")  # "module:attribute" where it has another name there
            expected = getattr(importlib.import_module(path), attribute or name)
            if module_name == "overdrive.utils" and name == "tqdm" and "overdrive.utils.tqdm" in sys.modules:
                # importing the submodule accelerate.utils.tqdm rebinds the name to it: a module called as tqdm
                assert value is sys.modules["overdrive.utils.tqdm"] and value.tqdm is expected
                continue
            assert value is expected
    assert not missing, missing


def test_refused_names_import_and_raise_naming_the_feature_and_the_alternative():
    import overdrive.utils
    from overdrive.compat.refusals import REFUSALS

    for name, (kind, why, instead) in REFUSALS.items():
        obj = getattr(overdrive.utils, name, None) or getattr(importlib.import_module("overdrive.compat.refusals"), name)
        with pytest.raises(UnsupportedFeatureError) as info:
            obj()
        assert name in str(info.value) and why in str(info.value) and instead in str(info.value)
        if kind == "class":
            assert not isinstance(object(), obj)


@pytest.mark.requires("accelerate")
def test_availability_helpers_answer_as_accelerate_does():
    code = (
        "import json, accelerate.utils as A, overdrive.helpers.imports as O\n"
        "from overdrive.compat.table import NAMES\n"
        "out = {}\n"
        "for n in NAMES['overdrive.utils.imports']:\n"
        "    if n.startswith('is_') and hasattr(A, n):\n"
        "        out[n] = [bool(getattr(A, n)()), bool(getattr(O, n)())]\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(answers) >= 50
    differ = {name: pair for name, pair in answers.items() if pair[0] != pair[1]}
    assert not differ, differ


def test_helpers_work():
    from overdrive.utils import (
        FSDP_AUTO_WRAP_POLICY,
        compare_versions,
        convert_bytes,
        is_torch_version,
        merge_dicts,
        str_to_bool,
    )

    assert compare_versions("torch", ">=", "2.0") and is_torch_version(">=", "2.0")
    from packaging.version import Version

    assert not compare_versions(Version("2.1.0"), "<", "2.0")
    with pytest.raises(ValueError, match="operation"):
        compare_versions("torch", "~", "2.0")
    assert "TRANSFORMER_BASED_WRAP" in FSDP_AUTO_WRAP_POLICY
    assert convert_bytes(2048) == "2.0 KB"
    assert merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}}
    assert str_to_bool("yes") == 1 and str_to_bool("off", to_bool=True) is False
    with pytest.raises(ValueError, match="maybe"):
        str_to_bool("maybe")


def test_write_basic_config_then_load_it(tmp_path):
    from overdrive.commands.config import load_config_from_file
    from overdrive.utils import write_basic_config

    path = tmp_path / "cfg.yaml"
    assert write_basic_config("bf16", save_location=str(path))
    assert write_basic_config("bf16", save_location=str(path)) is False  # an existing file is left alone
    config = load_config_from_file(str(path))
    assert config.mixed_precision == "bf16" and config.compute_environment == "LOCAL_MACHINE"
    with pytest.raises(ValueError, match="fp7"):
        write_basic_config("fp7", save_location=str(tmp_path / "other.yaml"))


def test_deepspeed_plugin_hf_ds_config_has_the_shape_transformers_uses():
    from overdrive import DeepSpeedPlugin
    from overdrive.utils import HfDeepSpeedConfig

    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
                                           "train_micro_batch_size_per_gpu": "auto"})
    assert isinstance(plugin.hf_ds_config, HfDeepSpeedConfig)
    assert plugin.hf_ds_config.config is plugin.deepspeed_config
    assert plugin.hf_ds_config.is_zero3() and plugin.hf_ds_config.is_offload()
    assert plugin.hf_ds_config.get_value("zero_optimization.stage") == 3

    class TrainerConfig(HfDeepSpeedConfig):  # transformers' HfTrainerDeepSpeedConfig is such a subclass
        def dtype(self):
            return "bf16"

    given = TrainerConfig({"zero_optimization": {"stage": 2}})
    plugin = DeepSpeedPlugin(hf_ds_config=given)
    assert plugin.hf_ds_config is given and plugin.deepspeed_config is given.config
    given.config["gradient_clipping"] = 0.5  # what transformers fills in later is the plugin's config too
    assert plugin.get_value("gradient_clipping") == 0.5
    assert DeepSpeedPlugin(zero_stage=2).hf_ds_config.is_zero2()

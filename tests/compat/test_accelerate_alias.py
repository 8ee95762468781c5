"""install_as_accelerate(): ``import accelerate`` gives overdrive's modules, version checks pass, undo works,
and the real Accelerate imported first is refused. Each check runs in a fresh interpreter (the alias and
the real package are process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def result_of(code: str) -> dict:
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_table_module_is_the_overdrive_module_of_the_same_path():
    out = result_of("""
        import importlib, importlib.metadata as md, importlib.util, json, sys
        import overdrive
        from overdrive.compat.table import MODULES, ACCELERATE_VERSION, SAME_MODULE
        overdrive.install_as_accelerate()
        overdrive.install_as_accelerate()  # twice is harmless
        same, missing = [], []
        for accelerate_path, overdrive_path in MODULES.items():
            if importlib.util.find_spec(overdrive_path) is None:
                missing.append(overdrive_path)  # a big-model module not landed yet
                continue
            module = importlib.import_module(accelerate_path)
            if accelerate_path == "accelerate":  # the package's view: every name is overdrive's own object
                module = module._target
            same.append(module is importlib.import_module(overdrive_path)
                        and module.__spec__.name == SAME_MODULE.get(overdrive_path, overdrive_path))
        from accelerate.utils import DistributedType
        from overdrive.config import DistributedType as Own
        import accelerate.utils.dataclasses as dataclasses
        print(json.dumps({
            "all_same": all(same), "checked": len(same), "missing": missing,
            "version": md.version("accelerate"), "expected": ACCELERATE_VERSION,
            "dist_name": md.distribution("accelerate").metadata["Name"],
            "top_level": md.packages_distributions().get("accelerate"),
            "same_class": DistributedType is Own and dataclasses.DistributedType is Own,
            "is_overdrive": sys.modules["accelerate"].Accelerator is overdrive.Accelerator
                            and sys.modules["accelerate"].utils is overdrive.utils,
        }))
    """)
    assert out["all_same"] and out["checked"] >= 30, out
    assert set(out["missing"]) <= {f"overdrive.{p}" for p in ("hooks", "big_modeling", "inference", "utils.modeling",
                                                                "utils.offload")}
    assert out["version"] == out["expected"] and out["dist_name"] == "accelerate"
    assert "accelerate" in out["top_level"]
    assert out["same_class"] and out["is_overdrive"]


@pytest.mark.optional
def test_every_table_name_imports_through_the_alias():
    out = result_of("""
        import importlib, json
        import overdrive
        from overdrive.compat.table import MODULES, NAMES
        overdrive.install_as_accelerate()
        by_overdrive_path = {own: theirs for theirs, own in MODULES.items()}
        checked, failed = 0, []
        for own_path, names in NAMES.items():
            module = importlib.import_module(by_overdrive_path[own_path])  # accelerate.<same path>
            for name in names:
                checked += 1
                try:
                    exec(f"from {module.__name__} import {name}", {})
                except Exception as exc:  # noqa: BLE001 - collected and reported
                    failed.append(f"{module.__name__}.{name}: {type(exc).__name__}: {exc}")
        top = importlib.import_module("accelerate")
        for name in overdrive.__all__:
            checked += 1
            if not hasattr(top, name):
                failed.append(f"accelerate.{name}")
        print(json.dumps({"checked": checked, "failed": failed}))
    """)
    assert out["checked"] > 500 and out["failed"] == [], out


@pytest.mark.requires("transformers")
def test_library_version_checks_pass_through_the_alias():
    out = result_of("""
        import json, overdrive
        overdrive.install_as_accelerate()
        from transformers.utils import is_accelerate_available
        from transformers.utils.versions import require_version
        require_version("accelerate>=1.0")
        print(json.dumps({"available": is_accelerate_available(), "new_enough": is_accelerate_available("1.10.1")}))
    """)
    assert out == {"available": True, "new_enough": True}


def test_unknown_accelerate_path_names_the_table():
    proc = run_python("""
        import overdrive
        overdrive.install_as_accelerate()
        import accelerate.no_such_module
    """)
    assert proc.returncode != 0
    assert "ModuleNotFoundError" in proc.stderr and "overdrive.compat.table" in proc.stderr


def test_nothing_changes_without_the_call():
    out = result_of("""
        import json, sys, importlib.util
        import overdrive, overdrive.utils
        from overdrive.utils import is_peft_model  # compat names are there, the alias is not
        print(json.dumps({"aliased": "accelerate" in sys.modules,
                          "finders": [type(f).__name__ for f in sys.meta_path]}))
    """)
    assert not out["aliased"] and "_AccelerateFinder" not in out["finders"]


@pytest.mark.requires("accelerate")
def test_uninstall_gives_back_the_real_package():
    out = result_of("""
        import json, sys, importlib.metadata as md
        import overdrive
        overdrive.install_as_accelerate()
        import accelerate
        aliased = accelerate.Accelerator is overdrive.Accelerator
        overdrive.uninstall_as_accelerate()
        del accelerate
        import accelerate
        print(json.dumps({"aliased": aliased, "real": accelerate.Accelerator is not overdrive.Accelerator
                          and accelerate.__file__.endswith("accelerate/__init__.py"),
                          "version": md.version("accelerate"), "installed": overdrive.compat.alias.is_installed_as_accelerate()}))
    """)
    assert out["aliased"] and out["real"] and not out["installed"]


@pytest.mark.requires("accelerate")
def test_refuses_after_the_real_accelerate_was_imported_and_changes_nothing():
    out = result_of("""
        import json, sys
        import accelerate
        import overdrive
        before = list(sys.meta_path)
        try:
            overdrive.install_as_accelerate()
            error = None
        except overdrive.compat.alias.AccelerateAliasError as exc:
            error = str(exc)
        print(json.dumps({"error": error, "unchanged": sys.meta_path == before,
                          "still_real": sys.modules["accelerate"] is accelerate}))
    """)
    assert out["error"] and "already imported" in out["error"] and "--as_accelerate" in out["error"]
    assert out["unchanged"] and out["still_real"]


@pytest.mark.requires("accelerate")
def test_metadata_under_the_alias_has_the_real_release_fields():
    """sentence-transformers refuses to train unless metadata("accelerate")["Home-page"] names huggingface
    (its util.environment.check_package_availability, repeated here: importing it takes ~40 s)."""
    out = result_of("""
        import importlib.metadata as md, json, overdrive
        def fields(meta):
            return {key: sorted(meta.get_all(key)) for key in set(meta.keys())}
        real = fields(md.metadata("accelerate"))  # read before the alias: importing nothing
        overdrive.install_as_accelerate()
        meta = md.metadata("accelerate")
        ours = fields(meta)
        home = meta["Home-page"]
        print(json.dumps({"real": real, "ours": ours, "st_check": meta["Name"] == "accelerate"
                          and home is not None and "huggingface" in home}))
    """)
    real, ours = out["real"], out["ours"]
    assert out["st_check"]
    # the body says who answers; build-tool fields (Dynamic, License-File) name files overdrive does not ship
    skip = {"Description", "Dynamic", "License-File", "Metadata-Version", "Requires-Dist"}
    assert {k: v for k, v in ours.items() if k not in skip} == {k: v for k, v in real.items() if k not in skip}
    assert ours["Requires-Dist"] == sorted(r for r in real["Requires-Dist"] if "extra ==" not in r)


def test_version_identity_reads_the_followed_release_and_diffusers_hooks_register(tmp_path):
    """diffusers' training examples register their save/load hooks only when
    ``version.parse(accelerate.__version__) >= version.parse("0.16.0")``: under the alias the hooks must run
    (the checkpoint gets the ``unet/`` folder the hook writes, and loading calls the load hook)."""
    out = result_of(f"""
        import importlib.metadata as md, json, os
        import torch
        from packaging import version
        import overdrive
        from overdrive._version import ACCELERATE_API_VERSION, __version__ as own_version
        overdrive.install_as_accelerate()
        import accelerate
        from accelerate import Accelerator
        accelerator = Accelerator()
        model = accelerator.prepare(torch.nn.Linear(2, 2))
        loaded = []
        def save_model_hook(models, weights, output_dir):
            os.makedirs(os.path.join(output_dir, "unet"))
            torch.save(models[0].state_dict(), os.path.join(output_dir, "unet", "weights.pt"))
        def load_model_hook(models, input_dir):
            loaded.append(os.path.isfile(os.path.join(input_dir, "unet", "weights.pt")))
        registered = False
        if version.parse(accelerate.__version__) >= version.parse("0.16.0"):
            accelerator.register_save_state_pre_hook(save_model_hook)
            accelerator.register_load_state_pre_hook(load_model_hook)
            registered = True
        accelerator.save_state({str(tmp_path / "ckpt")!r})
        accelerator.load_state({str(tmp_path / "ckpt")!r})
        print(json.dumps({{"accelerate": accelerate.__version__, "metadata": md.version("accelerate"),
                          "followed": ACCELERATE_API_VERSION, "overdrive": overdrive.__version__, "own": own_version,
                          "registered": registered, "loaded": loaded,
                          "unet": os.path.isfile({str(tmp_path / "ckpt" / "unet" / "weights.pt")!r})}}))
    """)
    assert out["followed"] == "1.16.0"
    assert out["accelerate"] == out["metadata"] == out["followed"]
    assert out["overdrive"] == out["own"] != out["followed"]
    assert out["registered"] and out["unet"] and out["loaded"] == [True]

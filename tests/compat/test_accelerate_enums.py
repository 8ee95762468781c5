"""Accelerate's enums under the alias print, compare and hash as the real Accelerate's: every member of every
enum Accelerate exposes, checked for str / repr / format / == / != / hash / ``in`` against the real package
(each side in its own interpreter: the alias and the real package cannot share one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

# each side lists the enums of these modules and records every behaviour a script can observe
_DUMP = r"""
import enum, importlib, json, sys, warnings
warnings.simplefilter("ignore")
if sys.argv[1] == "alias":
    import overdrive
    overdrive.install_as_accelerate()
MODULES = ("accelerate", "accelerate.utils", "accelerate.utils.dataclasses", "accelerate.commands.to_fsdp2")

def outcome(check):
    try:
        return check()
    except Exception as exc:  # the exception's type is the behaviour
        return f"raises {type(exc).__name__}"

found = {}
for module_name in MODULES:
    module = importlib.import_module(module_name)
    for name in dir(module):
        value = getattr(module, name)
        if isinstance(value, type) and issubclass(value, enum.Enum) and value.__name__ not in found:
            if getattr(value, "__module__", "").split(".")[0] in ("accelerate", "overdrive"):
                found[value.__name__] = value
report = {}
for cls_name, cls in sorted(found.items()):
    members = {}
    for member in cls:
        value, key = member.value, member.name
        members[key] = {
            "value": repr(value), "str": str(member), "repr": repr(member), "format": format(member),
            "fstring": f"{member}", "format_spec": outcome(lambda: format(member, ">20")),
            "eq_value": member == value, "ne_value": member != value, "eq_name": member == key,
            "eq_str_value": member == str(value), "hash_value": hash(member) == hash(value),
            "hash_name": hash(member) == hash(key), "value_in": outcome(lambda: value in cls),
            "str_value_in": outcome(lambda: str(value) in cls), "name_in": outcome(lambda: key in cls),
            "member_in": member in cls, "is_str": isinstance(member, str), "lookup": cls(value) is member,
            "by_name": cls[key] is member, "in_dict": outcome(lambda: {value: 1}.get(member)),
            "sorted": outcome(lambda: [str(m) for m in sorted([member, member])]),
        }
    report[cls_name] = {"members": members, "list": outcome(lambda: cls.list()) if hasattr(cls, "list") else None,
                        "bases": [b.__name__ for b in cls.__mro__[1:]], "repr": repr(cls)}
print(json.dumps(report))
"""


def _dump(side: str) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", _DUMP, side], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: overdrive's own members, after Accelerate's (its JSONL and CSV trackers)
EXTENSIONS = {"LoggerType": {"JSONL": "jsonl", "CSV": "csv"}}


@pytest.mark.requires("accelerate")
def test_every_enum_member_behaves_as_the_real_accelerates():
    real, ours = _dump("real"), _dump("alias")
    for cls, extra in EXTENSIONS.items():  # the extensions follow Accelerate's members, which keep their order
        assert ours[cls]["list"][-len(extra):] == list(extra.values())
        ours[cls]["list"] = ours[cls]["list"][:-len(extra)]
        for member in extra:
            ours[cls]["members"].pop(member)
    assert {"DistributedType", "PrecisionType", "DynamoBackend", "LoggerType", "RNGType"} <= set(real)
    assert sorted(ours) == sorted(real)
    differences = [f"{cls}.{member}.{check}: real {value!r}, overdrive {ours[cls]['members'].get(member, {}).get(check)!r}"
                   for cls, entry in real.items() for member, checks in entry["members"].items()
                   for check, value in checks.items() if ours[cls]["members"].get(member, {}).get(check) != value]
    differences += [f"{cls}.{key}: real {entry[key]!r}, overdrive {ours[cls][key]!r}"
                    for cls, entry in real.items() for key in ("list", "bases", "repr") if ours[cls][key] != entry[key]]
    differences += [f"{cls}: members {sorted(ours[cls]['members'])} != {sorted(entry['members'])}"
                    for cls, entry in real.items() if sorted(ours[cls]["members"]) != sorted(entry["members"])]
    assert differences == []
    assert real["DistributedType"]["members"]["MULTI_CPU"]["str"] == "DistributedType.MULTI_CPU"

"""The launch-settings schema (overdrive/launchers/settings.py) drives the flags, the config file, the
ACCELERATE_* variables (read and exported) and the docs table: one bad value gets one message whichever way
it came in, a setting added to the schema appears everywhere, and the docs table is the schema's."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from overdrive.cli import Parser, UsageError
from overdrive.cli.launch import add_launch_flags, plan_launch
from overdrive.launchers import config_file as cf
from overdrive.launchers import settings as launch_settings
from overdrive.launchers.accelerate_variables import settings_from_environment, variables_for_workers
from overdrive.launchers.setting_kinds import Int
from overdrive.launchers.settings import SETTINGS, Setting, by_name, settings_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    path = tmp_path / "train.py"
    path.write_text("")
    return path


def _parse(argv: list[str], script: Path) -> argparse.Namespace:
    parser = Parser(prog="overdrive launch")
    add_launch_flags(parser)
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs="*")
    return parser.parse_args([*argv, str(script)])


def _after(label: str, problems: list[str]) -> str:
    """The message of the one problem about ``label``, without the label."""
    found = [p.split(f"{label}: ", 1)[1] for p in problems if f"{label}: " in p]
    assert len(found) == 1, (label, problems)
    return found[0]


# (flags that make the setting count, flag, config file key, variable, the bad value)
SAME_MESSAGE = [
    ([], "mixed_precision", "mixed_precision", "ACCELERATE_MIXED_PRECISION", "fp32"),
    ([], "gradient_accumulation_steps", "gradient_accumulation_steps", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "0"),
    ([], "gradient_accumulation_steps", "gradient_accumulation_steps", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "x"),
    ([], "dynamo_backend", "dynamo_config.dynamo_backend", "ACCELERATE_DYNAMO_BACKEND", "indutor"),
    (["--use_fsdp"], "fsdp_offload_params", "fsdp_config.fsdp_offload_params", "FSDP_OFFLOAD_PARAMS", "maybe"),
    (["--use_fsdp"], "fsdp_version", "fsdp_config.fsdp_version", "FSDP_VERSION", "3"),
    (["--use_deepspeed"], "zero_stage", "deepspeed_config.zero_stage", "ACCELERATE_DEEPSPEED_ZERO_STAGE", "5"),
    (["--mixed_precision", "fp8"], "fp8_format", "fp8_config.fp8_format", "ACCELERATE_FP8_FORMAT", "E9M9"),
]


@pytest.mark.parametrize("switch, flag, key, variable, bad", SAME_MESSAGE, ids=lambda v: str(v))
def test_a_bad_value_gets_the_same_message_from_a_flag_a_file_and_a_variable(script, switch, flag, key, variable, bad):
    with pytest.raises(UsageError) as from_flag:
        plan_launch(_parse(["--num_processes", "1", *switch, f"--{flag}", bad], script))
    section, _, inner = key.rpartition(".")
    raw = {section: {inner: bad}} if section else {key: bad}
    with pytest.raises(cf.ConfigError) as from_file:
        cf.validate_config(raw)
    with pytest.raises(ValueError) as from_variable:
        settings_from_environment({variable: bad})
    messages = {_after(f"--{flag}", from_flag.value.problems), _after(key, from_file.value.problems),
                _after(variable, str(from_variable.value).splitlines())}
    assert len(messages) == 1, messages
    assert repr(bad) in messages.pop() or bad in str(from_flag.value)


def test_the_schema_names_each_flag_key_and_variable_once():
    for attribute in ("name", "flag_name", "yaml_key", "env"):
        values = [getattr(s, attribute) for s in SETTINGS if getattr(s, attribute)]
        assert len(values) == len(set(values)), [v for v in values if values.count(v) > 1]
    assert all(s.help for s in SETTINGS if s.flag_name and not s.hidden)


def test_the_docs_table_is_the_schemas():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from launch_settings_table import PAGE, rewritten
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    text = PAGE.read_text()
    assert rewritten(text) == text, ("docs/launch_settings.md is stale: run PYTHONPATH=src .venv/bin/python "
                                     "scripts/launch_settings_table.py")


def test_a_setting_added_to_the_schema_appears_everywhere(script, tmp_path, monkeypatch):
    """ARCHITECTURE.md's recipe: one entry in SETTINGS gives the flag, the config file key, the variable read
    and exported, the worker's launch config and a row of the docs table."""
    from overdrive.launchers.protocol import LAUNCH_CONFIG_VAR
    from overdrive.launchers.torchrun import worker_environ

    toy = Setting("toy_window", Int(minimum=1), "a toy setting", yaml=True, env="ACCELERATE_TOY_WINDOW", flag=True,
                  default=1)
    with pytest.raises(cf.ConfigError, match="unknown key 'toy_window'"):
        cf.validate_config({"toy_window": 3})
    monkeypatch.setattr(launch_settings, "SETTINGS", (*SETTINGS, toy))
    # the flag parser, and the flag's value in the worker's launch config and its variable
    plan, _, _ = plan_launch(_parse(["--num_processes", "1", "--toy_window", "3"], script))
    assert plan.worker_config["toy_window"] == 3
    environ = worker_environ(plan)
    assert environ["ACCELERATE_TOY_WINDOW"] == "3" and json.loads(environ[LAUNCH_CONFIG_VAR])["toy_window"] == 3
    with pytest.raises(UsageError) as info:
        plan_launch(_parse(["--num_processes", "1", "--toy_window", "0"], script))
    assert "--toy_window: 0 must be 1 or more" in info.value.problems
    # the config file
    assert cf.validate_config({"toy_window": "4"}) == {"toy_window": 4}
    path = tmp_path / "toy.yaml"
    path.write_text("toy_window: 5\n")
    plan, _, _ = plan_launch(_parse(["--config_file", str(path), "--num_processes", "1"], script))
    assert plan.worker_config["toy_window"] == 5
    # the variables, read and exported
    assert settings_from_environment({"ACCELERATE_TOY_WINDOW": "6"}) == {"toy_window": 6}
    assert variables_for_workers({"toy_window": 7}) == {"ACCELERATE_TOY_WINDOW": "7"}
    # the docs table
    assert "| `toy_window` | `--toy_window` | `toy_window` | `ACCELERATE_TOY_WINDOW` | integer >= 1 | `1` |" \
        in settings_table()
    assert by_name()["toy_window"] is toy


def test_a_bad_answer_to_a_question_gets_the_flags_message(monkeypatch, capsys):
    """``overdrive config``'s questions check answers with the setting's kind: the message is the flag's."""
    from overdrive.cli.config_cmd import Asker, questionnaire

    # multi-CPU, "0" machines (refused, asked again), 1 machine, 2 processes, no compile, no mixed precision
    answers = iter(["1", "0", "1", "2", "n", "no"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    config = questionnaire(Asker(), "cpu", 0)
    assert config["num_machines"] == 1 and config["num_processes"] == 2
    flag = by_name()["num_machines"].check("--num_machines", "0")[1]
    assert flag is not None and flag.replace("--", "") in capsys.readouterr().out

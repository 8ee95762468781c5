"""Bad config inputs end in one clear message (which file, what is wrong, what to do), never a traceback."""

from __future__ import annotations

import json

import pytest

from overdrive.launchers import config_file as cf
from tests.faults.faultkit import clean_env, overdrive

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n" for prev, name in zip("abcdefgh", "bcdefghi"))


def test_config_that_is_not_utf8_is_refused_with_the_offset(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"num_processes: 2\n\xb6\x01\xff garbage")
    with pytest.raises(cf.ConfigError, match=r"is not UTF-8 text \(byte 0xb6 at offset 17"):
        cf.load_config(path)


def test_utf16_config_with_a_byte_order_mark_reads_like_utf8(tmp_path):
    utf8, utf16 = tmp_path / "a.yaml", tmp_path / "b.yaml"
    utf8.write_text("num_processes: 2\nmixed_precision: bf16\n", encoding="utf-8")
    utf16.write_text("num_processes: 2\nmixed_precision: bf16\n", encoding="utf-16")  # with its BOM
    assert cf.load_config(utf16) == cf.load_config(utf8)


def test_yaml_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)  # 10**9 values once expanded
    with pytest.raises(cf.ConfigError, match="aliases expand to more than 100,000 values"):
        cf.load_config(path)
    small = tmp_path / "ok.yaml"  # a few aliases, as people use them, still work
    small.write_text("fsdp_config: &f {fsdp_version: 2}\nnum_processes: 2\n")
    assert cf.load_config(small)["num_processes"] == 2


@pytest.mark.parametrize("name, text, message", [
    ("dup.yaml", "num_processes: 2\nmixed_precision: bf16\nnum_processes: 4\n",
     "the key 'num_processes' appears twice in one mapping (lines 1 and 3)"),
    ("dup.json", '{"num_processes": 2, "num_processes": 4}', "the key 'num_processes' appears twice"),
])
def test_duplicate_keys_take_the_last_value_with_a_warning(tmp_path, name, text, message):
    """As Accelerate (PyYAML, json): the last value wins; overdrive says which key, on which lines."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.warns(UserWarning) as caught:
        config = cf.load_config(path)
    assert config["num_processes"] == 4
    text = str(caught[0].message)
    assert message in text and str(path) in text and "last value" in text


@pytest.mark.timeout(60)
def test_cli_reports_bad_inputs_without_tracebacks(tmp_path):
    env = clean_env(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    unwritable = overdrive("config", "default", "--config_file", str(blocker / "c.yaml"), env=env)
    assert unwritable.returncode == 2 and "Traceback" not in unwritable.stderr
    assert f"config file {blocker / 'c.yaml'}: cannot be written" in unwritable.stderr
    assert "choose a path you can write with --config_file" in unwritable.stderr

    no_script = overdrive("launch", "--cpu", env=env, cwd=tmp_path)
    assert no_script.returncode == 2 and "no training script given" in no_script.stderr
    assert "training_script_args" not in no_script.stderr

    binary = tmp_path / "metrics.jsonl"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    plot = overdrive("plot", str(binary), "--no-png", env=env)
    assert plot.returncode == 1 and "Traceback" not in plot.stderr
    assert f"{binary} is not a metrics file: it is not UTF-8 text" in plot.stderr

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    launch = overdrive("launch", "--config_file", str(bomb), "x.py", env=env, cwd=tmp_path)
    assert launch.returncode == 2 and "alias bomb" in launch.stderr and "Traceback" not in launch.stderr


def test_json_records_that_are_not_objects_name_the_line(tmp_path):
    from overdrive.tracking.jsonl import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0, "loss": 1.0}) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a metrics record"):
        read_metrics(path)



@pytest.mark.parametrize("how", ["dynamo_backend", "dynamo_plugin"])
def test_unknown_dynamo_backend_is_refused_when_the_accelerator_is_built(how):
    from overdrive import Accelerator
    from overdrive.utils import TorchDynamoPlugin

    kwargs = {"dynamo_backend": "nosuch"} if how == "dynamo_backend" else {
        "dynamo_plugin": TorchDynamoPlugin(backend="nosuch")}
    # refused at construction (not at prepare()), naming the value and the valid choices
    with pytest.raises(ValueError, match=r"backend='nosuch'.*choose from.*inductor"):
        Accelerator(**kwargs)


@pytest.mark.timeout(120)
def test_a_config_from_the_environment_that_is_not_utf8_is_named(tmp_path):
    # given through $OVERDRIVE_CONFIG_FILE, not --config_file: every command that reads it names the file, also
    # when the file's own name is not UTF-8 (shown with \xe9 escapes, as its bytes read)
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    for name in (b"latin.yaml", b"caf\xe9.yaml"):
        path = tmp_path / name.decode("utf-8", "surrogateescape")
        path.write_bytes(b"num_processes: 1\n# caf\xe9\n")
        env = clean_env(tmp_path, OVERDRIVE_CONFIG_FILE=str(path))
        shown = str(tmp_path / name.decode("utf-8", "backslashreplace"))
        expected = f"config file {shown}: is not UTF-8 text (byte 0xe9 at offset 22"
        for command in (("launch", str(script)), ("env",), ("doctor",)):
            result = overdrive(*command, env=env, cwd=tmp_path)
            assert expected in result.stderr + result.stdout, (command, result.stdout, result.stderr)
            assert "Traceback" not in result.stderr and "trained" not in result.stdout, command

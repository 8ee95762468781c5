"""What a new user meets in the first hour: ``overdrive --version``, ``doctor``, ``env``, ``config`` at the end of
its input, ``merge-weights`` and ``to-fsdp2`` on mistakes, and the help texts."""

from __future__ import annotations

import torch

import overdrive as package
from overdrive.compat.table import ACCELERATE_VERSION
from tests.support.cli import clean_env, overdrive


def test_version_names_overdrive_the_accelerate_api_and_torch(tmp_path):
    expected = f"overdrive {package.__version__} (Accelerate API {ACCELERATE_VERSION}, torch {torch.__version__})"
    for flag in ("--version", "-V"):
        result = overdrive(flag, env=clean_env(tmp_path))
        assert (result.returncode, result.stdout.strip(), result.stderr) == (0, expected, "")
    assert "--version" in overdrive("--help", env=clean_env(tmp_path)).stdout


def test_env_reports_what_accelerates_does_and_the_libraries(tmp_path):
    import subprocess
    import sys
    from importlib import metadata

    ours = overdrive("env", env=clean_env(tmp_path)).stdout
    theirs = subprocess.run([sys.executable, "-m", "accelerate.commands.accelerate_cli", "env"], capture_output=True,
                            text=True, timeout=120, env=clean_env(tmp_path)).stdout
    ram = next(line for line in theirs.splitlines() if line.startswith("- System RAM:"))
    assert f"- System RAM: {ram.split()[-2]} GiB (" in ours  # the same figure as Accelerate's (it says GB)
    for theirs_line, ours_line in (("- Platform:", "- Platform:"), ("- Python version:", "- Python version:"),
                                   ("- Numpy version:", "- numpy version:"), ("- PyTorch version:", "- PyTorch version:"),
                                   ("bash location", "- `overdrive` command:"), ("default config", "- Config file:")):
        assert theirs_line in theirs and ours_line in ours
    for name in ("transformers", "deepspeed", "torchao", "safetensors", "accelerate"):
        assert f"{name} {metadata.version(name)}" in ours


def test_config_at_the_end_of_its_input_writes_nothing(tmp_path):
    target = tmp_path / "asked.yaml"
    for answers in ("", "1\n\n"):  # no answer at all; the input ends half-way (Ctrl-D, a short pipe)
        result = overdrive("config", "--config_file", str(target), env=clean_env(tmp_path), stdin=answers)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "overdrive config: error: the input ended before an answer to " in result.stderr
        assert "nothing was written" in result.stderr and not target.exists()


def test_to_fsdp2_names_every_key_it_drops_or_changes(tmp_path):
    import yaml

    from overdrive.cli.to_fsdp2_cmd import convert

    fsdp1 = {"fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_forward_prefetch": False, "fsdp_sync_module_states": True,
             "fsdp_use_orig_params": True, "fsdp_sharding_strategy": "FULL_SHARD",
             "fsdp_reshard_after_forward": "SHARD_GRAD_OP", "fsdp_version": 1, "fsdp_offload_params": False}
    converted, notes = convert({"distributed_type": "FSDP", "fsdp_config": dict(fsdp1)})
    kept = converted["fsdp_config"]
    assert kept == {"fsdp_reshard_after_forward": False, "fsdp_offload_params": False, "fsdp_version": 2}
    for key, value in fsdp1.items():  # every input key is kept as it was, or a note names it
        assert kept.get(key) == value or any(note.startswith((f"dropped {key}:", f"{key}:")) for note in notes), key
    assert "dropped fsdp_sharding_strategy: FULL_SHARD (fsdp_reshard_after_forward: SHARD_GRAD_OP was given too" \
        in "\n".join(notes)
    source, target = tmp_path / "fsdp1.yaml", tmp_path / "fsdp2.yaml"
    source.write_text(yaml.safe_dump({"fsdp_config": fsdp1}))
    result = overdrive("to-fsdp2", "--config_file", str(source), "--output_file", str(target), env=clean_env(tmp_path))
    assert result.returncode == 0 and all(f"overdrive to-fsdp2: {note}" in result.stderr for note in notes)


def test_help_texts_are_plain_and_an_unknown_flag_leads_with_the_hint(tmp_path):
    import subprocess
    import sys

    names = ["launch", "config", "env", "test", "estimate-memory", "doctor", "to-fsdp2", "tpu-config", "plot",
             "merge-weights"]
    # one process for every --help (each would import the CLI again)
    script = ("import contextlib, io, sys\nfrom overdrive.cli import main\n"
              f"for name in {names!r}:\n"
              "    out = io.StringIO()\n"
              "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
              "        main([name, '--help'])\n"
              "    print('=====', name, len(out.getvalue()), out.getvalue().count('``'))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    counts = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("=====")]
    assert [name for name, _, _ in counts] == names, result.stderr
    assert all(int(size) > 100 and ticks == "0" for _, size, ticks in counts), counts
    typo = overdrive("launch", "--num_proceses", "2", "train.py", env=clean_env(tmp_path))
    lines = typo.stderr.splitlines()
    assert typo.returncode == 2 and len(lines) <= 2, typo.stderr
    assert lines[0].startswith("overdrive launch: error: '--num_proceses' is not a flag of 'overdrive launch' "
                               "(did you mean --num_processes?)")

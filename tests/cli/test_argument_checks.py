"""Arguments are checked before torch is imported, missing optional packages are refused before any worker
starts, and a value outside the choices gets one message format everywhere with a hint that matches intent.
(How fast a refusal is: bench/arg_check_time.py, a figure, not a timed test.)"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from overdrive import Accelerator, notebook_launcher
from overdrive.launchers import config_file as cf
from overdrive.launchers.settings import by_name
from tests.support.cli import clean_env

# runs `overdrive ARGS` in-process and says afterwards whether torch was imported
_PROBE = ("import sys; from overdrive.cli import main; code = main(sys.argv[1:]); "
          "print('TORCH', 'torch' in sys.modules); sys.exit(code)")
# the same with a package made unimportable, as in an environment without it (None in sys.modules is Python's
# own mark for a module that cannot be imported: find_spec answers None, import raises ImportError)
_WITHOUT = ("import sys; sys.modules[sys.argv[1]] = None; from overdrive.cli import main; code = main(sys.argv[2:]); "
            "print('TORCH', 'torch' in sys.modules); sys.exit(code)")


def _launch(tmp_path, *args, without: str | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "train.py").write_text("print('WORKER STARTED')\n")
    command = [sys.executable, "-c", _PROBE] if without is None else [sys.executable, "-c", _WITHOUT, without]
    return subprocess.run([*command, "launch", *args, "train.py"], cwd=tmp_path, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--num_processes", "0"], "--num_processes: 0 must be 1 or more"),
    (["--mixed_precision", "fp32"], "--mixed_precision: 'fp32' is not valid; choose from no, fp16, bf16, fp8 "
                                     "(did you mean 'no'?)"),
    (["--use_deepspeed", "--zero_stage", "5"], "zero_stage=5 is not valid"),
    (["--num_machines", "2", "--num_processes", "2"], "needs --main_process_ip"),
])
def test_a_bad_value_is_refused_before_torch_is_imported(tmp_path, args, message):
    result = _launch(tmp_path, *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "TORCH False" in result.stdout


@pytest.mark.parametrize("package, args, message", [
    ("deepspeed", ["--use_deepspeed", "--num_processes", "2"], "DeepSpeed is not installed: pip install deepspeed"),
    ("torchao", ["--mixed_precision", "fp8", "--num_processes", "2"], "mixed_precision 'fp8' needs torchao"),
])
def test_a_missing_optional_package_is_refused_before_any_worker_starts(tmp_path, package, args, message):
    result = _launch(tmp_path, *args, without=package)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "WORKER STARTED" not in result.stdout and "starting" not in result.stderr
    assert "TORCH False" in result.stdout


def test_one_format_and_the_intended_hint_everywhere(tmp_path):
    expected = "'fp32' is not valid; choose from no, fp16, bf16, fp8 (did you mean 'no'?)"
    with pytest.raises(ValueError) as python_api:
        Accelerator(mixed_precision="fp32")
    with pytest.raises(ValueError) as notebook:
        notebook_launcher(print, num_processes=2, mixed_precision="fp32")
    path = tmp_path / "c.yaml"
    path.write_text("mixed_precision: fp32\n")
    with pytest.raises(cf.ConfigError) as config_file:
        cf.load_config(path)
    for error in (python_api, notebook, config_file):
        assert expected in str(error.value), str(error.value)
    precision = by_name()["mixed_precision"]
    assert "(did you mean 'bf16'?)" in precision.check("--mixed_precision", "bfloat16")[1]
    assert "(did you mean 'fp8'?)" in precision.check("--mixed_precision", "fp9")[1]  # spelling


def test_no_message_in_the_package_uses_another_format_for_choices():
    from pathlib import Path

    import overdrive

    root = Path(overdrive.__file__).parent
    old = [f"{path.relative_to(root)}:{number}" for path in root.rglob("*.py")
           for number, line in enumerate(path.read_text().splitlines(), 1)
           if "choose one of" in line or "is not one of" in line]
    assert old == [], "use overdrive.config.choices.invalid_choice: " + ", ".join(old)


@pytest.mark.parametrize("script, script_args, message", [
    ("print('WORKER STARTED')\n", ["--log_with", "wandb"], "the 'wandb' tracker (script argument --log_with wandb)"),
    ("print('WORKER STARTED')\n", ["--report_to=tensorboard,wandb"], "the 'wandb' tracker (script argument"),
])
def test_a_missing_tracker_package_is_refused_before_any_worker_starts(tmp_path, script, script_args, message):
    (tmp_path / "train.py").write_text(script)
    result = subprocess.run([sys.executable, "-c", _WITHOUT, "wandb", "launch", "--num_processes", "2", "train.py",
                             *script_args], cwd=tmp_path, env=clean_env(tmp_path), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "pip install wandb" in result.stderr
    assert "WORKER STARTED" not in result.stdout and "starting" not in result.stderr
    assert "TORCH False" in result.stdout


def test_a_tracker_named_in_code_the_run_never_reaches_is_a_warning_and_the_script_starts(tmp_path):
    """``accelerate launch`` starts a script whose ``log_with="wandb"`` sits in a function it never calls (and
    so does overdrive's): the launcher guesses from the source, so it warns in one line and starts the script."""
    (tmp_path / "train.py").write_text("from overdrive import Accelerator\n\n\ndef tracked():\n"
                                       "    return Accelerator(log_with=['csv', 'wandb'])\n\n\n"
                                       "print('WORKER STARTED')\n")
    result = subprocess.run([sys.executable, "-c", _WITHOUT, "wandb", "launch", "--num_processes", "1", "train.py"],
                            cwd=tmp_path, env=clean_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "WORKER STARTED" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if "tracker" in line]
    assert warnings == ["overdrive launch: warning: the 'wandb' tracker (log_with='wandb' in train.py line 5) needs "
                        "the 'wandb' package, which is not installed: pip install wandb; or choose another tracker "
                        "(the script starts: the line may not run)"], result.stderr


def test_trackers_the_script_may_not_ask_for_are_not_refused():
    """A tracker named in a branch, an installed one, "all" or a name the script gives its own meaning: no refusal
    (the workers decide); the argument forms are read as the scripts' parsers read them."""
    from overdrive.cli.launch_trackers import _from_arguments, tracker_problems

    source = ("import sys\nfrom overdrive import Accelerator\nif '--track' in sys.argv:\n"
              "    Accelerator(log_with='wandb')\nAccelerator(log_with='wandb' if sys.argv[1:] else None)\n"
              "Accelerator(log_with=['csv', 'all'])\n")
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "train.py"
        script.write_text(source)
        assert tracker_problems(str(script), ["--log_with", "all", "--report_to", "my_own_logger"]) == ([], [])
        assert tracker_problems(str(script), ["--log_with", "csv", "jsonl", "--lr", "1"]) == ([], [])
    names = [name for name, _ in _from_arguments(["--log_with", "csv", "wandb", "--lr", "3", "--report_to=a,b"])]
    assert names == ["csv", "wandb", "a", "b"]


def test_python_api_mistakes_get_the_suggestion_the_command_line_gives():
    with pytest.raises(TypeError) as misspelled:
        Accelerator(mixed_precison="bf16")
    assert str(misspelled.value) == ("Accelerator() got unexpected arguments ['mixed_precison'] "
                                     "(did you mean 'mixed_precision'?)")
    with pytest.raises(TypeError) as two:
        Accelerator(gradient_acumulation_steps=2, colour="red")
    assert str(two.value).endswith(": 'colour', 'gradient_acumulation_steps' (did you mean "
                                   "'gradient_accumulation_steps'?)"), str(two.value)
    with pytest.raises(ValueError) as tracker:
        Accelerator(log_with="tensorbord")
    assert "unknown tracker 'tensorbord'; valid trackers: [" in str(tracker.value)
    assert str(tracker.value).endswith("(did you mean 'tensorboard'?)"), str(tracker.value)

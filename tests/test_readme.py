"""Every code block in the README runs as written: Python blocks in a fresh process, and the
`overdrive ...` commands of the shell blocks as a user types them (the first block's setup scripts are
what CI itself runs)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
SHELL_BLOCKS = re.findall(r"```bash\n(.*?)```", TEXT, flags=re.S)
COMMANDS = [line.split("  #")[0].strip() for block in SHELL_BLOCKS[1:] for line in block.splitlines()
            if line.strip().startswith("overdrive ")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs(index, tmp_path):
    script = tmp_path / f"block_{index}.py"
    script.write_text(PYTHON_BLOCKS[index])
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=110,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs(command):
    env = {**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=230,
                            cwd=README.parent, env=env)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    # and quietly: no warning repeated by every rank (DTensor's redistribution notes once printed 4 times by
    # the tensor-parallel run; this run is also the test of that, tests/launchers/test_quiet_output.py)
    assert "While redistributing" not in result.stderr and "_NormPartial" not in result.stderr, result.stderr[-3000:]


def test_readme_opens_with_the_two_commands():
    commands = [line.split("#")[0].strip() for line in SHELL_BLOCKS[0].splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for command in commands:
        assert (README.parent / command.split()[1]).exists()
    assert len(COMMANDS) >= 2


def test_readme_is_a_short_tour():
    # a tour of at most 250 lines (it once grew to 581, a third of it figures): what, why, install, the four
    # lines, the commands and where to read on; the details live in docs/, every page linked from its list
    lines = TEXT.splitlines()
    assert len(lines) <= 250, len(lines)
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[-1] == "## Where to read on"
    pages = sorted(path.name for path in (README.parent / "docs").glob("*.md"))
    reading_list = TEXT.split("## Where to read on", 1)[1]
    assert [page for page in pages if f"(docs/{page})" not in reading_list] == []

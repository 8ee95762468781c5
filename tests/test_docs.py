"""Every code block of the README and docs/ is run as written, or marked as a fragment with the reason; every
page of docs/ is linked from the README; no page uses the project's internal words.

A fenced block right after a line ``*Fragment: why*`` (an italic note a reader sees on the rendered page) is not
run. Otherwise a ``python`` block runs in a fresh interpreter in an empty folder (here for docs/, in
tests/test_readme.py for the README, which also runs the ``overdrive ...`` lines of the README's ``bash``
blocks). Any other block must be marked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
FRAGMENT = re.compile(r"^\*Fragment: [^*]+\*$")
#: words of the project's own organisation, meaningless to a reader: issue numbers, who did what
INTERNAL = re.compile(r"\bissues? ?[-#]? ?\d+|\barch-core\b|\bhelper's\b|\bspeed helper|\bsurface work\b|\bfrom the issue\b",
                      flags=re.I)
TEST_NAMES = {name for path in (ROOT / "tests").rglob("test_*.py")
              for name in re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), flags=re.M)}


def blocks(page: Path) -> list[tuple[int, str, str, bool]]:
    """(line, language, text, marked as a fragment) of every fenced block of ``page``."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().splitlines()
        fragment = bool(before) and FRAGMENT.match(before[-1]) is not None
        found.append((text[:match.start()].count("\n") + 1, match.group(1), match.group(2), fragment))
    return found


def _runnable(page: Path, language: str, text: str) -> bool:
    return language == "python" or (page.name == "README.md" and language == "bash" and any(
        line.strip().startswith("overdrive ") for line in text.splitlines()))


DOC_PYTHON = [pytest.param(text, id=f"{page.name}:{line}") for page in PAGES[1:]
              for line, language, text, fragment in blocks(page) if language == "python" and not fragment]


def test_every_block_runs_or_is_marked_as_a_fragment():
    unmarked = [f"{page.relative_to(ROOT)}:{line} ({language or 'no language'})" for page in PAGES
                for line, language, text, fragment in blocks(page) if not fragment and not _runnable(page, language, text)]
    assert unmarked == [], "run these in a test or mark them <!-- fragment: why -->: " + ", ".join(unmarked)
    assert len(DOC_PYTHON) >= 4  # the docs' runnable examples are collected


def test_every_doc_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    unlinked = [page.name for page in PAGES[1:] if f"(docs/{page.name}" not in readme]
    assert unlinked == []


def test_fragment_notes_are_visible():
    # an HTML comment marked fragments once: invisible on the rendered page, so a reader took them for programs
    hidden = [f"{page.relative_to(ROOT)}:{i + 1}" for page in PAGES
              for i, line in enumerate(page.read_text().splitlines()) if line.startswith("<!-- fragment")]
    assert hidden == []
    assert sum(fragment for page in PAGES for *_, fragment in blocks(page)) >= 40


def test_no_page_uses_internal_words():
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            words = [m.group(0) for m in INTERNAL.finditer(line)]
            words += [name for name in re.findall(r"\btest_\w+", line) if name in TEST_NAMES]
            found += [f"{page.relative_to(ROOT)}:{number}: {word}" for word in words]
    assert found == [], "internal words (issue numbers, helpers, test names) on pages:\n" + "\n".join(found)
    assert len(TEST_NAMES) > 500  # the tests' names were read


def _program_flags() -> set[str]:
    """Every flag of an overdrive command, and the flags the repository's own programs (bench/, scripts/, the
    self-parsing commands) define."""
    from overdrive.cli import _flags, build_parser

    parser, _ = build_parser()
    flags = set(_flags(parser))
    for path in [*ROOT.glob("bench/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("src/overdrive/cli/*.py"),
                 *ROOT.glob("tests/scripts/*.py")]:
        flags |= set(re.findall(r"[\"'](--[\w-]+)[\"']", path.read_text()))
    return flags


#: flags the pages name that belong to other programs
OTHER_PROGRAMS = {"--nnodes": "torchrun", "--redirects": "torchrun", "--log_with": "accelerate launch",
                  "--report_to": "transformers", "--name": "a placeholder", "--name-with-dashes": "a placeholder"}


def test_every_launch_flag_the_pages_use_exists():
    # docs/machines.md once passed --rdzv_id, which the launcher refuses: each `overdrive launch` command's flags,
    # and every flag a page names, must be the launcher's (or another real program's)
    from overdrive.cli import _flags, build_parser

    _, commands = build_parser("launch")
    launch = set(_flags(commands["launch"]))
    known = _program_flags()
    wrong = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"overdrive launch([^\n`]*)", text):
            for token in match.group(1).split():
                if token.endswith(".py") or token in ("-m", "SCRIPT", "..."):
                    break
                flag = token.split("=")[0].rstrip(":,;.)")
                if flag.startswith("--") and flag not in launch:
                    wrong.append(f"{page.name}: overdrive launch {flag}")
        for flag in re.findall(r"`(--[\w-]+)(?![\w*{])", text):
            if flag not in known and flag not in OTHER_PROGRAMS:
                wrong.append(f"{page.name}: {flag}")
    assert wrong == []
    assert {"--num_processes", "--max_restarts", "--rdzv_backend", "--as_accelerate"} <= launch


@pytest.mark.timeout(180)
@pytest.mark.parametrize("text", DOC_PYTHON)
def test_doc_python_block_runs(text, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(text)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=170,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


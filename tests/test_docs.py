"""Every code block of the README and docs/ is run as written, or marked as a fragment with the reason, and
every page of docs/ is linked from the README.

A fenced block preceded by ``<!-- fragment: why -->`` is not run. Otherwise a ``python`` block runs in a fresh
interpreter in an empty folder (here for docs/, in tests/test_readme.py for the README, which also runs the
``overdrive ...`` lines of the README's ``bash`` blocks). Any other block must be marked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)


def blocks(page: Path) -> list[tuple[int, str, str, bool]]:
    """(line, language, text, marked as a fragment) of every fenced block of ``page``."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().splitlines()
        fragment = bool(before) and before[-1].startswith("<!-- fragment")
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


@pytest.mark.timeout(180)
@pytest.mark.parametrize("text", DOC_PYTHON)
def test_doc_python_block_runs(text, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(text)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=170,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


"""Rewrite the table of docs/launch_settings.md from the launch-settings schema, launchers/settings.py
(tests/launchers/test_settings.py fails while the page is stale).

    PYTHONPATH=src .venv/bin/python scripts/launch_settings_table.py
"""

from __future__ import annotations

from pathlib import Path

from overdrive.launchers.settings import settings_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "launch_settings.md"
BEGIN, END = "<!-- table: generated from overdrive/launchers/settings.py -->", "<!-- end of table -->"


def rewritten(text: str) -> str:
    """``text`` (the page) with the table between the markers replaced by the schema's."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{settings_table()}{END}{tail}"


if __name__ == "__main__":
    PAGE.write_text(rewritten(PAGE.read_text()))
    print(f"rewrote {PAGE}")

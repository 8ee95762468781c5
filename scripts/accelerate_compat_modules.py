"""Write (or with --check, verify) the thin re-export modules listed in overdrive.compat.table.

    python scripts/accelerate_compat_modules.py          # write them
    python scripts/accelerate_compat_modules.py --check  # exit 1 listing any that differ
"""

from __future__ import annotations

import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
TEMPLATE = '''"""``{accelerate}`` under overdrive: names re-exported from overdrive's own modules.

Generated from overdrive.compat.table by scripts/accelerate_compat_modules.py; edit the table, not this file.
"""

from overdrive.compat.reexport import exports

__getattr__, __dir__, __all__ = exports(__name__)
'''
PACKAGES = ("overdrive.commands", "overdrive.commands.config", "overdrive.test_utils")


def expected() -> dict[Path, str]:
    sys.path.insert(0, str(SRC))
    from overdrive.compat.table import NAMES

    files = {}
    for module in NAMES:
        if module in ("overdrive", "overdrive.utils"):
            continue  # real packages that consult the table for their extra names
        parts = module.split(".")
        path = SRC.joinpath(*parts, "__init__.py") if module in PACKAGES else SRC.joinpath(*parts[:-1], parts[-1] + ".py")
        files[path] = TEMPLATE.format(accelerate="accelerate" + module[len("overdrive"):])
    return files


def main(argv: list[str]) -> int:
    stale = []
    for path, text in expected().items():
        if path.is_file() and path.read_text() == text:
            continue
        if "--check" in argv:
            stale.append(str(path.relative_to(SRC.parent)))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(SRC.parent)}")
    if stale:
        print("out of date (run python scripts/accelerate_compat_modules.py):\n  " + "\n  ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

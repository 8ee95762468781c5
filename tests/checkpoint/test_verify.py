"""Verification of a checkpoint's files against the manifest when a file changes while it is read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import os, sys, zlib
from pathlib import Path
from overdrive.checkpoint import storage

folder = Path(sys.argv[1])
path = folder / "__0_0.distcp"
data = os.urandom(48 << 20)
path.write_bytes(data)
manifest = {"world_size": 1, "files": {path.name: {"size": len(data), "crc32": f"{zlib.crc32(data):08x}", "rank": 0}}}


class CutAfterFirstPiece:  # zlib, except that another process truncates the file once reading has begun
    cut = False

    @staticmethod
    def crc32(data, value=0):
        if not CutAfterFirstPiece.cut:
            CutAfterFirstPiece.cut = True
            os.truncate(path, 1 << 20)
        return zlib.crc32(data, value)


storage.zlib = CutAfterFirstPiece
print("PROBLEMS", storage.verify_files(folder, manifest, [path.name, path.name]), flush=True)
"""


def test_a_file_truncated_while_its_checksum_is_computed_is_reported_not_a_crash(tmp_path: Path) -> None:
    """A file mapped into memory and cut short by another process kills the reader with SIGBUS when it
    touches the lost pages; verification must report the file as truncated instead."""
    script = tmp_path / "cut.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the verifying process died (status {done.returncode}): {done.stderr[-2000:]}"
    assert "is 1048576 bytes but the manifest says 50331648" in done.stdout and "truncated" in done.stdout, done.stdout

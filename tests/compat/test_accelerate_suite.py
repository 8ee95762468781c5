"""Accelerate's own test suite as the conformance suite, its fast part (``scripts/accelerate_suite.py --ci``):
every test of those files that passes under the real Accelerate (tests/compat/accelerate_suite_reference.txt)
passes under overdrive's alias, except the ones listed in tests/compat/accelerate_suite_known.txt with their
reason, and no listed test passes (the list only shrinks). The whole suite: see the README."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import accelerate_suite  # noqa: E402  (scripts/ is no package)


def test_known_list_is_well_formed_and_lists_only_reference_tests():
    known = accelerate_suite.read_known()
    reference = accelerate_suite.read_reference()
    assert known, "the known list is empty: then --check alone is the whole story, and this test can go"
    assert not sorted(set(known) - reference)  # a listed test must pass under the real Accelerate
    assert all(reason.split(":")[0] in ("deliberate", "gap", "unstable") and len(reason) > 12 for reason in known.values())
    # what --ci leaves to the whole-suite runs passes under the real Accelerate, in the files --ci runs
    assert set(accelerate_suite.CI_LEFT_OUT) <= reference
    assert {test.split("::")[0] for test in accelerate_suite.CI_LEFT_OUT} <= {f"tests/{f}" for f in accelerate_suite.CI_FILES}


@pytest.mark.optional  # the sdist from the package registry, parameterized
@pytest.mark.multiprocess
@pytest.mark.slow  # ~60 s on 2 cores
@pytest.mark.timeout(900)
def test_accelerate_suite_fast_files_pass_under_overdrive(tmp_path):
    cache = ROOT / ".cache" / "accelerate_suite"
    try:
        accelerate_suite.fetch(cache)
    except subprocess.CalledProcessError as error:
        pytest.skip(f"the accelerate=={accelerate_suite.VERSION} sdist could not be downloaded: {error}")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "accelerate_suite.py"), "--ci", "--cache", str(cache)],
                          capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "ratchet: holds" in done.stdout

"""Accelerate's own test suite as overdrive's conformance suite.

Fetches the ``accelerate==1.16.0`` sdist from the package registry (``pip download``, cached in
``.cache/accelerate_suite``), and runs its ``tests/`` with pytest once under the real Accelerate and once
under overdrive's alias (``overdrive.install_as_accelerate()``), in this environment. On both sides
``accelerate.test_utils`` is the sdist's own (so the scripts its tests launch, test_script.py, test_sync.py,
..., are Accelerate's), and every Python process the tests start (``accelerate launch``, ``torchrun``,
``debug_launcher``) gets the same ``accelerate``: ``scripts/accelerate_suite_site/sitecustomize.py`` is
first on PYTHONPATH. On the overdrive side an ``accelerate`` command first on PATH runs overdrive's CLI.

Prints a per-file table (tests passed under each) and every test that passes under Accelerate and not
under overdrive. The ratchet:

- ``tests/compat/accelerate_suite_reference.txt``: the tests that pass under the real Accelerate on a CPU
  machine (written by ``--record``), so a check only has to run the overdrive side;
- ``tests/compat/accelerate_suite_known.txt``: the tests that may fail under overdrive, each with its
  reason: deliberate differences and not-yet-fixed gaps;
- ``--check`` fails when a reference test fails under overdrive and is not listed, and when a listed test
  passes (the list only shrinks).

Usage::

    python scripts/accelerate_suite.py                       # whole suite, both sides (~25 min on 2 cores)
    python scripts/accelerate_suite.py --side overdrive --check   # whole suite, overdrive side, the ratchet
    python scripts/accelerate_suite.py --ci                  # the fast files CI runs (overdrive side, --check,
                                                             # in one pytest process: --together)
    python scripts/accelerate_suite.py --record              # refresh the reference from the real Accelerate
    python scripts/accelerate_suite.py --files test_utils.py --side both
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = "1.16.0"
SITE = ROOT / "scripts" / "accelerate_suite_site"
REFERENCE = ROOT / "tests" / "compat" / "accelerate_suite_reference.txt"
KNOWN = ROOT / "tests" / "compat" / "accelerate_suite_known.txt"
SIDES = ("accelerate", "overdrive")
#: the files CI runs (overdrive side only, in one pytest process): the quick ones (60 s on 2 shared cores at load
#: 9), covering the utilities, dataclasses, kwargs handlers, logging, memory, imports, compile, optimizer and
#: checkpointing
CI_FILES = ("test_dataclasses.py", "test_logging.py", "test_utils.py", "test_memory_utils.py",
            "test_kwargs_handlers.py", "test_imports.py", "test_compile.py", "test_multidevice.py",
            "test_optimizer.py", "test_activation_checkpointing_offload.py", "test_state_checkpointing.py")
#: tests of those files that --ci leaves to the whole-suite runs, with why: they check the sdist's own test
#: helper (``execute_subprocess_async``, loaded from the sdist on both sides) on commands that never import
#: accelerate, and each waits out the helper's fixed 10 s timeout (20 of the subset's ~55 s)
CI_LEFT_OUT = {
    "tests/test_utils.py::ExecuteSubprocessAsyncTester::test_timeout_stops_torchrun_workers":
        "Accelerate's test helper stopping a torchrun of a sleeping script after its 10 s timeout",
    "tests/test_utils.py::ExecuteSubprocessAsyncTester::test_timeout_stops_single_process_launch":
        "Accelerate's test helper stopping a Python launcher of a sleeping script after its 10 s timeout",
}


def fetch(cache: Path, version: str = VERSION) -> Path:
    """The extracted sdist of ``accelerate==version`` (tests/ and src/accelerate/test_utils), downloaded once
    into ``cache``."""
    tree = cache / f"accelerate-{version}"
    if (tree / "tests").is_dir() and (tree / "src" / "accelerate" / "test_utils").is_dir():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"accelerate-{version}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", f"accelerate=={version}", "--no-binary", ":all:",
                        "--no-deps", "--disable-pip-version-check", "-q", "-d", str(cache)], check=True)
    prefixes = (f"accelerate-{version}/tests/", f"accelerate-{version}/src/accelerate/test_utils/")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefixes)]
        tar.extractall(cache, members=members, filter="data")
    (tree / "pytest.ini").write_text("[pytest]\n")  # keeps overdrive's own pytest settings out
    return tree


def _write_accelerate_command(folder: Path) -> None:
    """An ``accelerate`` command for the overdrive side: Accelerate's CLI module under the alias when
    overdrive provides it, overdrive's CLI otherwise."""
    folder.mkdir(parents=True, exist_ok=True)
    command = folder / "accelerate"
    command.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "try:\n"
        "    from accelerate.commands.accelerate_cli import main\n"
        "except ImportError:\n"
        "    from overdrive.cli import main\n"
        "sys.exit(main())\n")
    command.chmod(0o755)


def run_side(side: str, tree: Path, files: list[str], cache: Path, timeout: int,
             reuse: bool = False, together: bool = False, accelerate_path: Path | None = None,
             left_out: tuple[str, ...] = ()) -> tuple[dict[str, str], dict]:
    """Run each test file in its own pytest process under ``side`` (``together``: all of them in one, which
    saves a Python start with torch and Accelerate per file: the CI subset in 60 s instead of 162 s, same
    outcomes); the outcomes and seconds per file (per run when together). ``reuse``: read a run's outcomes
    from the last run's report in ``cache`` when there is one. ``accelerate_path``: a folder holding another
    ``accelerate`` (an unpacked wheel), put ahead of the installed one. Each failure's last line goes to
    ``errors-<side>-<file>.json`` in ``cache`` (``read_errors``). ``left_out``: test ids not run (deselected)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), str(ROOT / "src"), str(accelerate_path) if accelerate_path else None,
                                                    env.get("PYTHONPATH")) if p)
    env["ACCELERATE_SUITE_SIDE"] = side
    env["ACCELERATE_SUITE_TEST_UTILS"] = str(tree / "src" / "accelerate" / "test_utils")
    env.pop("ACCELERATE_USE_CPU", None)
    if side == "overdrive":
        _write_accelerate_command(cache / "bin")
        env["PATH"] = os.pathsep.join((str(cache / "bin"), env.get("PATH", "")))
    outcomes: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for run in ([files] if together else [[name] for name in files]):
        name = run[0] if len(run) == 1 else f"together-{len(run)}-files"
        report = cache / f"report-{side}-{name}.json"
        if reuse and report.exists():
            outcomes.update(json.loads(report.read_text()))
            continue
        report.unlink(missing_ok=True)
        env["ACCELERATE_SUITE_REPORT"] = str(report)
        env["ACCELERATE_SUITE_ERRORS"] = str(cache / f"errors-{side}-{name}.json")
        start = time.monotonic()
        # a file that fails to import must not stop the others of a run (pytest's default with --together)
        command = [sys.executable, "-m", "pytest", *(f"tests/{file}" for file in run), "-q", "-p",
                   "accelerate_suite_report", "-p", "no:cacheprovider", "-c", "pytest.ini", "--timeout", "300",
                   "--continue-on-collection-errors", *(f"--deselect={test}" for test in left_out)]
        try:
            done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
            log = done.stdout + done.stderr
        except subprocess.TimeoutExpired as error:
            log = f"{error.stdout or ''}{error.stderr or ''}\n[accelerate_suite] {name} ran past {timeout} s"
        seconds[name] = time.monotonic() - start
        (cache / f"log-{side}-{name}.txt").write_text(log if isinstance(log, str) else str(log))
        if report.exists():
            outcomes.update(json.loads(report.read_text()))
        else:
            outcomes.update({f"tests/{file}": "failed" for file in run})
        print(f"  {side:10s} {name:48s} {seconds[name]:7.1f} s", flush=True)
    return outcomes, seconds


def read_errors(side: str, files: list[str], cache: Path, together: bool = False) -> dict[str, str]:
    """``{test or file id: the error's last line}`` of the last run of ``files`` under ``side`` in ``cache``."""
    errors: dict[str, str] = {}
    for name in ([f"together-{len(files)}-files"] if together else files):
        path = cache / f"errors-{side}-{name}.json"
        if path.exists():
            errors.update(json.loads(path.read_text()))
    return errors


def error_of(test: str, errors: dict[str, str]) -> str:
    """The error that made ``test`` fail: its own, or its file's import error when it was never collected."""
    return errors.get(test) or errors.get(test.split("::")[0]) or "(no error recorded: not run, or timed out)"


def read_reference() -> set[str]:
    """The tests that pass under the real Accelerate (the recorded reference)."""
    if not REFERENCE.exists():
        raise SystemExit(f"{REFERENCE} is missing: run scripts/accelerate_suite.py --record")
    return {line.strip() for line in REFERENCE.read_text().splitlines() if line.strip() and not line.startswith("#")}


def read_known() -> dict[str, str]:
    """``{test id: 'deliberate: reason' | 'gap: reason' | 'unstable: reason'}`` from the known list.

    Format: a ``[deliberate]``, ``[gap]`` or ``[unstable]`` section header, then one ``test id  # reason`` a line.
    ``unstable``: the test's outcome on this machine is a race under the real Accelerate too (measured), so the
    ratchet neither requires it to pass nor to be removed when it passes."""
    known: dict[str, str] = {}
    section = ""
    for number, raw in enumerate(KNOWN.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line in ("[deliberate]", "[gap]", "[unstable]"):
            section = line[1:-1]
            continue
        test, _, reason = line.partition("#")
        if not section or not reason.strip():
            raise SystemExit(f"{KNOWN}:{number}: {raw!r}: every test needs a section ([deliberate], [gap] or [unstable]) "
                             "above it and a reason after '#'")
        known[test.strip()] = f"{section}: {reason.strip()}"
    return known


def update_known(files: list[str], overdrive: dict[str, str], reference: set[str], known: dict[str, str],
                 errors: dict[str, str]) -> None:
    """Rewrite the known list for the tests of ``files``: drop listed tests that pass (or that no longer pass
    under Accelerate) and add each unlisted failure as a gap, its error as the reason to edit (name who fixes
    it); the other lines are kept as they are."""
    ran = set(files)
    drop = {t for t in known if _file_of(t) in ran and not known[t].startswith("unstable")
            and (overdrive.get(t) == "passed" or t not in reference)}
    new = sorted(t for t in reference if _file_of(t) in ran and overdrive.get(t) != "passed" and t not in known)
    lines = [line for line in KNOWN.read_text().splitlines() if line.partition("#")[0].strip() not in drop]
    if "[gap]" not in lines:
        lines += ["", "[gap]"]
    at = lines.index("[gap]") + 1  # the new gaps go under the section header (the file may end with another)
    lines[at:at] = [f"{t}  # not yet fixed: {error_of(t, errors)}" for t in new]
    KNOWN.write_text("\n".join(lines) + "\n")
    print(f"{KNOWN.name}: {len(drop)} removed, {len(new)} added as gaps")


def _file_of(test: str) -> str:
    return test.split("::")[0].removeprefix("tests/")


def table(files: list[str], results: dict[str, dict[str, str]], seconds: dict[str, dict]) -> None:
    """Per file: tests passed under each side (of those collected there), and the seconds each took."""
    print(f"\n{'file':40s}" + "".join(f"{side:>24s}" for side in results))
    totals = dict.fromkeys(results, (0, 0))
    for name in files:
        cells = []
        for side, outcomes in results.items():
            mine = [o for t, o in outcomes.items() if _file_of(t) == name]
            passed = mine.count("passed")
            totals[side] = (totals[side][0] + passed, totals[side][1] + len(mine))
            cells.append(f"{passed:4d}/{len(mine):<4d}{seconds[side].get(name, 0):7.0f} s")
        print(f"{name:40s}" + "".join(f"{c:>24s}" for c in cells))
    print(f"{'total':40s}" + "".join(f"{p:>12d}/{n:<11d}" for p, n in totals.values()))


def check(files: list[str], overdrive: dict[str, str], reference: set[str], known: dict[str, str]) -> list[str]:
    """The ratchet's complaints (empty when it holds) over the tests of ``files``."""
    ran = set(files)
    problems = []
    for test in sorted(t for t in reference if _file_of(t) in ran):
        passed = overdrive.get(test) == "passed"
        if not passed and test not in known:
            problems.append(f"FAILS under overdrive ({overdrive.get(test, 'not run')}), passes under Accelerate, "
                            f"not in the known list: {test}")
        elif passed and test in known and not known[test].startswith("unstable"):
            problems.append(f"now PASSES under overdrive: remove it from {KNOWN.name}: {test}")
    for test in sorted(t for t in known if _file_of(t) in ran and t not in reference):
        problems.append(f"listed in {KNOWN.name} but does not pass under Accelerate (reference): {test}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("both", *SIDES), default="both")
    parser.add_argument("--files", nargs="*", help="test files of the sdist's tests/ (default: all)")
    parser.add_argument("--ci", action="store_true", help="the CI subset, overdrive side, with --check, --together")
    parser.add_argument("--together", action="store_true",
                        help="all the files in one pytest process (a file's failures may then come from another)")
    parser.add_argument("--check", action="store_true", help="apply the ratchet (the known list, the reference)")
    parser.add_argument("--record", action="store_true", help="run the Accelerate side, rewrite the reference")
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "accelerate_suite")
    parser.add_argument("--reuse", action="store_true", help="take each file's outcomes from the last run's report")
    parser.add_argument("--update-known", action="store_true",
                        help="list every unlisted failure as a gap and drop listed tests that pass (then edit reasons)")
    parser.add_argument("--file-timeout", type=int, default=1800, help="seconds for one test file")
    parser.add_argument("--failures", type=Path,
                        help="write the reference tests that fail under overdrive here, each with its error's last line")
    args = parser.parse_args(argv)
    left_out: dict[str, str] = {}
    if args.ci:
        args.side, args.check, args.together = "overdrive", True, True
        args.files = args.files or list(CI_FILES)
        left_out = CI_LEFT_OUT
        for test, why in left_out.items():
            print(f"left to the whole-suite runs: {test} ({why})")
    if args.record:
        args.side = "accelerate" if args.side == "overdrive" else args.side
    args.cache = args.cache.resolve()
    tree = fetch(args.cache)
    files = args.files or sorted(p.name for p in (tree / "tests").glob("test_*.py"))
    sides = SIDES if args.side == "both" else (args.side,)
    results: dict[str, dict[str, str]] = {}
    seconds: dict[str, dict] = {}
    for side in sides:
        start = time.monotonic()
        results[side], seconds[side] = run_side(side, tree, files, args.cache, args.file_timeout, args.reuse,
                                                args.together, left_out=tuple(left_out))
        print(f"{side}: {time.monotonic() - start:.0f} s for {len(files)} files", flush=True)
    table(files, results, seconds)
    if args.record:
        # an [unstable] test failing in this run says nothing (a race under Accelerate too): it stays
        unstable = {t for t, reason in read_known().items() if reason.startswith("unstable")}
        kept = ({t for t in read_reference() if _file_of(t) not in set(files) or t in unstable}
                if REFERENCE.exists() else set())
        passing = kept | {t for t, o in results["accelerate"].items() if o == "passed"}
        REFERENCE.write_text(f"# tests of accelerate=={VERSION}'s suite that pass under the real Accelerate on a CPU "
                             "machine\n# (written by scripts/accelerate_suite.py --record)\n"
                             + "".join(f"{t}\n" for t in sorted(passing)))
        print(f"wrote {len(passing)} tests to {REFERENCE.relative_to(ROOT)}")
    reference = ({t for t, o in results["accelerate"].items() if o == "passed"}
                 if "accelerate" in results else read_reference()) - set(left_out)
    known = read_known()
    if "overdrive" in results:
        errors = read_errors("overdrive", files, args.cache, args.together)
        failing = [t for t in sorted(reference) if _file_of(t) in set(files) and results["overdrive"].get(t) != "passed"]
        print("\npasses under Accelerate, not under overdrive:")
        for test in failing:
            print(f"  {test}  [{results['overdrive'].get(test, 'not run')}]  {known.get(test, 'NOT LISTED')}\n"
                  f"      {error_of(test, errors)}")
        if args.failures:
            args.failures.write_text(f"# accelerate=={VERSION}: {len(failing)} tests pass under the real Accelerate and "
                                     "fail under overdrive's alias (test  # the error's last line)\n"
                                     + "".join(f"{t}  # {error_of(t, errors)}\n" for t in failing))
    if args.update_known and "overdrive" in results:
        update_known(files, results["overdrive"], reference, known, read_errors("overdrive", files, args.cache,
                                                                                 args.together))
        known = read_known()
    if args.check and "overdrive" in results:
        problems = check(files, results["overdrive"], reference, known)
        for problem in problems:
            print(problem)
        print(f"ratchet: {'FAILED, ' + str(len(problems)) + ' problem(s)' if problems else 'holds'}")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

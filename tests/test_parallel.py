"""`make test` runs two pytest workers with `--dist loadgroup` (Makefile): the tests of one module, and
those sharing a folder's session server, must run on one worker. This runs a small module that way and
checks it, so that a pytest or pytest-xdist upgrade that breaks the grouping (pytest 9 did: every test
became a group of its own, servers started twice, and a test that follows its module's previous one
failed) fails here, not as a flaky test elsewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from fleetsight.settings import REPO_ROOT

MODULE = "tests/test_shape.py"  # three quick tests, no server


def test_a_modules_tests_run_on_one_worker_in_their_order(tmp_path: Path) -> None:
    # Its own --basetemp: without one, the inner pytest first prunes the numbered temp folders of earlier
    # sessions in /tmp/pytest-of-<user> (gigabytes of servers' data after a full run: 67 of its 69 s).
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "inner"), MODULE],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    ran = re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+)", result.stdout)
    assert len(ran) == 3, result.stdout[-3000:]
    assert len({worker for worker, _ in ran}) == 1, ran
    assert all(test.endswith(f"@{MODULE}") for _, test in ran), ran
    names = [test.split("::")[1].split("@")[0] for _, test in ran]
    declared = re.findall(r"^def (test_\w+)", (REPO_ROOT / MODULE).read_text(), flags=re.MULTILINE)
    assert names == declared, (names, declared)

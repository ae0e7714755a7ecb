"""The checks a change passes besides the tests, run with them so that CI
(which runs the suite alone) holds every change to them: ruff over the
package, the tests and the benchmarks, and mypy in strict mode over the
package (``[tool.ruff]`` and ``[tool.mypy]`` in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_finds_nothing() -> None:
    checked = run("ruff", "check", "--no-cache", "tidings", "tests", "bench")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_mypy_strict_finds_nothing(tmp_path: Path) -> None:
    checked = run("mypy", "--cache-dir", str(tmp_path / "mypy"), "tidings")
    assert checked.returncode == 0, checked.stdout + checked.stderr

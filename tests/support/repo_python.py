"""The repository's own python commands run as a child (scripts/, devkit/), from its root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_python(
    args: list[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in the repository's root with it on PYTHONPATH; `env` adds variables."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )

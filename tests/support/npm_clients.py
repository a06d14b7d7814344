"""Real clients from npm (Codex CLI, ...), installed once per machine into a cache directory.

Where npm is missing the tests that need such a client are skipped with a reason, except when
GPT_OSS_REQUIRE_CLIENTS=1 (CI sets it): then a missing client fails the test, so CI can never
pass without having run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REQUIRE_ENV = "GPT_OSS_REQUIRE_CLIENTS"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def unavailable(reason: str) -> None:
    """Skip (or, where clients are required, fail) the test: `reason` says what is missing."""
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: the real clients must run here)")
    pytest.skip(f"{reason}; set {REQUIRE_ENV}=1 to make this a failure")


def cache_root() -> Path:
    return Path.home() / ".cache" / "gpt-oss-server"


def npm_binary(package: str, version: str, binary: str, directory: Path) -> Path:
    """`directory/node_modules/.bin/<binary>` of `package@version`, installed there once."""
    path = directory / "node_modules" / ".bin" / binary
    if path.exists():
        return path
    npm = shutil.which("npm")
    if npm is None:
        unavailable(f"npm is needed to install {package}@{version} for this test (Node.js 18+)")
    assert npm is not None
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{binary}-install-", dir=directory.parent))
    command = [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund"]
    result = subprocess.run(
        [*command, f"{package}@{version}"], capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        unavailable(f"npm could not install {package}@{version}:\n{result.stderr[-2000:]}")
    try:
        staging.rename(directory)
    except OSError:  # another run installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return path

"""Smoke test of the stack-floor script: the bare stack, `serve` and (where llama.cpp's server
is installed) llama-server, a few rounds each.

The report has its shape, every time is positive, and each bootstrap interval holds its median.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # three servers, real decoding

ROOT = Path(__file__).resolve().parents[2]


def test_the_stack_and_the_servers_measured_in_rounds(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    argv = [
        sys.executable, "-m", "scripts.bench.stack_floor", "--rounds", "3",
        "--prompt-tokens", "128", "--model", str(tiny_gguf), "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, check=False, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["rounds"] == 3
    beyond = report["beyond_prefill_ms"]
    assert {"stack", "serve"} <= set(beyond) <= {"stack", "serve", "llama-server"}
    for summary in beyond.values():
        assert 0 < summary["p25"] <= summary["median"] <= summary["p75"]
    differences = report["differences_ms"]
    assert "serve - stack" in differences
    assert ("stack - llama-server" in differences) == ("llama-server" in beyond)
    for difference in differences.values():
        low, high = difference["interval_95"]
        assert low <= difference["median"] <= high

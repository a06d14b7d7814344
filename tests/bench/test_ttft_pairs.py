"""Smoke test of the paired time-to-first-token script: two servers of this tree, a few pairs.

The report has its shape, every time is positive and above the server's own prefill, the decode
is timed (ms a token), and each bootstrap interval holds its median.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two servers, real decoding

ROOT = Path(__file__).resolve().parents[2]


def test_two_servers_measured_by_pairs(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "pairs.json"
    argv = [
        sys.executable, "-m", "scripts.bench.ttft_pairs", "--a", str(ROOT), "--b", str(ROOT),
        "--pairs", "4", "--prompt-tokens", "128", "--gen-tokens", "8",
        "--model", str(tiny_gguf), "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, check=False, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["pairs"] == 4
    assert set(report["ttft_ms"]) == set(report["beyond_prefill_ms"]) == {"a", "b"}
    for name in ("a", "b"):
        assert report["ttft_ms"][name] > report["beyond_prefill_ms"][name] > 0
        assert report["decode_ms_per_token"][name] > 0
    paired = report["b_minus_a"]
    for key, interval in (("beyond_prefill_ms", "beyond_prefill_interval_95"),
                          ("ttft_ms", "ttft_interval_95"),
                          ("decode_ms_per_token", "decode_interval_95")):  # fmt: skip
        low, high = paired[interval]
        assert low <= paired[key] <= high

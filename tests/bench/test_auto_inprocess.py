"""auto against off in one process on the tiny synthetic GGUF: both settings' engines answer
every round in turn, each round's ratio counts, and the steps are split from inside."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # four engines, real decoding


def test_each_round_pairs_the_settings_and_splits_their_steps(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    out = tmp_path / "auto.json"
    argv = [
        sys.executable, "-m", "scripts.bench.auto_inprocess", "--model", str(tiny_gguf),
        "--threads", "1", "--prompt", "32", "--gen", "24", "--rounds", "3",
        "--resamples", "200", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["instances"] == 2
    assert report["control"] is False
    assert len(report["ratios"]) == 3
    assert all(r > 0 for r in report["ratios"])
    low, high = report["ci95"]
    assert low <= report["geomean"] <= high
    assert done.stderr.count("round ") == 3  # the warm-up round is not counted
    for mode in ("auto", "off"):
        steps = report["steps_ms"][mode]
        assert 0 < steps["decode"] < steps["step"]
        assert 0 < steps["pick"] < steps["step"]

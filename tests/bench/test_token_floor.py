"""The per-token floor benchmark on the tiny synthetic GGUF, as the GPU check's `floor` phase
runs it: each loop measured in every round, the engine's one-token steps split by part."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # an engine and a child process's context, real decoding


def test_every_loop_is_measured_and_the_engine_split(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    argv = [
        sys.executable, "-m", "scripts.bench.token_floor", "--model", str(tiny_gguf),
        "--threads", "1", "--prompt", "32", "--gen", "24", "--rounds", "2",
        "--arms", "bare", "sampled", "engine", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [sorted(r) for r in report["rounds"]] == [["bare", "engine", "sampled"]] * 2
    assert list(report["rounds"][1]) == ["sampled", "engine", "bare"]  # the order rotates
    for arm in ("bare", "sampled", "engine"):
        assert report["medians"][arm]["ms_per_token"] > 0
    engine = report["medians"]["engine"]
    # every token after the first is a step of its own (speculation off)
    assert engine["one_token_steps"] == 23
    assert 0 < engine["decode_ms"] < engine["step_ms"]
    assert 0 < engine["pick_ms"] < engine["step_ms"]
    assert set(report["added_per_token"]) == {"sampling_ms", "engine_ms"}

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
        "--arms", "bare", "read", "sampled", "engine", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [sorted(r) for r in report["rounds"]] == [["bare", "engine", "read", "sampled"]] * 2
    assert list(report["rounds"][1]) == ["read", "sampled", "engine", "bare"]  # the order rotates
    for arm in ("bare", "read", "sampled", "engine"):
        assert report["medians"][arm]["ms_per_token"] > 0
    # the work on the row, timed inside its loop: a part of each token's time
    medians = report["medians"]
    assert 0 < medians["read"]["row_pass_ms"] < medians["read"]["ms_per_token"]
    assert 0 < medians["sampled"]["draw_ms"] < medians["sampled"]["ms_per_token"]
    assert set(medians["bare"]) == {"ms_per_token"}
    engine = report["medians"]["engine"]
    # every token after the first is a step of its own (speculation off)
    assert engine["one_token_steps"] == 23
    assert 0 < engine["decode_ms"] < engine["step_ms"]
    assert 0 < engine["pick_ms"] < engine["step_ms"]
    assert set(report["added_per_token"]) == {"row_pass_ms", "sampling_ms", "engine_ms"}


def test_a_prompt_longer_than_a_batch_is_decoded(tiny_gguf: Path, tmp_path: Path) -> None:
    """A depth beyond llama.cpp's batch (2,048 tokens): the bare loops decode their prompt in
    chunks, and the engine's rounds reuse one prompt's cells instead of caching a new one."""
    out = tmp_path / "floor.json"
    argv = [
        sys.executable, "-m", "scripts.bench.token_floor", "--model", str(tiny_gguf),
        "--threads", "1", "--prompt", "2100", "--gen", "4", "--rounds", "2",
        "--arms", "bare", "engine", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["medians"]["bare"]["ms_per_token"] > 0
    assert report["medians"]["engine"]["one_token_steps"] == 3

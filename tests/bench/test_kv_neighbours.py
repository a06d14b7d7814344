"""The idle-neighbour benchmark on the tiny synthetic GGUF: each cache measured alone and beside
an idle sequence that really sits in the cache, in alternating order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two contexts, real prefills and decodes


def test_each_cache_is_measured_alone_and_beside_an_idle_sequence(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    out = tmp_path / "neighbours.json"
    argv = [
        sys.executable, "-m", "scripts.bench.kv_neighbours", "--model", str(tiny_gguf),
        "--threads", "1", "--prompt", "300", "--neighbour", "700", "--gen", "4",
        "--rounds", "2", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    for cache in ("unified", "per_sequence"):
        rounds = report[cache]["rounds"]
        assert [list(r) for r in rounds] == [["alone", "beside"], ["beside", "alone"]]
        for measured in rounds:
            assert measured["alone"]["neighbour_cells"] == 0
            assert measured["beside"]["neighbour_cells"] == 700
            for case in ("alone", "beside"):
                assert measured[case]["measured_cells"] == 300 + 4
                assert measured[case]["prefill_ms"] > 0
                assert measured[case]["decode_ms_per_token"] > 0
        assert set(report[cache]["beside_over_alone"]) == {"prefill_ms", "decode_ms_per_token"}

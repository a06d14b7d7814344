"""The GPU check's bench phase passes the depths and stream counts, and its table shows each
paired ratio with its interval (scripts/gpu_check; run in a child python: tests import nothing
of scripts/)."""

from __future__ import annotations

import json

from tests.support.repo_python import run_python

REPORT = {
    "paths": {"http": {"tests": {"tg128": {"tokens_per_s": {"median": 280.0}}}}},
    "depth": {
        "reference": "llama-bench",
        "rows": [
            {
                "depth": 4096,
                "http": {"tokens_per_s": {"median": 270.0}},
                "llama-bench": {"tokens_per_s": {"median": 290.0}},
                "ratio": {"median": 0.931, "interval_95": [0.92, 0.94], "pairs": 5},
            }
        ],
        "error": None,
    },
    "streams": {"error": "BenchError: llama-server exited"},
}

CODE = """
import json, sys
from scripts.gpu_check.__main__ import CPU, GPU, PhaseResult, bench_summary, render_markdown
summary = bench_summary(json.loads(sys.argv[1]))
phase = PhaseResult("bench", status="ok", detail=summary)
print(json.dumps({"summary": summary, "gpu": GPU.bench, "cpu": CPU.bench,
                  "md": render_markdown(True, {}, [phase], 1.0)}))
"""


def test_the_bench_phase_reports_depth_and_streams() -> None:
    done = run_python(["-c", CODE, json.dumps(REPORT)], timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for flags in (out["gpu"], out["cpu"]):
        assert "--depths" in flags.split()
        assert "--streams" in flags.split()
    paired = out["summary"]["paired"]
    assert paired["depth"]["rows"] == [{
        "depth": 4096, "http": 270.0, "llama-bench": 290.0, "ratio": 0.931,
        "interval_95": [0.92, 0.94],
    }]  # fmt: skip
    assert paired["streams"] == {"error": "BenchError: llama-server exited"}
    assert "| 4096 | 270 | 290 | 0.931 | 0.920–0.940 |" in out["md"]
    assert "## bench streams: failed: BenchError: llama-server exited" in out["md"]

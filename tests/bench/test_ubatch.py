"""scripts/bench/ubatch.py reads llama-bench's output: its JSON tests and, from its verbose log,
the compute buffers llama.cpp reserved (a run of this project's CPU build, `-p 512 -ub 1024 -v`,
kept in tests/data/llama_bench). llama-bench itself is the bench extra's: not here."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.repo_python import run_python

DATA = Path(__file__).resolve().parents[1] / "data" / "llama_bench"

READ = """
import json, sys
from pathlib import Path
from scripts.bench.ubatch import compute_buffers, prefill_rates
log = Path(sys.argv[1]).read_text()
tests = json.loads(Path(sys.argv[2]).read_text())
print(json.dumps({"buffers": compute_buffers(log), "rates": prefill_rates(tests)}))
"""


def test_the_compute_buffers_and_the_prefill_rates_are_read() -> None:
    log, tests = DATA / "verbose-ub1024.log", DATA / "pp512-ub1024.json"
    done = run_python(["-c", READ, str(log), str(tests)], timeout=120)
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    # the compute buffer only: not the model's, the output's or the KV cache's buffers, and
    # not the size the context repeats when it is freed ("size is ..., matches expectation")
    assert read["buffers"] == {"CPU": 393.13}
    assert read["rates"] == {"pp512": round(json.loads(tests.read_text())[0]["avg_ts"], 1)}

"""The backend-sampling benchmark on the tiny synthetic GGUF: llama.cpp's sampler chain in the
model's graph (`llama_set_sampler`) against the server's host sampler, as the GPU check runs it.

Greedy, both loops must write the same tokens (the check that the backend chain is wired to the
sequence and its token read back at the right index); sampled, every rate is positive; and the
chain can be taken off the sequence and a new one set, the decode loop going on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two contexts, real decoding


@pytest.mark.parametrize("temperature", ["0", "1.0"])
def test_backend_and_host_sampling(tiny_gguf: Path, tmp_path: Path, temperature: str) -> None:
    out = tmp_path / "sampling.json"
    argv = [
        sys.executable, "-m", "scripts.bench.backend_sampling", "--model", str(tiny_gguf),
        "--threads", "1", "--prompt", "32", "--gen", "24", "--rounds", "2",
        "--temperature", temperature, "--switches", "2", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert all(len(rates) == 2 for rates in report["tokens_per_s"].values())
    assert min(report["median_tokens_per_s"].values()) > 0
    assert len(report["switch_ms_each"]) == 2  # the chain taken off and a new one set, twice
    if temperature == "0":
        assert report["greedy_identical"] is True
    else:
        assert "greedy_identical" not in report

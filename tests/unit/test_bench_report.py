"""The benchmark report's per-token server cost: ms per token above llama-bench's decode."""

from __future__ import annotations

from typing import Any

from server.bench.report import markdown_table, server_cost


def decode(tps: float) -> dict[str, Any]:
    return {"tests": {"tg256": {"tokens_per_s": {"min": tps, "median": tps, "max": tps, "n": 1}}}}


def test_cost_is_the_difference_of_milliseconds_per_token() -> None:
    paths = {"llama-bench": decode(500.0), "inprocess": decode(400.0), "http": decode(250.0)}
    cost = server_cost(paths)
    assert cost == {"inprocess": {"tg256": 0.5}, "http": {"tg256": 2.0}}
    table = markdown_table({"paths": paths})
    assert "tg256 ms/token over llama-bench" in table
    assert "+2.000" in table


def test_no_cost_without_llama_bench() -> None:
    assert server_cost({"inprocess": decode(400.0)}) == {}

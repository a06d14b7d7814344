"""The benchmark report's derived numbers: ms per token above llama-bench's decode, and the time
to first token HTTP adds over prefill."""

from __future__ import annotations

from typing import Any

from server.bench.report import markdown_table, readable, server_cost, ttft_http_overhead


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


def overheads(**medians: float) -> dict[str, Any]:
    return {
        label: {"ttft_overhead_ms": {"min": ms, "median": ms, "max": ms, "n": 1}}
        for label, ms in medians.items()
    }


def test_ttft_overhead_is_the_worst_prefill_size_of_the_quiet_measurements() -> None:
    http = {"tests": overheads(pp64=9.0, pp512=12.0), "tests_quiet": overheads(pp64=4.5, pp512=4.7)}
    assert ttft_http_overhead({"http": http}) == {"value": 4.7, "basis": "tests_quiet"}


def test_ttft_overhead_falls_back_to_every_measurement_when_none_was_quiet() -> None:
    http = {"tests": overheads(pp64=9.0) | decode(400.0)["tests"], "tests_quiet": {}}
    assert ttft_http_overhead({"http": http}) == {"value": 9.0, "basis": "tests"}


def test_no_ttft_overhead_without_the_http_path() -> None:
    assert ttft_http_overhead({"inprocess": {"tests": overheads(pp64=1.0)}}) is None


def test_rates_print_as_people_read_them() -> None:
    """Thousands separated, no exponent: 87,960 and 1,553, not 8.796e+04 and 1.55e+03."""
    assert [readable(v) for v in (87960.4, 1553.2, 100.0, 55.34, 5.408)] == [
        "87,960", "1,553", "100", "55.3", "5.41",
    ]  # fmt: skip
    paths = {"llama-bench": decode(87960.4), "http": decode(1553.2)}
    table = markdown_table({"paths": paths})
    assert "87,960 (87,960–87,960)" in table
    assert "1,553 (1,553–1,553)" in table
    assert "e+0" not in table

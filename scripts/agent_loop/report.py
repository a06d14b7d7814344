"""The agent-loop report: per-round numbers side by side, the targets' ratios, and a chart."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scripts.agent_loop.ours import Round
from scripts.agent_loop.theirs import Replay

log = logging.getLogger(__name__)


def summarize(
    rounds: list[Round], cached: list[Replay] | None, cold: list[Replay] | None
) -> dict[str, Any]:
    tool_rounds = [r for i, r in enumerate(rounds) if r.label.startswith("tool round") and i > 1]
    later = [r for r in rounds if not r.label.endswith(" 1")]
    report: dict[str, Any] = {
        "rounds": [
            {**asdict(r), "evaluated_tokens": r.evaluated_tokens, "output": len(r.output)}
            | (_theirs(cached[i], "llama_server") if cached else {})
            | (_theirs(cold[i], "cold") if cold else {})
            for i, r in enumerate(rounds)
        ],
        "tool_rounds_evaluated_over_new": _ratio(tool_rounds),
        "worst_round_evaluated_over_new": max(
            (r.evaluated_tokens / r.new_tokens for r in later if r.new_tokens > 0), default=0.0
        ),
        "ttft_ms_total": sum(r.ttft_ms for r in rounds),
        "prefill_ms_total": sum(r.prefill_ms for r in rounds),
    }
    if cached:
        report["llama_server_prefill_ms_total"] = sum(c.prefill_ms for c in cached)
        report["llama_server_ttft_ms_total"] = sum(c.ttft_ms for c in cached)
        report["llama_server_evaluated_total"] = sum(c.evaluated_tokens for c in cached)
    if cold:
        report["cold_prefill_ms_total"] = sum(c.prefill_ms for c in cold)
        report["cold_over_ours_prefill"] = (
            report["cold_prefill_ms_total"] / report["prefill_ms_total"]
        )
    if cached:
        report["llama_server_over_ours_prefill"] = (
            report["llama_server_prefill_ms_total"] / report["prefill_ms_total"]
        )
    report["evaluated_total"] = sum(r.evaluated_tokens for r in rounds)
    return report


def _ratio(rounds: list[Round]) -> float:
    new = sum(r.new_tokens for r in rounds)
    return sum(r.evaluated_tokens for r in rounds) / new if new else 0.0


def _theirs(replay: Replay, prefix: str) -> dict[str, Any]:
    return {
        f"{prefix}_evaluated_tokens": replay.evaluated_tokens,
        f"{prefix}_cached_tokens": replay.cached_tokens,
        f"{prefix}_prefill_ms": replay.prefill_ms,
        f"{prefix}_ttft_ms": replay.ttft_ms,
    }


def chart(report: dict[str, Any], path: Path, title: str) -> None:
    """Evaluated tokens and time to first token per round, this server beside llama-server."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no chart (pip install 'gpt-oss-server[bench]')")
        return
    rows = report["rounds"]
    x = list(range(1, len(rows) + 1))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    top.plot(x, [r["evaluated_tokens"] for r in rows], "o-", label="gpt-oss-server: evaluated")
    top.plot(x, [r["new_tokens"] for r in rows], "k--", label="genuinely new tokens")
    if "llama_server_evaluated_tokens" in rows[0]:
        top.plot(x, [r["llama_server_evaluated_tokens"] for r in rows], "s-", label="llama-server")
    top.set_ylabel("prompt tokens evaluated")
    top.set_yscale("log")
    top.legend()
    bottom.plot(x, [r["prefill_ms"] for r in rows], "o-", label="gpt-oss-server: prefill")
    if "llama_server_prefill_ms" in rows[0]:
        bottom.plot(x, [r["llama_server_prefill_ms"] for r in rows], "s-", label="llama-server")
    if "cold_prefill_ms" in rows[0]:
        bottom.plot(x, [r["cold_prefill_ms"] for r in rows], "x:", label="cold re-evaluation")
    bottom.set_ylabel("prompt evaluation, ms")
    bottom.set_yscale("log")
    bottom.set_xlabel("request")
    bottom.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)

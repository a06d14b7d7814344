"""What reasoning summaries cost: the same streamed /v1/responses request with and without them.

    python -m scripts.summary_cost --model PATH.gguf [--repetitions 3] [--max-output-tokens 64]
        [--summary-max-tokens 32] [--out cost.json]

Starts `gpt-oss-server serve` on the model (as the benchmark does; its log, at info level, goes
to `--log` and says per request how long the summaries decoded and how long the response waited
for them), sends one unmeasured warm-up request without summaries, then the same request
`--repetitions` times in each mode, alternating which mode goes first: `off` (no
`reasoning.summary`) and `on` (`reasoning: {summary: "auto"}`). Every request has the same seed,
so with the same sampling the main generation should write the same tokens in both modes (its
token counts are reported to check that). Per request, on the client's clock: `total_ms`
(request sent to stream closed), `first_answer_ms` (to the final answer's first `output_text`
delta; null when the model wrote no final answer), `first_summary_ms` (to the first summary
delta) and `completed_ms` (to the terminal event). A Responses stream keeps its items in order,
so the answer's deltas follow the summary of the reasoning before it: `first_answer_ms` grows by
however long the summary outlasts that reasoning's end. Tokens come from the terminal event's
usage: the main generation's `output_tokens` (`reasoning_tokens` of them), and the summaries'
own tokens, which the server reports apart in `usage.summary_usage`. The JSON printed (and
written to `--out`) holds every request, the median and mean per mode, their delta `on - off`,
and the 1-minute load average before and after (other processes' load skews the times).

Output caps keep runs short and bounded on any weights (random ones write random text):
`--max-output-tokens` for the main generation, `--summary-max-tokens` (the server's) for each
summary, and `--reasoning-max-tokens` (the request's `reasoning.max_tokens`, in both modes),
after which the server forces the final answer to start. That budget is what makes a model
with random weights end its reasoning at a known point, so that its summary runs beside the
answer as it would with real weights; with `--reasoning-max-tokens 0` such a model stays in
its analysis channel until the cap, and its one summary (of the cut segment) runs only after
the main generation ended: the worst case, summary latency added in full.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from server.bench.http_path import free_port
from server.bench.procs import ServerProcess, serve_command
from server.bench.sse import stream_events

PROMPT = "Explain in two sentences why the sky is blue."
TERMINALS = ("response.completed", "response.incomplete", "response.failed")
MODES = ("off", "on")


@dataclass
class Trace:
    """One streamed request: times from sending it (ms) and its usage."""

    mode: str
    repetition: int
    total_ms: float = 0.0
    first_answer_ms: float | None = None
    first_summary_ms: float | None = None
    completed_ms: float | None = None
    status: str = ""
    output_tokens: int = 0
    reasoning_tokens: int = 0
    summaries: int = 0
    summary_input_tokens: int = 0
    summary_output_tokens: int = 0


def request_body(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "summary-cost",
        "input": args.prompt,
        "stream": True,
        "store": False,
        "max_output_tokens": args.max_output_tokens,
        "seed": args.seed,
    }
    reasoning: dict[str, Any] = {}
    if args.reasoning_max_tokens > 0:
        reasoning["max_tokens"] = args.reasoning_max_tokens
    if mode == "on":
        reasoning["summary"] = "auto"
    if reasoning:
        body["reasoning"] = reasoning
    return body


def measure(client: httpx.Client, url: str, body: dict[str, Any], mode: str, rep: int) -> Trace:
    trace = Trace(mode, rep)
    sent = time.perf_counter()

    def since(arrived: float) -> float:
        return round((arrived - sent) * 1000, 1)

    for arrived, event in stream_events(client, url, body):
        kind = event.get("type")
        if kind == "response.output_text.delta" and trace.first_answer_ms is None:
            trace.first_answer_ms = since(arrived)
        elif kind == "response.reasoning_summary_text.delta" and trace.first_summary_ms is None:
            trace.first_summary_ms = since(arrived)
        elif kind in TERMINALS:
            trace.completed_ms = since(arrived)
            response = event["response"]
            trace.status = response["status"]
            usage = response.get("usage") or {}
            trace.output_tokens = usage.get("output_tokens", 0)
            trace.reasoning_tokens = usage.get("output_tokens_details", {}).get(
                "reasoning_tokens", 0
            )
            spent = usage.get("summary_usage") or {}
            trace.summaries = spent.get("summaries", 0)
            trace.summary_input_tokens = spent.get("input_tokens", 0)
            trace.summary_output_tokens = spent.get("output_tokens", 0)
    trace.total_ms = since(time.perf_counter())
    return trace


NUMBERS = (
    "total_ms",
    "first_answer_ms",
    "first_summary_ms",
    "completed_ms",
    "output_tokens",
    "reasoning_tokens",
    "summaries",
    "summary_input_tokens",
    "summary_output_tokens",
)


Stat = Callable[[Sequence[float]], float]


def summarize(traces: Sequence[Trace], stat: Stat) -> dict[str, float | None]:
    """`stat` of each number over the traces that have it (None when none has)."""
    out: dict[str, float | None] = {}
    for name in NUMBERS:
        values = [v for t in traces if (v := getattr(t, name)) is not None]
        out[name] = round(stat(values), 1) if values else None
    return out


def delta(on: dict[str, float | None], off: dict[str, float | None]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in NUMBERS:
        a, b = on[name], off[name]
        out[name] = round(a - b, 1) if a is not None and b is not None else None
    return out


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    return serve_command(
        args.model, port,
        "--n-ctx", str(args.n_ctx),
        "--summary-max-tokens", str(args.summary_max_tokens),
        "--no-prompt-cache",  # the same request with and without summaries: no disk hits
        "--log-level", "info",  # the log has each request's summary decode and wait times
    )  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = server_command(args, port)
    traces: list[Trace] = []
    before_load = os.getloadavg()[0]  # other processes skew the times: shown with them
    with (
        ServerProcess(command, args.log, f"{base}/health", args.startup_timeout_s) as server,
        httpx.Client() as client,
    ):
        url = f"{base}/v1/responses"
        measure(client, url, request_body(args, "off"), "warmup", -1)
        for rep in range(args.repetitions):
            order = MODES if rep % 2 == 0 else MODES[::-1]
            for mode in order:
                traces.append(measure(client, url, request_body(args, mode), mode, rep))
                print(json.dumps(asdict(traces[-1])), file=sys.stderr)
        load_s = server.load_s
    stats: dict[str, dict[str, dict[str, float | None]]] = {}
    for name, stat in (("median", statistics.median), ("mean", statistics.fmean)):
        stats[name] = {
            mode: summarize([t for t in traces if t.mode == mode], stat) for mode in MODES
        }
    return {
        "model": str(args.model),
        "command": command,
        "settings": {
            "repetitions": args.repetitions,
            "max_output_tokens": args.max_output_tokens,
            "summary_max_tokens": args.summary_max_tokens,
            "reasoning_max_tokens": args.reasoning_max_tokens,
            "seed": args.seed,
            "prompt": args.prompt,
        },
        "load_s": round(load_s, 1),
        "load_average_1m": [round(before_load, 2), round(os.getloadavg()[0], 2)],
        **stats,
        "delta_on_minus_off": {
            name: delta(per_mode["on"], per_mode["off"]) for name, per_mode in stats.items()
        },
        "requests": [asdict(t) for t in traces],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, required=True, help="a gpt-oss GGUF")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--max-output-tokens", type=int, default=64)
    parser.add_argument("--summary-max-tokens", type=int, default=32)
    parser.add_argument(
        "--reasoning-max-tokens",
        type=int,
        default=16,
        help="analysis tokens before the answer is forced to start (both modes; 0: no budget)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--log", type=Path, default=Path(tempfile.gettempdir()) / "summary-cost-server.log"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    result = json.dumps(run(args), indent=2)
    print(result)
    if args.out is not None:
        args.out.write_text(result + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

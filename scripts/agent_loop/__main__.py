"""`python -m scripts.agent_loop --model PATH`: run the agent-loop benchmark, print JSON."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from scripts.agent_loop.ours import Conversation, run_conversations, serving
from scripts.agent_loop.report import chart, summarize
from scripts.agent_loop.theirs import LlamaServer, Replay, replay
from server.engine.base import default_threads


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.agent_loop", description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=10, help="tool rounds")
    parser.add_argument("--tool-output-tokens", type=int, default=300)
    parser.add_argument("--conversations", type=int, default=1, help="interleaved copies")
    parser.add_argument("--n-ctx", type=int, default=32768)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--llama-server", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--cold", action=argparse.BooleanOptionalAction, default=True,
        help="also re-evaluate every round from scratch (llama-server, cache off)",
    )  # fmt: skip
    parser.add_argument(
        "--brief", action="store_true",
        help="start from ≈1.4k tokens instead of Codex's ≈7.3k (slow machines, e.g. 20b on CPU)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("agent-loop"))
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory() as cache,
        serving(args.model, args.n_ctx, args.threads, Path(cache)) as (base, forced),
    ):
        conversations = [
            Conversation(
                chr(ord("A") + i),
                forced.encoding,
                args.rounds,
                args.tool_output_tokens,
                args.seed + i,
                args.brief,
            )
            for i in range(args.conversations)
        ]
        rounds = run_conversations(base, forced, conversations)
        prompts = list(forced.prompts)
    theirs = LlamaServer(args.model, args.n_ctx, args.threads, args.conversations, args.out)
    outputs = [r.output for r in rounds]
    cached: list[Replay] = []
    command: list[str] = []
    if args.llama_server:
        cached, command = replay(theirs, prompts, outputs, cache_prompt=True)
    cold: list[Replay] = []
    if args.llama_server and args.cold:
        cold, _ = replay(theirs, prompts, outputs, cache_prompt=False)
    report = summarize(rounds, cached or None, cold or None)
    report["settings"] = {**vars(args), "model": str(args.model), "out": str(args.out),
                          "llama_server_command": command}  # fmt: skip
    (args.out / "agent_loop.json").write_text(json.dumps(report, indent=2))
    chart(report, args.out / "agent_loop.png", f"agent loop on {args.model.name}")
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

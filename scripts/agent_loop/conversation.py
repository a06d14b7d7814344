"""The Codex-shaped conversation: its first request, the model's scripted turns, tool outputs."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai_harmony import HarmonyEncoding

CAPTURE = Path(__file__).resolve().parents[2] / "tests" / "data" / "codex" / "exec_round2.json"


@dataclass(frozen=True)
class Turn:
    """One request of the loop: what the model will say, and what the client adds after it."""

    label: str
    script: str  # harmony text the model is made to write
    follow_up: list[dict[str, Any]]  # items the client appends after the response's output


BRIEF_CHARS = 2000  # of Codex's ≈17k-character developer prompt


def first_request(conversation: str, *, brief: bool = False) -> dict[str, Any]:
    """Codex's first request of a thread: developer prompt, tools, environment, user message.

    `brief`: a start of ≈1.4k instead of ≈7.3k tokens, for machines where prefill is slow:
    the first 2000 characters of the developer prompt and the exec_command tool only.
    """
    body = json.loads(CAPTURE.read_text())
    leading = [item for item in body["input"] if item.get("type") == "message"]
    request: dict[str, Any] = copy.deepcopy(body)
    request["input"] = leading
    if brief:
        part = leading[0]["content"][0]
        part["text"] = part["text"][:BRIEF_CHARS]
        request["tools"] = [t for t in body["tools"] if t.get("name") == "exec_command"]
    request["input"][-1]["content"] = [
        {"type": "input_text", "text": f"{conversation}: read the ten log files and report."}
    ]
    request["reasoning"].pop("summary", None)  # a summary is a generation apart: not measured here
    request["prompt_cache_key"] = f"agent-loop-{conversation}"
    request["stream"] = True
    return request


def tool_output(encoding: HarmonyEncoding, n_tokens: int, seed: int) -> str:
    """A deterministic command output of about `n_tokens` tokens."""
    rng = random.Random(seed)
    lines: list[str] = []
    while len(encoding.encode("\n".join(lines), disallowed_special=())) < n_tokens:
        level = rng.choice(["INFO", "WARN", "DEBUG"])
        lines.append(f"2026-11-21T10:{rng.randrange(60):02d}:{rng.randrange(60):02d} {level} "
                     f"worker-{rng.randrange(8)} processed batch {rng.randrange(10**6)} "
                     f"in {rng.random():.3f}s")  # fmt: skip
    return "Process exited with code 0\nOutput:\n" + "\n".join(lines)


def turns(encoding: HarmonyEncoding, rounds: int, output_tokens: int, seed: int) -> Iterator[Turn]:
    """`rounds` tool rounds, the final answer, then a second user turn and its answer."""
    for i in range(1, rounds + 1):
        script = (
            f"<|channel|>analysis<|message|>Round {i}: the next log to read is file{i}.log."
            "<|end|><|start|>assistant<|channel|>commentary to=functions.exec_command "
            f'<|constrain|>json<|message|>{{"cmd":"cat file{i}.log"}}<|call|>'
        )
        output = tool_output(encoding, output_tokens, seed * 1000 + i)
        yield Turn(f"tool round {i}", script, [{"type": "function_call_output", "output": output}])
    yield Turn(
        "final answer",
        "<|channel|>analysis<|message|>All logs read; nothing failed.<|end|><|start|>assistant"
        "<|channel|>final<|message|>I read all the logs: every batch finished.<|return|>",
        [{"type": "message", "role": "user",
          "content": [{"type": "input_text", "text": "Which worker was busiest?"}]}],
    )  # fmt: skip
    yield Turn(
        "second user turn",
        "<|channel|>analysis<|message|>Count per worker.<|end|><|start|>assistant"
        "<|channel|>final<|message|>worker-3 processed the most batches.<|return|>",
        [],
    )


def next_input(
    previous: list[dict[str, Any]], output: list[dict[str, Any]], follow_up: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """What Codex sends next: everything so far, the response's output items, then its own."""
    items = [*previous, *output]
    calls = [item for item in output if item.get("type") == "function_call"]
    for extra in follow_up:
        if extra["type"] == "function_call_output":
            items.append({**extra, "call_id": calls[-1]["call_id"]})
        else:
            items.append(extra)
    return items

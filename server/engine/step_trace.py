"""StepTrace: what each engine step did and what it touched, one JSON line a step (debug only).

Off unless `GPT_OSS_STEP_TRACE=FILE` is set when the engine starts; the scheduler then hands
every step here, and nothing else runs for it. Each line:

- `t_ms`, `decode_ms`: the step's wall time (decode, picks, rollbacks, flush) and its
  llama_decode's;
- `parts`: [sequence, tokens, rows of logits] of each part of the batch; `drafted`, `emitted`;
- `reused`: whether llama.cpp reused the previous step's compute graph (its `n_reused` counter;
  a step whose batch shape or attended cells differ from the last one's builds its graph anew);
- `logits_rows`: the rows of llama.cpp's output buffer (it grows to the most outputs a decode
  ever asked for, the sequences at least, and never shrinks);
- `seqs`: {sequence: [lowest, highest position]} in the KV cache after the step (after a
  rollback: the span a later step attends to);
- `kv`: with `LLAMA_KV_CACHE_DEBUG=1` also set, llama.cpp's own lines at the step's first
  ubatch, before its cells are placed, one per cache (gpt-oss: the full layers' and the
  sliding-window layers'): `n` (one past the highest cell in use: the cells every attention
  reads, padded to 256), `used` (cells in use) and `head` (where the search for free cells
  starts).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from server.engine.base import BatchPart
from server.engine.llama_context import LlamaContext

ENV = "GPT_OSS_STEP_TRACE"
_FIND_SLOT = re.compile(r"find_slot: stream\[\d+\], n = +(\d+), used = +(\d+), head = +(\d+)")


class StepTrace:
    """Writes one JSON line per engine step to a file."""

    def __init__(self, ctx: LlamaContext, out: IO[str]) -> None:
        self._ctx = ctx
        self._out = out
        self._kv: list[dict[str, int]] = []
        self._reused = ctx.graphs_reused()
        self._step = 0
        ctx.debug_sink = self._llama_debug

    @classmethod
    def from_env(cls, ctx: LlamaContext) -> StepTrace | None:
        path = os.environ.get(ENV)
        if not path:
            return None
        return cls(ctx, Path(path).open("a", encoding="utf-8", buffering=1))

    def _llama_debug(self, message: str) -> None:
        match = _FIND_SLOT.search(message)
        if match is not None and len(self._kv) < 2:  # the step's first ubatch, each cache
            n, used, head = (int(g) for g in match.groups())
            self._kv.append({"n": n, "used": used, "head": head})

    def step(
        self,
        parts: Sequence[BatchPart],
        seconds: float,
        decode_s: float,
        drafted: int,
        emitted: int,
    ) -> None:
        reused = self._ctx.graphs_reused()
        record: dict[str, Any] = {
            "step": self._step,
            "t_ms": round(seconds * 1000, 3),
            "decode_ms": round(decode_s * 1000, 3),
            "parts": [[p.seq_id, len(p.tokens), _rows(p)] for p in parts],
            "drafted": drafted,
            "emitted": emitted,
            "reused": reused > self._reused,
            "logits_rows": self._ctx.outputs_reserved,
            "seqs": {p.seq_id: self._ctx.seq_span(p.seq_id) for p in parts},
        }
        if self._kv:
            record["kv"] = self._kv
        self._reused = reused
        self._kv = []
        self._step += 1
        self._out.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._ctx.debug_sink = None
        self._out.close()


def _rows(part: BatchPart) -> int:
    if part.all_logits:
        return len(part.tokens)
    return part.outputs if part.logits else 0

"""A decode's stop flag: read by llama.cpp itself (ggml's `ggml_is_empty` on the flag's cells),
so no Python runs while a prompt is evaluated, and a set flag stops the decode (tiny model, CPU
backend: the backend that asks between a graph's operations)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import llama_cpp.llama_cpp as lc
import pytest

from server.engine.base import EngineConfig
from server.engine.llama_context import ABORTED, BatchPart, DecodeError, LlamaContext
from server.engine.stop_flag import StopFlag

PROMPT = [(1000 + 7 * i) % 190_000 for i in range(600)]  # two ubatches: asked between them too


@pytest.fixture(scope="module")
def ctx(tiny_gguf: Path) -> Iterator[LlamaContext]:
    context = LlamaContext(EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=1))
    try:
        yield context
    finally:
        context.close()


def test_a_flag_reads_as_stop_only_once_set() -> None:
    flag = StopFlag()
    assert not flag.is_set
    flag.set()
    assert flag.is_set
    assert not StopFlag().is_set  # each decode's flag starts afresh


def test_a_stoppable_decode_runs_no_python_while_llama_cpp_evaluates(
    ctx: LlamaContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU backend asks the stop question between the graph's operations; with a Python
    callback each answer took the GIL (and waited while the event loop held it)."""
    inside = [False]  # a plain flag: setting it calls nothing the profile would see
    called: list[str] = []
    decodes = [0]
    decode = lc.llama_decode

    def marked(*args: Any) -> int:
        decodes[0] += 1
        inside[0] = True
        code = decode(*args)
        inside[0] = False
        return int(code)

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and inside[0]:
            called.append(frame.f_code.co_name)

    monkeypatch.setattr(lc, "llama_decode", marked)
    ctx.truncate(0, 0)
    sys.setprofile(profile)
    try:
        ctx.decode([BatchPart(0, PROMPT, 0, True)], StopFlag())
    finally:
        sys.setprofile(None)
    assert decodes[0] >= 1  # the decode went through the patched llama_decode
    assert called == []
    assert ctx.seq_end(0) == len(PROMPT)


def test_a_set_flag_stops_the_decode_and_an_unset_one_lets_it_finish(ctx: LlamaContext) -> None:
    ctx.truncate(0, 0)
    flag = StopFlag()
    flag.set()
    with pytest.raises(DecodeError) as stopped:
        ctx.decode([BatchPart(0, PROMPT, 0, True)], flag)
    assert stopped.value.code == ABORTED
    assert ctx.seq_end(0) < len(PROMPT)
    ctx.truncate(0, 0)
    ctx.decode([BatchPart(0, PROMPT, 0, True)], StopFlag())
    assert ctx.seq_end(0) == len(PROMPT)
    ctx.decode([BatchPart(0, [PROMPT[0]], len(PROMPT), True)])  # no flag: nothing asked after it
    assert ctx.seq_end(0) == len(PROMPT) + 1

"""A request seed gives the same tokens every time, on every sampling path of the real engine.

llama.cpp treats the seed 0xFFFFFFFF (LLAMA_DEFAULT_SEED) as "random": no request seed may reach
its sampler chains as that value, whatever it is (2**32 - 1, -1, which the core maps to
2**64 - 1, or a large seed whose low 32 bits are all ones). The tiny model's random weights give
flat distributions, so two runs that draw differently differ within a few tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.directives import Constrain, Directive
from server.engine.base import EngineConfig, SamplingParams
from server.engine.llama import LlamaEngine
from server.harmony.tokens import SPECIALS
from tests.engine.test_llama_engine import run, unique_prompt

SEEDS = [2**32 - 1, 2**64 - 1, 2**33 - 1, 2**32 - 2, 0, 12345]
DIGITS = "root ::= [0-9]+"


@pytest.fixture(scope="module")
def llama_engine(tiny_gguf: Path) -> Iterator[LlamaEngine]:
    """An engine sampling through llama.cpp's own chain (EngineConfig.sampler "llama")."""
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=2, sampler="llama")
    engine = LlamaEngine(config)
    yield engine
    engine.close()


class Digits:
    """Free tokens first, then a grammar: digits only."""

    def __init__(self, n_free: int) -> None:
        self._n_free = n_free
        self._n = 0

    def next(self) -> Directive:
        self._n += 1
        return None if self._n <= self._n_free else Constrain(banned=SPECIALS, grammar=DIGITS)

    def accept(self, token: int) -> None:
        pass


@pytest.mark.parametrize("seed", SEEDS)
def test_llama_chain_repeats_every_seed(
    llama_engine: LlamaEngine, encoding: HarmonyEncoding, seed: int
) -> None:
    prompt = unique_prompt(encoding, "seeds on llama.cpp's chain")
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=seed)
    first, _ = run(llama_engine, prompt, params)
    second, _ = run(llama_engine, prompt, params)
    assert first == second, f"seed {seed:#x} drew differently"


@pytest.mark.parametrize("seed", [2**32 - 1, 2**32 - 2, 2**64 - 1])
@pytest.mark.parametrize("sampler", ["numpy", "llama"])
def test_grammar_stretch_repeats_every_seed(
    engine: LlamaEngine,
    llama_engine: LlamaEngine,
    encoding: HarmonyEncoding,
    sampler: str,
    seed: int,
) -> None:
    """Free tokens, then a grammar under top-k (llama.cpp's chains inside the grammar sampler):
    the whole generation repeats."""
    chosen = engine if sampler == "numpy" else llama_engine
    prompt = unique_prompt(encoding, "seeds under a grammar")
    params = SamplingParams(max_tokens=16, temperature=1.0, top_k=40, seed=seed)
    first, _ = run(chosen, prompt, params, Digits(4))
    second, _ = run(chosen, prompt, params, Digits(4))
    assert first == second, f"seed {seed:#x} drew differently"


def test_other_seeds_draw_otherwise(llama_engine: LlamaEngine, encoding: HarmonyEncoding) -> None:
    """The checks above can fail: different seeds (also ones equal modulo 2**32) differ."""
    prompt = unique_prompt(encoding, "seeds on llama.cpp's chain")
    outputs = []
    for seed in (1, 2, 1 + 2**32):
        tokens, _ = run(llama_engine, prompt, SamplingParams(max_tokens=24, seed=seed))
        outputs.append(tokens)
    assert len({tuple(o) for o in outputs}) == 3

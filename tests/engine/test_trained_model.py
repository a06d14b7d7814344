"""The trained preset builds from the committed parameters, and llama.cpp runs it exactly.

The reference tokens were written by the training model (devkit/train_tiny) on held-out
prompts, greedy; llama.cpp, greedy on the assembled GGUF (MXFP4 experts), must write the same;
on a GGUF whose weights are slightly perturbed the same check must fail.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest

from devkit import floors, models
from devkit.trained import model as trained_model
from server.engine.llama import LlamaEngine

pytestmark = pytest.mark.slow  # builds the trained GGUF (≈160 MB) and evaluates ≈8k-token prompts

PERTURB = 0.1  # the control's weights: each moved by this times its tensor's spread
log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def trained_gguf() -> Path:
    return models.cached_gguf(models.TRAINED)


@pytest.fixture(scope="module")
def engine(trained_gguf: Path) -> Iterator[LlamaEngine]:
    # speculation pinned ("auto" decides from a timing at start: the machine's speed)
    engine = floors.reference_engine(trained_gguf)
    try:
        yield engine
    finally:
        engine.close()


def test_the_gguf_carries_the_trained_shapes(trained_gguf: Path) -> None:
    params = trained_model.load_params()
    dims = json.loads(str(params["dims"]))
    reader = gguf.GGUFReader(trained_gguf)
    fields = {f.name: f for f in reader.fields.values()}
    assert int(fields["gpt-oss.block_count"].parts[-1][0]) == dims["n_layer"]
    assert int(fields["gpt-oss.embedding_length"].parts[-1][0]) == dims["n_embd"]
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == gguf.GGMLQuantizationType.MXFP4
    assert types["token_embd.weight"] == gguf.GGMLQuantizationType.F16
    # the output matrix: the embedding's values rounded to Q8_0 (the reference computes with them)
    assert types["output.weight"] == gguf.GGMLQuantizationType.Q8_0


def test_llama_cpp_writes_the_training_models_greedy_tokens(engine: LlamaEngine) -> None:
    """Token for token, except at a near-tie of the training model: llama.cpp computes in other
    orders and precisions (activations rounded to Q8_0, F16 KV cache, fused kernels), so where
    its top two logits were closer than NEAR_TIE either token is right, and where one of its
    routers' expert choices was that close (a near-tie a token earlier in the sequence reaches
    later ones through attention) llama.cpp may route the other way: it may then write what the
    training model writes with that choice swapped (the reference's alternatives). There the two
    continuations part. Any other difference fails, and so do fewer whole runs written exactly
    than the floor (devkit/floors.py: the near-ties excuse a parting, not many)."""
    exact = floors.exactness(engine)
    log.info("%s; %.3f of tokens until a difference not at a near-tie", exact.runs,
             exact.tokens_agreed)  # fmt: skip
    assert exact.real_differences == [], (exact.real_differences, str(exact.runs))
    assert exact.runs.holds, str(exact.runs)


def test_the_same_check_fails_on_slightly_perturbed_weights(tmp_path: Path) -> None:
    """The control: every layer weight moved by PERTURB of its spread, and the check above
    finds the difference (a part not at a near-tie, or too few exact runs)."""
    gguf = tmp_path / "perturbed.gguf"
    floors.write_gguf(gguf, trained_model.PARAMS, PERTURB)
    engine = floors.reference_engine(gguf)
    try:
        exact = floors.exactness(engine)
    finally:
        engine.close()
    log.info("perturbed by %g: %s; real differences %s", PERTURB, exact.runs,
             exact.real_differences)  # fmt: skip
    assert exact.real_differences or not exact.runs.holds, str(exact.runs)

"""Trained tiny gpt-oss: assemble its GGUF from the committed parameters (no torch needed).

`params.npz` holds what `devkit/train_tiny/train.py` learned: the layer tensors (the
experts as their exact MXFP4 codes and block exponents), the output norm, and the embedding rows
of the tokens the corpus trains. Every other token's row is a fixed random vector regenerated
here from the stored seed and the vocabulary (rows.py), exactly as
training drew it, so the model can copy words it never saw. The token embedding (F16) and the
output matrix (the same values rounded to Q8_0, as the training model's reference computes
with them) cover the whole o200k_harmony vocabulary; vocabulary
and metadata come from server/synth's writers.

`reference.npz` holds held-out prompts and the greedy tokens the training model wrote
for them: the test that llama.cpp, running this GGUF, writes the same tokens.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from numpy.typing import NDArray

from devkit.trained import rows as trained_rows
from server.contracts.vocabulary import N_VOCAB
from server.engine.loading import gpt_oss
from server.synth import build, vocab

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).parent
PARAMS = DATA_DIR / "params.npz"
REFERENCE = DATA_DIR / "reference.npz"
QK = 32


def vocabulary_keys(
    shared: bytes = trained_rows.PREFIXES,
) -> tuple[NDArray[np.int32], NDArray[np.int8]]:
    """Word and prefix of every token id (trained_rows.word_keys over o200k_harmony); `shared`:
    the prefixes whose words share their word's row."""
    tokens = vocab.load_o200k_ranks()
    return trained_rows.word_keys([*tokens, *[b""] * (N_VOCAB - len(tokens))], shared)


def load_params(path: Path = PARAMS) -> dict[str, NDArray[np.generic]]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def preset_of(params: dict[str, NDArray[np.generic]]) -> gpt_oss.Shape:
    dims = json.loads(str(params["dims"]))
    return gpt_oss.Shape(
        "tiny-trained",
        dims["n_layer"],
        dims["n_embd"],
        dims["n_head"],
        dims["n_head_kv"],
        dims["head_dim"],
        dims["n_expert"],
        dims["n_expert_used"],
        dims["n_ff_exp"],
    )


def embedding(params: dict[str, NDArray[np.generic]]) -> NDArray[np.float16]:
    """The whole vocabulary's rows: fixed random, the trained rows put in place."""
    dims = json.loads(str(params["dims"]))
    word_rows = bool(params.get("word_rows", False))
    keys = vocabulary_keys(trained_rows.row_prefixes(params)) if word_rows else None
    rows = trained_rows.random_rows(int(params["seed"]), dims["n_embd"], keys)
    rows[params["trainable_ids"].astype(np.int64)] = params["rows"]
    return rows


def mxfp4_bytes(codes: NDArray[np.generic], exponents: NDArray[np.generic]) -> NDArray[np.uint8]:
    """ggml's MXFP4 blocks: E8M0 byte (value 2^(e-128) per doubled E2M1 step), 16 bytes of
    nibble pairs (element j low, j + 16 high)."""
    c = codes.astype(np.uint8).reshape(*codes.shape[:-1], -1, QK)
    packed = c[..., :16] | (c[..., 16:] << 4)
    e = (exponents.astype(np.int16) + 128).astype(np.uint8)[..., None]
    blocks = np.concatenate([e, packed], axis=-1)
    return np.ascontiguousarray(blocks.reshape(*codes.shape[:-1], -1))


Tensor = tuple[str, NDArray[np.generic], "gguf.GGMLQuantizationType | None"]


def tensors(params: dict[str, NDArray[np.generic]]) -> list[Tensor]:
    """(name, data in GGUF byte layout, quantization type; None: plain numpy dtype)."""
    preset = preset_of(params)
    emb = embedding(params)
    out: list[Tensor] = [
        ("token_embd.weight", emb, None),
        ("output_norm.weight", params["output_norm"].astype(np.float32), None),
        ("output.weight", gguf.quants.quantize(emb.astype(np.float32), gpt_oss.Q8_0), gpt_oss.Q8_0),
    ]

    def f32(key: str) -> NDArray[np.float32]:
        return params[key].astype(np.float32)

    for i in range(preset.n_layer):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", f32(p + "attn_norm"), None),
            (p + "post_attention_norm.weight", f32(p + "post_norm"), None),
            (p + "attn_q.weight", f32(p + "q"), None),
            (p + "attn_q.bias", f32(p + "q_b"), None),
            (p + "attn_k.weight", f32(p + "k"), None),
            (p + "attn_k.bias", f32(p + "k_b"), None),
            (p + "attn_v.weight", f32(p + "v"), None),
            (p + "attn_v.bias", f32(p + "v_b"), None),
            (p + "attn_output.weight", f32(p + "o"), None),
            (p + "attn_output.bias", f32(p + "o_b"), None),
            (p + "attn_sinks.weight", f32(p + "sinks"), None),
            (p + "ffn_gate_inp.weight", f32(p + "router"), None),
            (p + "ffn_gate_inp.bias", f32(p + "router_b"), None),
        ]
        for name, key in (("gate", "gate"), ("up", "up"), ("down", "down")):
            data = mxfp4_bytes(params[p + key + "_codes"], params[p + key + "_exp"])
            out.append((f"{p}ffn_{name}_exps.weight", data, gpt_oss.MXFP4))
            out.append((f"{p}ffn_{name}_exps.bias", f32(p + key + "_b"), None))
    return out


def write_gguf(path: Path, params_path: Path = PARAMS) -> None:
    """The trained model as a GGUF at path (not atomic: devkit.models.build_model renames)."""
    params = load_params(params_path)
    preset = preset_of(params)
    writer = gguf.GGUFWriter(path, gpt_oss.ARCH)
    description = (
        "Tiny gpt-oss trained on synthetic harmony agent conversations (devkit/train_tiny): "
        "real architecture and o200k_harmony vocabulary; it copies, it does not know things."
    )
    build.add_general_metadata(
        writer, "Gpt Oss Tiny Trained", "trained", preset.size_label, description
    )
    build.add_hparams(writer, preset)
    vocab.add_vocab(writer)
    for name, data, qtype in tensors(params):
        if qtype is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def content_hash(params_path: Path = PARAMS) -> str:
    """Cache key of the trained GGUF: this module, the vocabulary writer and the parameters."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for source in build.builder_sources():
        digest.update(source.read_bytes())
    digest.update(Path(trained_rows.__file__).read_bytes())
    digest.update(params_path.read_bytes())
    return digest.hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class ReferenceRun:
    """One held-out prompt and the training model's greedy tokens after it; `margins[i]`: how
    far token i's logit was above the runner-up's there (a near-tie when small);
    `alternatives[i]`: the tokens the training model writes there instead when one of its
    routers' near-ties (an expert choice within 0.05) goes the other way."""

    prompt: list[int]
    tokens: list[int]
    margins: list[float]
    alternatives: list[frozenset[int]]


def load_reference(path: Path = REFERENCE) -> list[ReferenceRun]:
    """The training model's greedy runs on held-out prompts (reference.npz)."""
    with np.load(path) as data:
        prompts = np.split(data["prompts"], np.cumsum(data["prompt_lengths"])[:-1])
        ends = np.cumsum(data["output_lengths"])[:-1]
        outputs = np.split(data["outputs"], ends)
        margins = np.split(data["margins"], ends)
        counts, flat = data.get("alternative_counts"), data.get("alternatives")
    if counts is None or flat is None:  # recorded before routing alternatives were
        counts, flat = np.zeros(sum(len(o) for o in outputs), dtype=np.int32), np.array([])
    starts = np.concatenate([[0], np.cumsum(counts)])
    per_token = [frozenset(int(x) for x in flat[a:b]) for a, b in itertools.pairwise(starts)]
    token_ends = np.cumsum([len(o) for o in outputs])
    alternatives = [per_token[b - len(o) : b] for o, b in zip(outputs, token_ends, strict=True)]
    return [
        ReferenceRun([int(x) for x in p], [int(x) for x in o], [float(x) for x in m], a)
        for p, o, m, a in zip(prompts, outputs, margins, alternatives, strict=True)
    ]

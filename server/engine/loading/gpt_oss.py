"""gpt-oss's facts, as llama.cpp's gpt-oss loader reads them: the hyper-parameters of the
released models, their exact tensor names, shapes and types, and the architecture constants.

A leaf: `gpt-oss-server doctor` estimates a catalog model's memory from these shapes without its
file, and the synthetic GGUF builders (server/synth) write files with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gguf

from server.contracts.vocabulary import N_VOCAB

ARCH = "gpt-oss"
CONTEXT_LENGTH = 131072  # the trained context
SLIDING_WINDOW = 128  # the sliding-window layers' window (every other layer)
ROPE_FREQ_BASE = 150000.0
YARN_FACTOR = 32.0
YARN_ORIG_CONTEXT = 4096
RMS_EPS = 1e-5

F32 = gguf.GGMLQuantizationType.F32
Q8_0 = gguf.GGMLQuantizationType.Q8_0
MXFP4 = gguf.GGMLQuantizationType.MXFP4


@dataclass(frozen=True)
class Shape:
    """The hyper-parameters that size a gpt-oss model."""

    size_label: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int


GPT_OSS_20B = Shape("20B", 24, 2880, 64, 8, 64, 32, 4, 2880)
GPT_OSS_120B = Shape("120B", 36, 2880, 64, 8, 64, 128, 4, 2880)
# The released models by catalog name.
REAL_SHAPES: dict[str, Shape] = {"gpt-oss-20b": GPT_OSS_20B, "gpt-oss-120b": GPT_OSS_120B}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: gguf name, ggml shape (ne0 first) and type."""

    name: str
    shape: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def byte_shape(self) -> tuple[int, ...]:
        block_size, type_size = gguf.GGML_QUANT_SIZES[self.qtype]
        *outer, row = self.numpy_shape
        return (*outer, row // block_size * type_size)

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.shape) if self.qtype == F32 else math.prod(self.byte_shape)


def layer_specs(p: Shape, i: int) -> list[TensorSpec]:
    """Tensors of block i, with the shapes llama_model_openai_moe::load_arch_tensors creates."""
    n_q, n_kv = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
    emb, ff, ne = p.n_embd, p.n_ff_exp, p.n_expert
    return [
        TensorSpec(f"blk.{i}.attn_norm.weight", (emb,), F32),
        TensorSpec(f"blk.{i}.post_attention_norm.weight", (emb,), F32),
        TensorSpec(f"blk.{i}.attn_q.weight", (emb, n_q), Q8_0),
        TensorSpec(f"blk.{i}.attn_q.bias", (n_q,), F32),
        TensorSpec(f"blk.{i}.attn_k.weight", (emb, n_kv), Q8_0),
        TensorSpec(f"blk.{i}.attn_k.bias", (n_kv,), F32),
        TensorSpec(f"blk.{i}.attn_v.weight", (emb, n_kv), Q8_0),
        TensorSpec(f"blk.{i}.attn_v.bias", (n_kv,), F32),
        TensorSpec(f"blk.{i}.attn_output.weight", (n_q, emb), Q8_0),
        TensorSpec(f"blk.{i}.attn_output.bias", (emb,), F32),
        TensorSpec(f"blk.{i}.attn_sinks.weight", (p.n_head,), F32),
        TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (emb, ne), F32),
        TensorSpec(f"blk.{i}.ffn_gate_inp.bias", (ne,), F32),
        TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (emb, ff, ne), MXFP4),
        TensorSpec(f"blk.{i}.ffn_gate_exps.bias", (ff, ne), F32),
        TensorSpec(f"blk.{i}.ffn_up_exps.weight", (emb, ff, ne), MXFP4),
        TensorSpec(f"blk.{i}.ffn_up_exps.bias", (ff, ne), F32),
        TensorSpec(f"blk.{i}.ffn_down_exps.weight", (ff, emb, ne), MXFP4),
        TensorSpec(f"blk.{i}.ffn_down_exps.bias", (emb, ne), F32),
    ]


def tensor_specs(p: Shape) -> list[TensorSpec]:
    """All tensors of the model, in file order."""
    specs = [
        TensorSpec("token_embd.weight", (p.n_embd, N_VOCAB), Q8_0),
        TensorSpec("output_norm.weight", (p.n_embd,), F32),
        TensorSpec("output.weight", (p.n_embd, N_VOCAB), Q8_0),
    ]
    for i in range(p.n_layer):
        specs += layer_specs(p, i)
    return specs

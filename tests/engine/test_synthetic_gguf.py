"""The synthetic tiny gpt-oss GGUF loads, tokenizes and runs in llama.cpp like the real model."""

from __future__ import annotations

import ctypes
import fcntl
import functools
import logging
import math
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as llama
import numpy as np
import pytest

from devkit import models
from server.contracts.vocabulary import N_VOCAB
from server.engine.base import EngineConfig
from server.engine.disk_cache import prompt_cache
from server.engine.disk_cache.state_layout import StateLayout
from server.engine.loading import gpt_oss
from server.synth import build
from server.synth import vocab as synth_vocab

ORDINARY_TEXTS = [
    "Hello, world!",
    "def f(x):\n    return x",
    "In 2024, 3.14159 * 1234567 = 3878509.8 (approx.)",
    "naïve café, 東京タワー and Привет мир 🚀🦙",
    "  leading spaces,\ttabs\n\n\nand I'm sure they'll've DONE IT'S",
]


@pytest.fixture(scope="module")
def model_path() -> Path:
    return models.cached_gguf("tiny")


@pytest.fixture(scope="module")
def model(model_path: Path) -> Iterator[llama.llama_model_p]:
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    llama.llama_backend_init()
    handle = llama.llama_model_load_from_file(
        str(model_path).encode(), llama.llama_model_default_params()
    )
    assert handle, "llama.cpp failed to load the synthetic GGUF"
    yield handle
    llama.llama_model_free(handle)


@pytest.fixture(scope="module")
def vocab(model: llama.llama_model_p) -> llama.llama_vocab_p:
    handle: llama.llama_vocab_p = llama.llama_model_get_vocab(model)
    return handle


def meta(model: llama.llama_model_p, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = llama.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    assert n >= 0, f"metadata key {key} missing"
    return buf.value.decode()


def tokenize(vocab: llama.llama_vocab_p, text: str, special: bool) -> list[int]:
    data = text.encode()
    out = (llama.llama_token * (len(data) + 8))()
    n = llama.llama_tokenize(vocab, data, len(data), out, len(out), False, special)
    assert n >= 0
    return list(out[:n])


@functools.cache
def o200k() -> Any:
    with warnings.catch_warnings():  # bpe_openai uses deprecated importlib.resources calls
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai

        return bpe_openai.get_encoding("o200k_base")


def o200k_encode(text: str) -> list[int]:
    return list(o200k().encode(text))


def test_file_is_small(model_path: Path) -> None:
    assert model_path.stat().st_size < 60 * 1024 * 1024


def test_loads_as_gpt_oss(model: llama.llama_model_p, vocab: llama.llama_vocab_p) -> None:
    assert meta(model, "general.architecture") == "gpt-oss"
    assert meta(model, "tokenizer.ggml.pre") == "gpt-4o"
    assert llama.llama_vocab_n_tokens(vocab) == N_VOCAB
    assert llama.llama_model_n_layer(model) == build.PRESETS["tiny"].n_layer
    assert llama.llama_model_n_swa(model) == 128
    assert llama.llama_model_n_embd(model) == build.PRESETS["tiny"].n_embd


def test_special_token_ids(vocab: llama.llama_vocab_p) -> None:
    assert llama.llama_vocab_bos(vocab) == 199998
    assert llama.llama_vocab_eos(vocab) == 200002
    assert tokenize(vocab, "<|start|>", special=True) == [200006]
    assert tokenize(vocab, "<|return|>", special=True) == [200002]
    for token_id, text in synth_vocab.HARMONY_SPECIALS.items():
        assert tokenize(vocab, text, special=True) == [token_id]
    # Without special parsing CONTROL tokens are ordinary text ...
    assert tokenize(vocab, "<|return|>", special=False) == o200k_encode("<|return|>")
    # ... but llama.cpp's gpt-oss hack makes these USER_DEFINED, parsed even then.
    for token_id in (200003, 200005, 200006, 200007, 200008):
        text = synth_vocab.HARMONY_SPECIALS[token_id]
        assert tokenize(vocab, text, special=False) == [token_id]


def test_end_of_generation_tokens(vocab: llama.llama_vocab_p) -> None:
    assert llama.llama_vocab_is_eog(vocab, 200002)  # <|return|>
    assert llama.llama_vocab_is_eog(vocab, 200012)  # <|call|>
    assert not llama.llama_vocab_is_eog(vocab, 200007)  # <|end|> ends a message, not generation
    assert not llama.llama_vocab_is_eog(vocab, 200006)  # <|start|>


@pytest.mark.parametrize("text", ORDINARY_TEXTS)
def test_ordinary_text_matches_o200k(vocab: llama.llama_vocab_p, text: str) -> None:
    expected = o200k_encode(text)
    assert expected, "reference tokenizer returned nothing"
    assert tokenize(vocab, text, special=False) == expected


def test_o200k_reference_agrees_with_openai_harmony(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harmony = pytest.importorskip("openai_harmony")
    (tmp_path / "o200k_base.tiktoken").write_bytes(synth_vocab.o200k_tiktoken_bytes())
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    encoding = harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    for text in ORDINARY_TEXTS:
        assert encoding.encode(text, allowed_special="all") == o200k_encode(text)
    assert encoding.encode("<|start|><|return|>", allowed_special="all") == [200006, 200002]


def test_harmony_message_tokenization(vocab: llama.llama_vocab_p) -> None:
    text = "<|start|>assistant<|channel|>final<|message|>Hi there!<|return|>"
    expected = [200006, *o200k_encode("assistant"), 200005, *o200k_encode("final")]
    expected += [200008, *o200k_encode("Hi there!"), 200002]
    assert tokenize(vocab, text, special=True) == expected


def test_decoding_gives_finite_logits(
    model: llama.llama_model_p, vocab: llama.llama_vocab_p
) -> None:
    params = llama.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_threads, params.n_threads_batch = 256, 64, 2, 2
    ctx = llama.llama_init_from_model(model, params)
    assert ctx
    try:
        prompt = tokenize(vocab, "<|start|>user<|message|>Count to ten.<|end|>", special=True)
        tokens = (llama.llama_token * len(prompt))(*prompt)
        assert llama.llama_decode(ctx, llama.llama_batch_get_one(tokens, len(prompt))) == 0
        generated: list[int] = []
        for _ in range(8):
            logits = np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, -1), shape=(N_VOCAB,))
            assert np.isfinite(logits).all()
            assert float(logits.std()) > 1e-3, "logits are degenerate"
            generated.append(int(logits.argmax()))
            one = (llama.llama_token * 1)(generated[-1])
            assert llama.llama_decode(ctx, llama.llama_batch_get_one(one, 1)) == 0
        assert all(0 <= t < N_VOCAB for t in generated)
    finally:
        llama.llama_free(ctx)


def test_20b_preset_shapes_and_size() -> None:
    specs = gpt_oss.tensor_specs(build.PRESETS["20b"])
    by_name = {s.name: s for s in specs}
    assert len(specs) == 3 + 24 * 19
    assert by_name["blk.0.attn_q.weight"].shape == (2880, 4096)
    assert by_name["blk.0.attn_k.weight"].shape == (2880, 512)
    assert by_name["blk.23.ffn_down_exps.weight"].shape == (2880, 2880, 32)
    assert by_name["blk.23.ffn_down_exps.weight"].qtype == gpt_oss.MXFP4
    assert by_name["token_embd.weight"].qtype == gpt_oss.Q8_0
    total = sum(s.nbytes for s in specs)
    assert 11.5e9 < total < 12.5e9


def test_the_20b_slice_is_the_20b_with_four_layers() -> None:
    full = {s.name: s for s in gpt_oss.tensor_specs(build.PRESETS["20b"])}
    specs = gpt_oss.tensor_specs(build.PRESETS["20b-4l"])
    assert len(specs) == 3 + 4 * 19
    assert all(full[s.name] == s for s in specs)  # the 20b's tensors, blk.0 to blk.3
    assert "blk.3.ffn_down_exps.weight" in {s.name for s in specs}
    assert 2.9e9 < sum(s.nbytes for s in specs) < 3.2e9


def test_generated_blocks_are_deterministic_and_sane() -> None:
    spec = gpt_oss.TensorSpec("x", (64, 8), gpt_oss.Q8_0)
    a = build.generate_q8_0(spec, 0.02, np.random.default_rng([7, 0]))
    b = build.generate_q8_0(spec, 0.02, np.random.default_rng([7, 0]))
    assert a.shape == (8, 68)
    assert np.array_equal(a, b)
    scales = a.reshape(-1, 34)[:, :2].copy().view(np.float16).astype(np.float64)
    assert np.all(np.isfinite(scales))
    assert math.isclose(float(scales.mean()) * build.INT8_STD, 0.02, rel_tol=0.2)
    mx = gpt_oss.TensorSpec("y", (64, 4, 2), gpt_oss.MXFP4)
    exps = build.generate_mxfp4(mx, 0.02, np.random.default_rng(1)).reshape(-1, 17)[:, 0]
    assert set(np.unique(exps).tolist()) <= {119, 120, 121}


def test_cached_gguf_reuses_file(model_path: Path) -> None:
    again = models.cached_gguf("tiny", cache_dir=model_path.parent)
    assert again == model_path
    assert models.builder_hash() in model_path.name


def _build_at(directory: Path, name: str, age_s: float) -> Path:
    path = directory / name
    path.write_bytes(b"GGUF")
    used = time.time() - age_s
    os.utime(path, (used, used))
    return path


def test_a_new_build_removes_the_presets_unused_builds(tmp_path: Path) -> None:
    """A changed builder names a new file; the builds it replaces go once unused for an hour,
    but the newest other one stays (another checkout may use it), as do other presets'."""
    hour = models.STALE_AFTER_S
    newest_old = _build_at(tmp_path, "gpt-oss-tiny-synthetic-111111111111.gguf", 2 * hour)
    older = _build_at(tmp_path, "gpt-oss-tiny-synthetic-222222222222.gguf", 3 * hour)
    oldest = _build_at(tmp_path, "gpt-oss-tiny-synthetic-333333333333.gguf", 4 * hour)
    (tmp_path / f".{oldest.name}.lock").touch()
    other_preset = _build_at(tmp_path, "gpt-oss-20b-synthetic-444444444444.gguf", 5 * hour)
    trained = _build_at(tmp_path, "gpt-oss-trained-555555555555.gguf", 5 * hour)

    path = models.cached_gguf("tiny", cache_dir=tmp_path)

    assert models.builder_hash() in path.name
    assert [p.exists() for p in (path, newest_old, other_preset, trained)] == [True] * 4
    assert [p.exists() for p in (older, oldest)] == [False, False]
    assert not (tmp_path / f".{oldest.name}.lock").exists()


def test_recently_used_or_locked_builds_stay(tmp_path: Path) -> None:
    hour = models.STALE_AFTER_S
    keep = _build_at(tmp_path, "gpt-oss-tiny-synthetic-000000000000.gguf", 0)
    newest = _build_at(tmp_path, "gpt-oss-tiny-synthetic-111111111111.gguf", 0.5 * hour)
    recent = _build_at(tmp_path, "gpt-oss-tiny-synthetic-222222222222.gguf", 0.9 * hour)
    in_use = _build_at(tmp_path, "gpt-oss-tiny-synthetic-333333333333.gguf", 9 * hour)
    stale = _build_at(tmp_path, "gpt-oss-tiny-synthetic-444444444444.gguf", 9 * hour)
    with open(tmp_path / f".{in_use.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # a process marking it used at this moment
        removed = models.prune_builds(tmp_path, "gpt-oss-tiny-synthetic-", keep)
    assert removed == [stale]
    assert all(p.exists() for p in (keep, newest, recent, in_use))


def test_a_cache_hit_marks_the_build_used_and_leaves_the_file_alone(tmp_path: Path) -> None:
    """What pruning reads: a build a test session picks up again is not stale. The model
    file's mtime stays as it was: it is part of the prompt cache's identity of the states saved
    for it, so a server restarted while another test session starts still finds them."""
    path = models.cached_gguf("tiny", cache_dir=tmp_path)
    os.utime(path, (1.0, 1.0))
    layout = StateLayout(magic="d83c14af", n_stream=1, v_trans=False)
    identity = prompt_cache.identity(EngineConfig(model_path=str(path)), 4096, layout)
    assert models.cached_gguf("tiny", cache_dir=tmp_path) == path
    assert time.time() - models._last_used(path) < 60
    assert path.stat().st_mtime == 1.0
    assert prompt_cache.identity(EngineConfig(model_path=str(path)), 4096, layout) == identity

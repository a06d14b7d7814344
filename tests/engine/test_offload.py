"""llama_model_params built by server.engine.loading.offload reach llama.cpp: the expert overrides,
the load mode and the progress callback, on the real library and the tiny GGUF."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as lc
import pytest
from tqdm import tqdm

from server.engine.base import EngineConfig
from server.engine.ggml import functions as ggml_functions
from server.engine.llama_context import LlamaContext
from server.engine.loading import offload
from server.engine.loading.placement import ContextShape, expert_patterns
from server.ops.model_source import resolve_model
from tests.support.split_gguf import split_gguf

CPU_DEVICE, GPU_DEVICE, IGPU_DEVICE = 0, 1, 2  # enum ggml_backend_dev_type


def test_expert_overrides_and_progress_reach_llama_cpp(
    tiny_gguf: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    bars: list[tqdm[Any]] = []

    def visible_bar(**options: Any) -> tqdm[Any]:
        options.pop("disable")
        bars.append(tqdm(file=io.StringIO(), disable=False, **options))
        return bars[-1]

    monkeypatch.setattr(offload, "tqdm", visible_bar)
    config = EngineConfig(
        model_path=str(tiny_gguf),
        n_ctx=256,
        n_threads=2,
        cpu_tensor_patterns=expert_patterns(n_layer=2, first_gpu_layer=0, n_cpu_moe=1),
    )
    with caplog.at_level(logging.DEBUG, logger="llama_cpp"):
        LlamaContext(config).close()
    overridden = re.findall(r"tensor (\S+) \(.*\) buffer type overridden", caplog.text)
    assert sorted(overridden) == sorted(
        f"blk.0.ffn_{part}_exps.{kind}"
        for part in ("gate", "up", "down")
        for kind in ("weight", "bias")
    )
    assert "load_mode = none" in caplog.text  # use_mmap=False really turns mmap off
    assert bars[0].n == 100


def test_progress_callback_moves_the_bar() -> None:
    bar = tqdm(total=100, file=io.StringIO(), disable=False)
    callback = offload.progress_callback(bar)
    assert callback(0.25, None) is True
    assert bar.n == 25
    callback(1.0, None)
    assert bar.n == 100


def registry() -> list[tuple[str, int, str]]:
    """Every device in ggml's registry, read here independently: (name, type, backend)."""
    ggml = ggml_functions()
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(i)
        backend = ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(device))
        name = ggml.ggml_backend_dev_name(device).decode()
        found.append((name, int(ggml.ggml_backend_dev_type(device)), backend.decode()))
    return found


def test_gpu_devices_are_the_registrys_gpus() -> None:
    """The GPUs offload lists are exactly the registry's discrete and integrated GPUs (none of an
    RPC host: this process registered none), with sane memory figures; on a build that cannot
    offload, none. The CPU is always there and never listed."""
    devices = registry()
    assert any(kind == CPU_DEVICE for _, kind, _ in devices), devices
    gpus = offload.gpu_devices()
    assert all(gpu.total >= gpu.free >= 0 for gpu in gpus)
    assert not any(gpu.host for gpu in gpus)
    expected = [name for name, kind, _ in devices if kind in (GPU_DEVICE, IGPU_DEVICE)]
    if not lc.llama_supports_gpu_offload():
        expected = []
    assert sorted(gpu.name for gpu in gpus) == sorted(expected)


def test_an_rpc_build_offloads_but_lists_no_device_before_hosts_are_registered() -> None:
    """What CI's CPU + RPC build reports: offload is supported (to RPC hosts), the RPC backend
    is registered, and it has no device until --rpc hosts are added."""
    if not lc.llama_supports_rpc():
        pytest.skip("this llama-cpp-python build has no RPC backend")
    assert lc.llama_supports_gpu_offload()
    ggml = ggml_functions()
    rpc = ggml.ggml_backend_reg_by_name(b"RPC")
    assert rpc
    assert ggml.ggml_backend_reg_dev_count(rpc) == 0
    assert not [name for name, _, backend in registry() if backend == "RPC"]


def test_a_split_model_resolves_is_measured_across_parts_and_loads(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    parts = split_gguf(tiny_gguf, tmp_path, "gpt-oss-tiny-mxfp4", n_parts=3)
    model = resolve_model(str(parts[1]))  # any part: the first is loaded
    assert (model.path, model.name) == (parts[0], "gpt-oss-tiny-mxfp4")
    context = ContextShape(256)
    assert offload.model_footprint(parts[0], context) == offload.model_footprint(tiny_gguf, context)
    whole = LlamaContext(EngineConfig(model_path=str(tiny_gguf), n_ctx=256, n_threads=2))
    split = LlamaContext(EngineConfig(model_path=str(parts[0]), n_ctx=256, n_threads=2))
    try:
        assert split.info.n_params == whole.info.n_params
        assert split.token_text(200006) == "<|start|>"
    finally:
        split.close()
        whole.close()

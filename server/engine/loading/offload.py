"""GPU offload through llama.cpp: measure the GPUs and the model, build llama_model_params.

The decision itself is placement.py's pure plan_placement(); this module gathers its inputs
(free memory of each GPU from the ggml backend device API, tensor sizes from the GGUF header)
and turns a decision into llama_model_params: n_gpu_layers, tensor buffer-type overrides to the
CPU buffer type (as llama.cpp's `--cpu-moe` / `--n-cpu-moe` do), the load mode, and a progress
bar (tqdm, like huggingface-hub's downloads) fed by llama.cpp's progress callback.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as lc
from tqdm.auto import tqdm
from tqdm.std import tqdm as std_tqdm

from server.engine.base import EngineConfig
from server.engine.ggml import functions as ggml_functions
from server.engine.ggml import retired
from server.engine.loading.gguf_header import (
    GGUFFormatError,
    TensorInfo,
    read_metadata,
    read_tensor_infos,
    split_paths,
)
from server.engine.loading.placement import (
    ContextShape,
    GpuMemory,
    Hyperparameters,
    ModelFootprint,
    Placement,
    PlacementOptions,
    footprint,
    plan_placement,
)

log = logging.getLogger(__name__)

_HPARAM_KEYS = (
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.sliding_window",
    "context_length",
)
# enum ggml_backend_dev_type: CPU, GPU (dedicated memory), IGPU (host memory), ACCEL, META.
_GPU_TYPES = (1, 2)


class _BufferTypeOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override (the bindings declare the field as void *)."""

    _fields_ = (("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p))


def plan(config: EngineConfig, options: PlacementOptions) -> Placement:
    """Where the model of `config` goes on this machine's GPUs (none on a CPU-only build)."""
    flash_attn = config.flash_attn != "off"
    gpus = gpu_devices()
    model = model_footprint(
        Path(config.model_path),
        ContextShape(config.n_ctx, config.n_ubatch, config.n_slots, config.swa_full, flash_attn),
    )
    return plan_placement(model, gpus, options)


def gpu_devices() -> list[GpuMemory]:
    """The GPUs llama.cpp can offload to, with their free memory now; [] on a CPU-only build.

    Devices of RPC hosts (server.engine.rpc.backend) count as GPUs and come first, as in llama.cpp's
    own device order (fewer transfers over the network).
    """
    return [memory for _, memory in _offload_devices()]


def _offload_devices() -> list[tuple[int, GpuMemory]]:
    if not lc.llama_supports_gpu_offload():
        return []
    ggml = ggml_functions()
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(device) not in _GPU_TYPES or retired(int(device)):
            continue  # a retired RPC device: its stuck connection would never answer
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        description = _text(ggml.ggml_backend_dev_description(device))
        remote = _text(ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(device)))
        memory = GpuMemory(
            name=_text(ggml.ggml_backend_dev_name(device)),
            description="RPC host" if remote == "RPC" else description,
            free=int(free.value),
            total=int(total.value),
            host=description if remote == "RPC" else "",
        )
        found.append((int(device), memory))
    return sorted(found, key=lambda found: not found[1].host)


def model_footprint(path: Path, context: ContextShape) -> ModelFootprint:
    """Tensor sizes of every part of the model file, with KV cache and compute estimates.

    Raises GGUFFormatError (or OSError) when a part is missing or damaged.
    """
    tensors = [t for part in split_paths(path) for t in read_tensor_infos(part)]
    hparams, n_ctx_train = _hyperparameters(path, tensors)
    if context.n_ctx <= 0:
        context = replace(context, n_ctx=n_ctx_train)
    return footprint([(t.name, t.n_bytes) for t in tensors], hparams, context)


@contextmanager
def model_params(config: EngineConfig, abort: Callable[[], bool] | None = None) -> Iterator[Any]:
    """llama_model_params for `config`, valid (with what they point to) inside the block; the
    load stops (llama.cpp returns no model) once `abort()` is true."""
    params = lc.llama_model_default_params()
    params.n_gpu_layers = config.n_gpu_layers
    params.load_mode = lc.LLAMA_LOAD_MODE_MMAP if config.use_mmap else lc.LLAMA_LOAD_MODE_NONE
    params.use_extra_bufts = config.cpu_repack
    overrides = _cpu_overrides(config.cpu_tensor_patterns)
    if overrides is not None:
        params.tensor_buft_overrides = ctypes.addressof(overrides)
    devices = _device_list() if config.rpc_servers else None
    if devices is not None:  # RPC hosts first, then the local GPUs: the order planned with
        params.devices = ctypes.addressof(devices)
    split = _tensor_split(config.tensor_split)
    if split is not None:
        params.tensor_split = split
    name = Path(config.model_path).name
    with tqdm(total=100, desc=f"loading {name}", unit="%", disable=None) as bar:
        params.progress_callback = progress_callback(bar, abort)
        yield params


def progress_callback(bar: std_tqdm[Any], abort: Callable[[], bool] | None = None) -> Any:
    """A llama_progress_callback moving `bar` (0-100 %), false (stop loading) once `abort()`
    is true; keep it referenced while loading."""

    @lc.llama_progress_callback  # type: ignore[untyped-decorator]
    def report(progress: float, _user_data: ctypes.c_void_p) -> bool:
        try:
            bar.update(max(0, round(progress * 100) - bar.n))
        except Exception:  # a display problem must never abort the load
            log.debug("progress bar update failed", exc_info=True)
        return abort is None or not abort()

    return report


def _device_list() -> ctypes.Array[ctypes.c_void_p]:
    """A NULL-terminated ggml_backend_dev_t array of the devices gpu_devices() lists."""
    handles = [handle for handle, _ in _offload_devices()]
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)


def _tensor_split(weights: tuple[float, ...]) -> ctypes.Array[ctypes.c_float] | None:
    if len(weights) < 2:
        return None
    n_max = int(lc.llama_max_devices())
    if len(weights) > n_max:
        raise RuntimeError(f"{len(weights)} devices, but this llama.cpp build takes {n_max}")
    return (ctypes.c_float * n_max)(*weights)


def _cpu_overrides(patterns: tuple[str, ...]) -> ctypes.Array[_BufferTypeOverride] | None:
    """A NULL-terminated override array sending `patterns` to the CPU buffer type."""
    if not patterns:
        return None
    cpu = ggml_functions().ggml_backend_cpu_buffer_type()
    overrides = (_BufferTypeOverride * (len(patterns) + 1))()
    for entry, pattern in zip(overrides, patterns, strict=False):
        entry.pattern = pattern.encode()
        entry.buft = cpu
    return overrides


def _text(value: bytes | None) -> str:
    return value.decode("utf-8", errors="replace") if value else ""


def _hyperparameters(path: Path, tensors: list[TensorInfo]) -> tuple[Hyperparameters, int]:
    """The KV-cache-relevant hyper-parameters and the training context length."""
    arch = read_metadata(path, ["general.architecture"]).get("general.architecture", "gpt-oss")
    meta = read_metadata(path, [f"{arch}.{key}" for key in _HPARAM_KEYS])

    def value(key: str, default: int | None = None) -> int:
        found = meta.get(f"{arch}.{key}", default)
        found = max(found) if isinstance(found, list) and found else found
        if not isinstance(found, int):
            raise GGUFFormatError(f"the metadata has no {arch}.{key}")
        return found

    n_embd, n_head = value("embedding_length"), value("attention.head_count")
    embeddings = [t.shape for t in tensors if t.name == "token_embd.weight"]
    hparams = Hyperparameters(
        n_layer=value("block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=value("attention.head_count_kv", n_head),
        head_dim=value("attention.key_length", n_embd // n_head),
        n_vocab=embeddings[0][-1] if embeddings else 0,
        n_swa=value("attention.sliding_window", 0),
    )
    return hparams, value("context_length", 0)

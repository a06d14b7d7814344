"""Decide where the model's tensors go: how many layers on the GPU, which MoE experts on the CPU.

Pure functions only: the inputs are the model's tensor sizes per layer, the KV cache and compute
buffer estimates, the free memory of each GPU and the user's options; the output is the value of
llama.cpp's `n_gpu_layers`, the tensor buffer-type override patterns that keep expert tensors in
system memory (llama.cpp's `--cpu-moe` / `--n-cpu-moe` regexes), and a plan for people to read.

How llama.cpp places a model (src/llama-model.cpp): the input layer (token embeddings) always
stays on the CPU; `n_gpu_layers = k` puts the last k of the n_layer + 1 "layers" on the GPU, the
extra last one being the output layer (output norm and head); -1 means all. The KV cache of a
layer lives where the layer lives. An override pattern matched against a tensor's name sends the
tensor to the CPU buffer type whatever its layer.

The `auto` decision: everything on the GPU if it fits; for a mixture-of-experts model, then keep
the experts of the first N layers on the CPU with the smallest N that fits (attention and the
KV cache stay on the GPU: they are what every token touches); if even all experts on the CPU do
not fit, offload as many whole layers as fit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

# llama.cpp's LLM_FFN_EXPS_REGEX (common/common.h): the expert tensors of a MoE block.
EXPERTS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
DEFAULT_MARGIN_BYTES = 1024**3  # llama.cpp's --fit default: 1 GiB left free per device
KV_BYTES_PER_VALUE = 2  # f16 K and V cache
GIB = 1024**3
_LAYER = re.compile(r"blk\.(\d+)\.")
_EXPERTS = re.compile(EXPERTS_REGEX)


@dataclass(frozen=True, slots=True)
class LayerSizes:
    """Bytes of one transformer block."""

    dense: int  # attention, norms, router: used by every token
    experts: int  # ffn_*_exps weights and biases: may be kept on the CPU
    kv: int  # this layer's share of the KV cache at the chosen context


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    """What the model needs in memory, layer by layer."""

    layers: tuple[LayerSizes, ...]
    input: int  # token embeddings: always in system memory
    output: int  # output norm and head: on the GPU when any layer is offloaded
    compute: int  # the GPU's compute buffer (activations, logits of a batch)

    @property
    def is_moe(self) -> bool:
        return any(layer.experts for layer in self.layers)

    @property
    def total(self) -> int:
        weights = sum(layer.dense + layer.experts + layer.kv for layer in self.layers)
        return weights + self.input + self.output


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """One GPU as the ggml backend reports it."""

    name: str
    description: str
    free: int
    total: int
    host: str = ""  # "" for this machine; HOST:PORT for a device of an RPC host


@dataclass(frozen=True, slots=True)
class PlacementOptions:
    """What the user asked for."""

    n_gpu_layers: int | Literal["auto"] = "auto"  # -1: all layers
    cpu_moe: bool = False  # keep every layer's experts on the CPU
    n_cpu_moe: int = 0  # keep the experts of the first N layers on the CPU
    margin: int = DEFAULT_MARGIN_BYTES  # free memory to leave on each GPU (auto)


@dataclass(frozen=True, slots=True)
class Placement:
    """The decision, ready for llama_model_params, and its explanation."""

    n_gpu_layers: int  # for llama_model_params: -1 all, 0 none, k the last k
    n_cpu_moe: int  # layers, from the first, whose experts stay on the CPU
    cpu_patterns: tuple[str, ...]  # tensor name regexes sent to the CPU buffer type
    gpu_bytes: int  # estimated device memory used (all GPUs together)
    cpu_bytes: int  # estimated system memory used by weights and KV cache
    budget: int | None  # device memory available after the margin; None without a GPU
    summary: str  # one line for the banner
    lines: tuple[str, ...]  # the plan, for the start-up log
    tensor_split: tuple[float, ...] = ()  # llama.cpp's split between several devices

    @property
    def fits(self) -> bool:
        return self.budget is None or self.gpu_bytes <= self.budget


def plan_placement(
    model: ModelFootprint, gpus: Sequence[GpuMemory], options: PlacementOptions
) -> Placement:
    """Where each part of the model goes (see the module docstring for the rules)."""
    n_layer = len(model.layers)
    min_cpu_moe = n_layer if options.cpu_moe else min(options.n_cpu_moe, n_layer)
    if not model.is_moe:
        min_cpu_moe = 0
    if not gpus:
        return _cpu_only(model, options)
    budget = sum(max(0, gpu.free - options.margin) for gpu in gpus)
    if options.n_gpu_layers == "auto":
        layout = _fit(model, budget, min_cpu_moe)
    else:
        requested = options.n_gpu_layers
        k = n_layer + 1 if requested < 0 else min(requested, n_layer + 1)
        layout = _Layout(model, k, min_cpu_moe)
    return _describe(layout, gpus, budget, options.margin)


@dataclass(frozen=True, slots=True)
class _Layout:
    """The last k of the n_layer + 1 layers on the GPU; experts of layers < n_cpu_moe on the CPU."""

    model: ModelFootprint
    k: int
    n_cpu_moe: int

    @property
    def first(self) -> int:
        """The first offloaded layer (n_layer when only the output is, or nothing)."""
        n_layer = len(self.model.layers)
        return min(n_layer, max(n_layer + 1 - self.k, 0))

    @property
    def offloaded(self) -> int:
        return len(self.model.layers) - self.first

    def gpu_parts(self) -> dict[str, int]:
        if self.k <= 0:
            return {}
        layers = list(enumerate(self.model.layers))[self.first :]
        return {
            "weights": self.model.output + sum(layer.dense for _, layer in layers),
            "experts": sum(layer.experts for i, layer in layers if i >= self.n_cpu_moe),
            "KV cache": sum(layer.kv for _, layer in layers),
            "compute": self.model.compute,
        }

    def cpu_parts(self) -> dict[str, int]:
        cpu_layers = self.model.layers[: self.first]
        parts = {
            "token embeddings": self.model.input,
            "output": self.model.output if self.k <= 0 else 0,
            f"{len(cpu_layers)} layers": sum(layer.dense + layer.experts for layer in cpu_layers),
            "their KV cache": sum(layer.kv for layer in cpu_layers),
            f"experts of {max(0, self.n_cpu_moe - self.first)} offloaded layers": sum(
                layer.experts for layer in self.model.layers[self.first : self.n_cpu_moe]
            ),
        }
        return {name: size for name, size in parts.items() if size}

    @property
    def gpu_bytes(self) -> int:
        return sum(self.gpu_parts().values())


def _fit(model: ModelFootprint, budget: int, min_cpu_moe: int) -> _Layout:
    n_layer = len(model.layers)
    max_cpu_moe = n_layer if model.is_moe else 0
    for n_cpu_moe in range(min_cpu_moe, max_cpu_moe + 1):
        layout = _Layout(model, n_layer + 1, n_cpu_moe)
        if layout.gpu_bytes <= budget:
            return layout
    for k in range(n_layer, 0, -1):
        layout = _Layout(model, k, max_cpu_moe)
        if layout.gpu_bytes <= budget:
            return layout
    return _Layout(model, 0, min_cpu_moe)


def expert_patterns(n_layer: int, first_gpu_layer: int, n_cpu_moe: int) -> tuple[str, ...]:
    """Override regexes keeping the experts of layers [0, n_cpu_moe) on the CPU.

    Only offloaded layers need one (the others are on the CPU anyway); all layers use
    llama.cpp's single `--cpu-moe` pattern, some use its per-layer `--n-cpu-moe` patterns.
    """
    if n_cpu_moe <= first_gpu_layer:
        return ()
    if n_cpu_moe >= n_layer:
        return (EXPERTS_REGEX,)
    return tuple(rf"blk\.{i}{EXPERTS_REGEX}" for i in range(first_gpu_layer, n_cpu_moe))


def _cpu_only(model: ModelFootprint, options: PlacementOptions) -> Placement:
    n_layer = len(model.layers)
    layout = _Layout(model, 0, 0)
    lines = [
        "placement: no GPU this llama-cpp-python build can use (and no --rpc host): "
        "everything on the CPU",
        f"  system memory ≈{_gib(model.total)}: {_parts(layout.cpu_parts())}",
    ]
    if options.n_gpu_layers not in ("auto", 0):
        lines.append(
            f"  --n-gpu-layers {options.n_gpu_layers} ignored; for a GPU, build "
            "llama-cpp-python for it: python scripts/install_llama_cpp.py (docs/gpu.md)"
        )
    return Placement(
        n_gpu_layers=0,
        n_cpu_moe=0,
        cpu_patterns=(),
        gpu_bytes=0,
        cpu_bytes=model.total,
        budget=None,
        summary=f"CPU only: {n_layer} layers, ≈{_gib(model.total)} of system memory",
        lines=tuple(lines),
    )


def _describe(layout: _Layout, gpus: Sequence[GpuMemory], budget: int, margin: int) -> Placement:
    on_gpu, on_cpu = layout.gpu_bytes, sum(layout.cpu_parts().values())
    where = _where(layout)
    devices = ", ".join(
        f"{gpu.name} ({gpu.description}, {_gib(gpu.free)} free of {_gib(gpu.total)})"
        for gpu in gpus
    )
    lines = [
        f"placement on {devices}:",
        f"  {where}",
        f"  GPU memory ≈{_gib(on_gpu)} of {_gib(budget)} usable ({_gib(margin)} per GPU kept "
        f"free): {_parts(layout.gpu_parts())}",
        f"  system memory ≈{_gib(on_cpu)}: {_parts(layout.cpu_parts())}",
    ]
    split = split_weights(gpus, margin) if len(gpus) > 1 else ()
    per_device = _per_device(layout, gpus, split or (1.0,))
    if len(gpus) > 1 or any(gpu.host for gpu in gpus):
        lines.extend(f"  {line}" for line in per_device)
    if on_gpu > budget:
        lines.append(
            f"  warning: this is {_gib(on_gpu - budget)} more than the GPU has free; loading "
            "may fail. Try --n-gpu-layers auto, --n-cpu-moe N, --cpu-moe or a smaller --n-ctx."
        )
    n_layer = len(layout.model.layers)
    return Placement(
        n_gpu_layers=-1 if layout.k == n_layer + 1 else layout.k,
        n_cpu_moe=layout.n_cpu_moe,
        cpu_patterns=expert_patterns(n_layer, layout.first, layout.n_cpu_moe)
        if layout.k > 0
        else (),
        gpu_bytes=on_gpu,
        cpu_bytes=on_cpu,
        budget=budget,
        summary=f"{where}; ≈{_gib(on_gpu)} GPU, ≈{_gib(on_cpu)} system memory"
        + (f" ({'; '.join(per_device)})" if any(gpu.host for gpu in gpus) else ""),
        lines=tuple(lines),
        tensor_split=split,
    )


def split_weights(gpus: Sequence[GpuMemory], margin: int) -> tuple[float, ...]:
    """llama.cpp's tensor_split for `gpus`: proportional to the memory usable on each."""
    usable = [max(0, gpu.free - margin) for gpu in gpus]
    if not any(usable):
        usable = [gpu.free for gpu in gpus]
    return tuple(float(size) for size in usable) if any(usable) else ()


def device_layers(n_layer: int, k: int, weights: Sequence[float]) -> list[list[int]]:
    """Which of the offloaded layers each device holds (index n_layer: the output layer).

    As llama.cpp's load_tensors splits them (in float32): offloaded layer il goes to the first
    device whose cumulative normalised weight exceeds (il - first) / k.
    """
    held: list[list[int]] = [[] for _ in weights]
    k = min(k, n_layer + 1)
    if k <= 0 or not weights:
        return held
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float32), dtype=np.float32)
    points = cumulative / cumulative[-1]
    first = n_layer + 1 - k
    for il in range(first, n_layer + 1):
        position = np.float32(il - first) / np.float32(k)
        held[min(int(np.searchsorted(points, position, side="right")), len(held) - 1)].append(il)
    return held


def _per_device(layout: _Layout, gpus: Sequence[GpuMemory], split: Sequence[float]) -> list[str]:
    """One line per device: its host, the layers it holds and their size; then this host's."""
    model, n_layer = layout.model, len(layout.model.layers)
    lines = []
    for gpu, layers in zip(gpus, device_layers(n_layer, layout.k, split), strict=True):
        size = sum(
            model.output
            if il == n_layer
            else model.layers[il].dense
            + model.layers[il].kv
            + (model.layers[il].experts if il >= layout.n_cpu_moe else 0)
            for il in layers
        )
        where = gpu.host or "this host"
        lines.append(f"{gpu.name} on {where}: {_layer_span(layers, n_layer)} ≈{_gib(size)}")
    cpu = list(range(layout.first))
    lines.append(f"CPU on this host: {_layer_span(cpu, n_layer)}, token embeddings")
    return lines


def _layer_span(layers: Sequence[int], n_layer: int) -> str:
    blocks = [il for il in layers if il < n_layer]
    parts = []
    if blocks:
        one = len(blocks) == 1
        parts.append(f"layer {blocks[0]}" if one else f"layers {blocks[0]}-{blocks[-1]}")
    if n_layer in layers:
        parts.append("the output")
    return " and ".join(parts) or "no layers"


def _where(layout: _Layout) -> str:
    n_layer = len(layout.model.layers)
    if layout.k <= 0:
        return f"GPU: none of the {n_layer} layers (n_gpu_layers 0), everything on the CPU"
    first, offloaded = layout.first, layout.offloaded
    span = f"layers {first}-{n_layer - 1} and the output" if offloaded else "the output only"
    setting = "all" if layout.k == n_layer + 1 else str(layout.k)
    where = f"GPU: {offloaded}/{n_layer} layers ({span}, n_gpu_layers {setting})"
    experts_on_cpu = min(offloaded, max(0, layout.n_cpu_moe - first))
    if experts_on_cpu and experts_on_cpu == offloaded:
        where += "; MoE experts of every offloaded layer on the CPU"
    elif experts_on_cpu:
        where += (
            f"; MoE experts of layers {first}-{layout.n_cpu_moe - 1} on the CPU "
            f"(n_cpu_moe {layout.n_cpu_moe})"
        )
    return where


def _parts(parts: dict[str, int]) -> str:
    return ", ".join(f"{name} {_gib(size)}" for name, size in parts.items()) or "nothing"


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class ContextShape:
    """The llama.cpp context the KV cache and compute buffer are sized for."""

    n_ctx: int
    n_ubatch: int = 512
    n_seq: int = 1
    swa_full: bool = True
    flash_attn: bool = True


@dataclass(frozen=True, slots=True)
class Hyperparameters:
    """What the KV cache and compute estimates need from the GGUF metadata."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_swa: int = 0  # sliding window (gpt-oss: 128 tokens on every other layer, from layer 0)


def footprint(
    tensors: Sequence[tuple[str, int]], hparams: Hyperparameters, context: ContextShape
) -> ModelFootprint:
    """Group (tensor name, bytes) by layer and add the KV cache and compute estimates."""
    dense = [0] * hparams.n_layer
    experts = [0] * hparams.n_layer
    input_bytes = output_bytes = 0
    has_output = False
    for name, n_bytes in tensors:
        layer = _LAYER.match(name)
        if layer is not None and int(layer[1]) < hparams.n_layer:
            target = experts if _EXPERTS.search(name) else dense
            target[int(layer[1])] += n_bytes
        elif name.startswith("token_embd."):
            input_bytes += n_bytes
        else:
            has_output = has_output or name == "output.weight"
            output_bytes += n_bytes
    if not has_output:  # tied embeddings: llama.cpp duplicates them as the output head
        output_bytes += input_bytes
    kv = kv_bytes(hparams, context)
    layers = tuple(map(LayerSizes, dense, experts, kv))
    return ModelFootprint(layers, input_bytes, output_bytes, compute_bytes(hparams, context))


def kv_bytes(hparams: Hyperparameters, context: ContextShape) -> list[int]:
    """KV cache bytes per layer (f16); sliding-window layers keep fewer cells unless swa_full."""
    per_cell = 2 * hparams.n_head_kv * hparams.head_dim * KV_BYTES_PER_VALUE
    swa_cells = min(context.n_ctx, hparams.n_swa * context.n_seq + context.n_ubatch)
    sizes = []
    for i in range(hparams.n_layer):
        is_swa = hparams.n_swa > 0 and i % 2 == 0
        cells = swa_cells if is_swa and not context.swa_full else context.n_ctx
        sizes.append(cells * per_cell)
    return sizes


def compute_bytes(hparams: Hyperparameters, context: ContextShape) -> int:
    """A rough upper estimate of the GPU compute buffer: the batch's logits and activations,
    plus the attention scores when flash attention is off."""
    logits = 4 * context.n_ubatch * hparams.n_vocab
    activations = 4 * context.n_ubatch * hparams.n_embd * 16
    scores = 0 if context.flash_attn else 4 * context.n_ubatch * context.n_ctx * hparams.n_head
    return logits + activations + scores

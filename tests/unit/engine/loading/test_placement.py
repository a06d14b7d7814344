"""GPU placement decisions: the pure plan for real gpt-oss shapes on common cards, and CPU-only.

The footprints use the exact tensor shapes and types of gpt-oss-20b and gpt-oss-120b (from the
synthetic GGUF builder's specs), so the numbers are those of the real files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from server.contracts.vocabulary import N_VOCAB
from server.engine.loading.gpt_oss import (
    GPT_OSS_20B,
    GPT_OSS_120B,
    SLIDING_WINDOW,
    Shape,
    tensor_specs,
)
from server.engine.loading.offload import model_footprint
from server.engine.loading.placement import (
    EXPERTS_REGEX,
    ContextShape,
    GpuMemory,
    Hyperparameters,
    ModelFootprint,
    Placement,
    PlacementOptions,
    device_layers,
    expert_patterns,
    footprint,
    kv_bytes,
    plan_placement,
)
from server.synth.build import PRESETS

GIB = 1024**3
PRESET_120B = GPT_OSS_120B


def gpt_oss(preset: Shape, n_ctx: int = 32768) -> ModelFootprint:
    tensors = [(spec.name, spec.nbytes) for spec in tensor_specs(preset)]
    hparams = Hyperparameters(
        n_layer=preset.n_layer,
        n_embd=preset.n_embd,
        n_head=preset.n_head,
        n_head_kv=preset.n_head_kv,
        head_dim=preset.head_dim,
        n_vocab=N_VOCAB,
        n_swa=SLIDING_WINDOW,
    )
    return footprint(tensors, hparams, ContextShape(n_ctx))


def card(total_gib: float, free_gib: float | None = None) -> list[GpuMemory]:
    free = total_gib - 0.5 if free_gib is None else free_gib  # the CUDA context takes some
    return [GpuMemory("CUDA0", f"a {total_gib:g} GB card", int(free * GIB), int(total_gib * GIB))]


def plan(model: ModelFootprint, gpus: list[GpuMemory], **options: Any) -> Placement:
    return plan_placement(model, gpus, PlacementOptions(**options))


@pytest.fixture(scope="module")
def gpt_oss_20b() -> ModelFootprint:
    return gpt_oss(GPT_OSS_20B)


@pytest.fixture(scope="module")
def gpt_oss_120b() -> ModelFootprint:
    return gpt_oss(PRESET_120B)


def assert_minimal(model: ModelFootprint, gpus: list[GpuMemory], placement: Placement) -> None:
    """It fits, and one more layer of experts on the GPU would not."""
    assert placement.fits
    assert placement.gpu_bytes <= sum(g.free for g in gpus) - GIB
    if placement.n_cpu_moe > 0:
        tighter = plan(model, gpus, n_gpu_layers=-1, n_cpu_moe=placement.n_cpu_moe - 1)
        assert not tighter.fits


def test_model_sizes_are_those_of_the_real_files(
    gpt_oss_20b: ModelFootprint, gpt_oss_120b: ModelFootprint
) -> None:
    weights_20b = gpt_oss_20b.total - sum(layer.kv for layer in gpt_oss_20b.layers)
    weights_120b = gpt_oss_120b.total - sum(layer.kv for layer in gpt_oss_120b.layers)
    assert 11.5e9 < weights_20b < 12.5e9  # gpt-oss-20b-mxfp4.gguf: 12.1 GB
    assert 60e9 < weights_120b < 66e9  # the three gpt-oss-120b-mxfp4 parts: ≈63 GB
    assert len(gpt_oss_20b.layers) == 24
    assert gpt_oss_20b.is_moe
    # f16 K and V, 8 KV heads of 64: 2 KiB per token and layer, 24 layers: 48 KiB per token.
    assert sum(layer.kv for layer in gpt_oss_20b.layers) == 32768 * 48 * 1024


def test_20b_fits_a_24_gb_card_entirely(gpt_oss_20b: ModelFootprint) -> None:
    placement = plan(gpt_oss_20b, card(24))
    assert placement.n_gpu_layers == -1
    assert placement.n_cpu_moe == 0
    assert placement.cpu_patterns == ()
    assert placement.fits
    assert "GPU: 24/24 layers" in placement.summary
    assert "MoE experts" not in placement.summary


@pytest.mark.parametrize("total_gib", [8, 10, 12])
def test_20b_on_8_to_12_gb_keeps_some_experts_on_the_cpu(
    gpt_oss_20b: ModelFootprint, total_gib: int
) -> None:
    gpus = card(total_gib)
    placement = plan(gpt_oss_20b, gpus)
    assert placement.n_gpu_layers == -1  # attention and KV cache of every layer on the GPU
    assert 0 < placement.n_cpu_moe < 24
    assert placement.cpu_patterns == tuple(
        rf"blk\.{i}{EXPERTS_REGEX}" for i in range(placement.n_cpu_moe)
    )
    assert_minimal(gpt_oss_20b, gpus, placement)
    assert f"MoE experts of layers 0-{placement.n_cpu_moe - 1} on the CPU" in placement.summary


def test_smaller_cards_keep_more_experts_on_the_cpu(gpt_oss_20b: ModelFootprint) -> None:
    on_cpu = [plan(gpt_oss_20b, card(total)).n_cpu_moe for total in (24, 16, 12, 8, 6)]
    assert on_cpu == sorted(on_cpu)
    assert on_cpu[0] == 0
    assert on_cpu[-1] > on_cpu[2] > 0


@pytest.mark.parametrize("total_gib", [24, 32, 48])
def test_120b_on_24_to_48_gb_keeps_experts_on_the_cpu(
    gpt_oss_120b: ModelFootprint, total_gib: int
) -> None:
    gpus = card(total_gib)
    placement = plan(gpt_oss_120b, gpus)
    assert placement.n_gpu_layers == -1
    assert 0 < placement.n_cpu_moe < 36
    assert_minimal(gpt_oss_120b, gpus, placement)
    assert placement.cpu_bytes > 30 * GIB if total_gib == 24 else placement.cpu_bytes > 10 * GIB


def test_120b_fits_an_80_gb_card(gpt_oss_120b: ModelFootprint) -> None:
    placement = plan(gpt_oss_120b, card(80))
    assert (placement.n_gpu_layers, placement.n_cpu_moe, placement.cpu_patterns) == (-1, 0, ())


def test_gpus_are_added_up(gpt_oss_120b: ModelFootprint) -> None:
    two = [*card(24), GpuMemory("CUDA1", "another", int(23.5 * GIB), 24 * GIB)]
    assert plan(gpt_oss_120b, two).n_cpu_moe < plan(gpt_oss_120b, card(24)).n_cpu_moe


def test_cpu_only_build_means_no_gpu_layers(gpt_oss_20b: ModelFootprint) -> None:
    placement = plan(gpt_oss_20b, [])
    assert (placement.n_gpu_layers, placement.cpu_patterns, placement.gpu_bytes) == (0, (), 0)
    assert placement.fits
    assert placement.summary.startswith("CPU only: 24 layers")
    assert placement.cpu_bytes == gpt_oss_20b.total
    asked = plan(gpt_oss_20b, [], n_gpu_layers=-1)
    assert asked.n_gpu_layers == 0
    assert any("--n-gpu-layers -1 ignored" in line for line in asked.lines)


def test_cpu_moe_keeps_every_expert_on_the_cpu(gpt_oss_20b: ModelFootprint) -> None:
    placement = plan(gpt_oss_20b, card(24), cpu_moe=True)
    assert placement.n_gpu_layers == -1
    assert placement.cpu_patterns == (EXPERTS_REGEX,)
    assert placement.gpu_bytes < 4 * GIB  # attention, output, KV cache, compute
    assert "MoE experts of every offloaded layer on the CPU" in placement.summary


def test_n_cpu_moe_is_a_floor_for_auto(gpt_oss_20b: ModelFootprint) -> None:
    placement = plan(gpt_oss_20b, card(24), n_cpu_moe=4)
    assert placement.n_cpu_moe == 4
    assert len(placement.cpu_patterns) == 4


def test_explicit_layers_are_obeyed_and_a_misfit_is_reported(gpt_oss_20b: ModelFootprint) -> None:
    placement = plan(gpt_oss_20b, card(8), n_gpu_layers=-1)
    assert (placement.n_gpu_layers, placement.n_cpu_moe) == (-1, 0)
    assert not placement.fits
    assert any("warning" in line and "--cpu-moe" in line for line in placement.lines)
    partial = plan(gpt_oss_20b, card(24), n_gpu_layers=10)
    assert partial.n_gpu_layers == 10
    assert "GPU: 9/24 layers (layers 15-23 and the output" in partial.summary


def test_when_even_the_dense_part_does_not_fit_whole_layers_go(
    gpt_oss_120b: ModelFootprint,
) -> None:
    placement = plan(gpt_oss_120b, card(4, free_gib=3.5))
    assert 0 < placement.n_gpu_layers < 37
    assert placement.cpu_patterns == (EXPERTS_REGEX,)
    assert placement.fits
    nothing = plan(gpt_oss_120b, card(1, free_gib=0.5))
    assert (nothing.n_gpu_layers, nothing.cpu_patterns, nothing.gpu_bytes) == (0, (), 0)


def test_a_dense_model_offloads_whole_layers() -> None:
    layers = tuple(footprint([], _hparams(4), ContextShape(1024)).layers)
    dense = ModelFootprint(
        layers=tuple(type(layer)(GIB, 0, layer.kv) for layer in layers),
        input=GIB // 2,
        output=GIB // 2,
        compute=GIB // 4,
    )
    placement = plan(dense, card(4, free_gib=3.9))
    # 2.9 GiB usable: the output (0.5), compute (0.25) and two of the four 1 GiB layers.
    assert placement.n_gpu_layers == 3
    assert placement.cpu_patterns == ()
    assert "GPU: 2/4 layers (layers 2-3 and the output" in placement.summary


def test_patterns_follow_llama_cpp_naming() -> None:
    assert expert_patterns(24, 0, 0) == ()
    assert expert_patterns(24, 0, 24) == (EXPERTS_REGEX,)
    assert expert_patterns(24, 20, 22) == (rf"blk\.20{EXPERTS_REGEX}", rf"blk\.21{EXPERTS_REGEX}")
    assert expert_patterns(24, 20, 10) == ()  # those layers are on the CPU anyway
    layer_1 = re.compile(expert_patterns(24, 0, 2)[1])
    assert layer_1.search("blk.1.ffn_up_exps.weight")
    assert layer_1.search("blk.1.ffn_down_exps.bias")
    assert not layer_1.search("blk.11.ffn_up_exps.weight")
    assert not layer_1.search("blk.1.ffn_gate_inp.weight")  # the router stays with the layer


def test_sliding_window_layers_cost_less_without_swa_full() -> None:
    hparams = _hparams(24)
    full = kv_bytes(hparams, ContextShape(32768))
    windowed = kv_bytes(hparams, ContextShape(32768, n_ubatch=512, swa_full=False))
    assert full[0] == full[1] == 32768 * 2048
    assert windowed[0] == (128 + 512) * 2048  # the window and a batch
    assert windowed[1] == full[1]


def test_footprint_of_the_tiny_gguf_matches_its_tensors(tiny_gguf: Path) -> None:
    model = model_footprint(tiny_gguf, ContextShape(4096))
    specs = tensor_specs(PRESETS["tiny"])
    experts = sum(s.nbytes for s in specs if s.name.startswith("blk.0.") and "_exps" in s.name)
    dense = sum(s.nbytes for s in specs if s.name.startswith("blk.0.") and "_exps" not in s.name)
    assert len(model.layers) == 2
    assert 0 <= model.layers[0].experts - experts < 32 * 6  # alignment padding per tensor
    assert 0 <= model.layers[0].dense - dense < 32 * 13
    assert model.layers[0].kv == 4096 * 2 * 2 * 16 * 2
    assert model.input >= 64 * N_VOCAB  # Q8_0 token embeddings
    full_context = model_footprint(tiny_gguf, ContextShape(0))
    assert full_context.layers[0].kv == 131072 * 2 * 2 * 16 * 2


def _hparams(n_layer: int) -> Hyperparameters:
    return Hyperparameters(
        n_layer=n_layer,
        n_embd=2880,
        n_head=64,
        n_head_kv=8,
        head_dim=64,
        n_vocab=N_VOCAB,
        n_swa=128,
    )


@pytest.mark.parametrize(
    ("n_layer", "k", "weights", "expected"),
    [
        (2, 3, [1.0, 1.0], [[0, 1], [2]]),  # the tiny model on two equal hosts
        (2, 2, [1.0, 1.0], [[1], [2]]),  # layer 0 stays on the CPU
        (24, 25, [1.0, 1.0], [list(range(13)), list(range(13, 25))]),
        (24, 10, [3.0, 1.0], [list(range(15, 23)), [23, 24]]),  # first = 15, 10 offloaded
        (24, 25, [1.0, 0.0], [list(range(25)), []]),
    ],
)
def test_layers_are_split_between_devices_as_llama_cpp_splits_them(
    n_layer: int, k: int, weights: list[float], expected: list[list[int]]
) -> None:
    """llama.cpp: layer il (of the last k) goes to the first device whose cumulative share of
    the weights exceeds (il - first) / k; index n_layer is the output layer."""
    assert device_layers(n_layer, k, weights) == expected


def test_rpc_hosts_are_planned_like_gpus_and_named_per_host(gpt_oss_20b: ModelFootprint) -> None:
    hosts = [
        GpuMemory("RPC0", "RPC host", 16 * GIB, 16 * GIB, host="10.0.0.2:50052"),
        GpuMemory("RPC1", "RPC host", 8 * GIB, 8 * GIB, host="10.0.0.3:50052"),
    ]
    placement = plan(gpt_oss_20b, hosts)
    assert placement.n_gpu_layers == -1  # 20b fits 24 GB in all: every layer remote
    assert placement.tensor_split == (15 * GIB, 7 * GIB)  # free memory less the 1 GiB margin
    first, second = device_layers(24, 25, placement.tensor_split)
    lines = "\n".join(placement.lines)
    assert f"RPC0 on 10.0.0.2:50052: layers 0-{first[-1]}" in lines
    assert f"RPC1 on 10.0.0.3:50052: layers {second[0]}-23 and the output" in lines
    assert "CPU on this host: no layers, token embeddings" in lines
    assert "10.0.0.3:50052" in placement.summary  # the banner names every host


def test_one_local_gpu_needs_no_split(gpt_oss_20b: ModelFootprint) -> None:
    placement = plan(gpt_oss_20b, card(24))
    assert placement.tensor_split == ()
    assert not any("on this host" in line for line in placement.lines)

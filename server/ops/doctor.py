"""Doctor: does the installed llama.cpp build fit this machine's GPUs, and where would gpt-oss go.

`gpt-oss-server doctor` prints what the build supports (backends, CPU features), the GPUs the
machine has (nvidia-smi, Apple silicon), the verdict, and the placement `serve` would choose for
gpt-oss-20b and gpt-oss-120b; `serve` logs the verdict at start-up. When the machine has a GPU
the build cannot use, the verdict is a WARNING naming the one command that fixes it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psutil

from server.engine.loading.build import BuildInfo, build_info, cuda_problem
from server.engine.loading.placement import (
    ContextShape,
    GpuMemory,
    Hyperparameters,
    ModelFootprint,
    PlacementOptions,
    footprint,
    plan_placement,
)
from server.ops import accelerator
from server.ops.accelerator import Machine

GIB = 1024**3
FIX = f"{accelerator.INSTALL_COMMAND} && pip install ."
_WHERE = "(in the gpt-oss-server checkout; docs/gpu.md)"


@dataclass(frozen=True)
class Finding:
    """One line of the verdict, with the log level `serve` gives it."""

    level: int
    text: str


def verdict(machine: Machine, build: BuildInfo, cuda_error: str | None) -> Finding:
    """Whether the build can use the machine's GPUs; what to do when it cannot."""
    backends = ", ".join(build.backends) or "none"
    if build.local_gpus:
        listed = ", ".join(f"{gpu.name} ({gpu.description}, {gpu.free / GIB:.1f} GiB free)"
                           for gpu in build.local_gpus)  # fmt: skip
        return Finding(logging.INFO, f"llama.cpp backends {backends}; GPUs: {listed}")
    if "CUDA" in build.gpu_backends:
        return _cuda_without_gpu(machine, cuda_error or "no CUDA device")
    if machine.nvidia:
        return Finding(
            logging.WARNING,
            f"this machine has {_nvidia_name(machine)}, but this llama-cpp-python build has no "
            f"CUDA backend (backends: {backends}): the model runs on the CPU, many times "
            f"slower. Build for the GPU: {FIX} {_WHERE}",
        )
    if machine.apple_silicon and "Metal" not in build.gpu_backends:
        return Finding(
            logging.WARNING,
            f"this Mac's GPU (Apple silicon, Metal) is not in this llama-cpp-python build "
            f"(backends: {backends}): the model runs on the CPU. Build for Metal: {FIX} {_WHERE}",
        )
    if build.gpu_backends:
        return Finding(
            logging.INFO,
            f"this llama-cpp-python build has {', '.join(build.gpu_backends)}, but it found no "
            "GPU: running on the CPU",
        )
    return Finding(logging.INFO, f"llama.cpp backends {backends}; no GPU on this machine")


def _cuda_without_gpu(machine: Machine, why: str) -> Finding:
    """A CUDA build that sees no GPU: a WARNING where the machine has one, else the fallback."""
    if machine.nvidia:
        return Finding(
            logging.WARNING,
            f"this llama-cpp-python build has CUDA, but CUDA cannot use {_nvidia_name(machine)}: "
            f"{why}. Running on the CPU. {_driver_advice(machine)}",
        )
    return Finding(
        logging.INFO,
        f"this llama-cpp-python build has CUDA, but this machine has no NVIDIA GPU (CUDA: {why}):"
        " running on the CPU",
    )


def _nvidia_name(machine: Machine) -> str:
    if not machine.gpus:
        return "the NVIDIA GPU"
    return ", ".join(f"{gpu.name} ({gpu.memory_mib / 1024:.0f} GiB)" for gpu in machine.gpus)


def _driver_advice(machine: Machine) -> str:
    driver = machine.driver_cuda
    if driver is not None and driver[0] < accelerator.PYPI_CUDA_MAJOR:
        return (
            f"The driver {machine.driver_version} runs CUDA {driver[0]}.{driver[1]}: update it "
            f"to {accelerator.PYPI_CUDA_DRIVER} or newer, or rebuild with a CUDA "
            f"{driver[0]}.{driver[1]} toolkit installed: {FIX} {_WHERE}"
        )
    return f"Check the driver with nvidia-smi; then rebuild if needed: {FIX} {_WHERE}"


def catalog_footprint(name: str, context: ContextShape) -> ModelFootprint:
    """A catalog model's memory from its exact tensor shapes, without its file."""
    from server.contracts.vocabulary import N_VOCAB
    from server.engine.loading.gpt_oss import REAL_SHAPES, SLIDING_WINDOW, tensor_specs

    shape = REAL_SHAPES[name]
    hparams = Hyperparameters(
        n_layer=shape.n_layer,
        n_embd=shape.n_embd,
        n_head=shape.n_head,
        n_head_kv=shape.n_head_kv,
        head_dim=shape.head_dim,
        n_vocab=N_VOCAB,
        n_swa=SLIDING_WINDOW,
    )
    tensors = [(spec.name, spec.nbytes) for spec in tensor_specs(shape)]
    return footprint(tensors, hparams, context)


def planned_gpus(machine: Machine, build: BuildInfo) -> tuple[list[GpuMemory], str]:
    """The GPUs placement would use, and on which build: this one's, else a CUDA build's."""
    if build.local_gpus:
        return list(build.local_gpus), "with this build"
    if machine.gpus and "CUDA" not in build.gpu_backends:
        gpus = [GpuMemory(f"CUDA{i}", gpu.name, gpu.free_mib * 1024**2, gpu.memory_mib * 1024**2)
                for i, gpu in enumerate(machine.gpus)]  # fmt: skip
        return gpus, "after the fix above (a CUDA build)"
    return [], "with this build"


def placement_lines(
    machine: Machine, build: BuildInfo, context: ContextShape, options: PlacementOptions
) -> list[str]:
    """Where gpt-oss-20b and gpt-oss-120b would go, with the memory it takes."""
    gpus, which = planned_gpus(machine, build)
    memory = psutil.virtual_memory().total
    lines = [
        f"placement {which}, {context.n_ctx}-token context, {context.n_seq} sequences "
        f"(system memory {memory / GIB:.1f} GiB):"
    ]
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        placement = plan_placement(catalog_footprint(name, context), gpus, options)
        short = "" if placement.cpu_bytes <= memory else "; does not fit in system memory"
        lines.append(f"  {name}: {placement.summary}{short}")
    return lines


def report(context: ContextShape, options: PlacementOptions) -> str:
    """Everything `gpt-oss-server doctor` prints."""
    machine = accelerator.probe()
    build = build_info()
    finding = verdict(machine, build, cuda_problem())
    gpu_backends = ", ".join(build.gpu_backends) or "none"
    lines = [
        f"llama-cpp-python {build.version}",
        f"  backends: {', '.join(build.backends)} (GPU backends: {gpu_backends}; "
        f"RPC: {'yes' if build.has_rpc else 'no'})",
        f"  {build.cpu_features}",
        "machine:",
        *(f"  {line}" for line in accelerator.describe(machine)),
        f"  CPUs: {psutil.cpu_count()}, memory {psutil.virtual_memory().total / GIB:.1f} GiB",
        "verdict:",
        f"  {logging.getLevelName(finding.level)}: {finding.text}",
        *placement_lines(machine, build, context, options),
    ]
    return "\n".join(lines)


def log_startup_check(log: logging.Logger) -> None:
    """The verdict at `serve`'s start-up (a WARNING when a GPU sits unused)."""
    finding = verdict(accelerator.probe(), build_info(), cuda_problem())
    log.log(finding.level, "%s", finding.text)

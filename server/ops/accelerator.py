"""Accelerator: the GPUs this machine has, and the llama.cpp build that serves them.

Standard library only: scripts/install_llama_cpp.py loads this file by its path before the
project (or anything else) is installed, to choose the build; `gpt-oss-server doctor` and the
start-up check of `serve` use the same answers to say whether the installed build fits.

- NVIDIA: `nvidia-smi` on PATH or /proc/driver/nvidia -> CUDA. `nvidia-smi` also gives the
  GPUs (name, memory, compute capability) and the highest CUDA version the driver runs.
- Apple silicon (macOS on arm64) -> Metal, llama-cpp-python's own default there.
- Anything else -> the CPU.

A CUDA build needs a CUDA compiler: a system toolkit (nvcc) when there is one, else NVIDIA's
CUDA 13 wheels from PyPI (compiler, headers, runtime and cuBLAS), which need a driver for
CUDA 13 (R580 or newer). cuda_plan() decides, or says exactly what is missing.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

BACKENDS = ("cpu", "cuda", "metal", "vulkan")
PYPI_CUDA_MAJOR = 13  # the CUDA major version of NVIDIA's complete toolchain wheels on PyPI
PYPI_CUDA_DRIVER = "R580"  # the oldest driver series that runs CUDA 13
# The command that builds and installs llama-cpp-python for this machine (from a checkout).
INSTALL_COMMAND = "python scripts/install_llama_cpp.py"
NVIDIA_PROC = Path("/proc/driver/nvidia")
_SMI_TIMEOUT_S = 10


@dataclass(frozen=True)
class NvidiaGpu:
    """One GPU as nvidia-smi lists it."""

    name: str
    memory_mib: int
    free_mib: int
    compute_cap: str  # "8.9"


@dataclass(frozen=True)
class Machine:
    """What the build and the placement depend on: the OS, the CPU, the NVIDIA driver, GPUs."""

    system: str  # platform.system(): Linux, Darwin, Windows
    arch: str  # platform.machine(): x86_64, arm64, aarch64
    nvidia: bool  # an NVIDIA driver is present (nvidia-smi or /proc/driver/nvidia)
    driver_version: str | None = None  # "580.65.06"
    driver_cuda: tuple[int, int] | None = None  # the highest CUDA version the driver runs
    gpus: tuple[NvidiaGpu, ...] = ()
    problem: str | None = None  # why nvidia-smi gave no answer, when it did not

    @property
    def apple_silicon(self) -> bool:
        return self.system == "Darwin" and self.arch == "arm64"


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit on the system: its nvcc and release."""

    nvcc: Path
    version: tuple[int, int] | None


@dataclass(frozen=True)
class CudaPlan:
    """How to compile the CUDA backend here: with the system toolkit, PyPI's, or not at all."""

    source: str  # "system", "pypi" or "none"
    reason: str
    toolkit: Toolkit | None = None
    notes: list[str] = field(default_factory=list)


def probe(system: str | None = None, arch: str | None = None) -> Machine:
    """This machine, as the build and the placement see it."""
    system = system or platform.system()
    arch = arch or platform.machine()
    smi = shutil.which("nvidia-smi")
    nvidia = smi is not None or NVIDIA_PROC.exists()
    if smi is None:
        problem = "an NVIDIA driver is loaded but nvidia-smi is not on PATH" if nvidia else None
        return Machine(system, arch, nvidia, problem=problem)
    header, problem = _run([smi])
    query = "--query-gpu=name,memory.total,memory.free,compute_cap"
    listing, list_problem = _run([smi, query, "--format=csv,noheader,nounits"])
    return Machine(
        system,
        arch,
        nvidia=True,
        driver_version=_search(r"Driver Version:\s*([0-9.]+)", header),
        driver_cuda=parse_version(_search(r"CUDA Version:\s*([0-9.]+)", header)),
        gpus=parse_gpus(listing or ""),
        problem=problem or list_problem,
    )


def choose_backend(machine: Machine) -> tuple[str, str]:
    """The backend to build for this machine, and why."""
    if machine.nvidia:
        gpus = ", ".join(gpu.name for gpu in machine.gpus) or "an NVIDIA driver"
        return "cuda", f"NVIDIA GPU found ({gpus})"
    if machine.apple_silicon:
        return "metal", "Apple silicon (macOS on arm64)"
    return "cpu", f"no NVIDIA driver and not Apple silicon ({machine.system} {machine.arch})"


def cmake_flags(backend: str) -> list[str]:
    """The CMake flags of a backend, the RPC backend included (one build serves both roles)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")
    extra = {"cpu": [], "cuda": ["-DGGML_CUDA=on"], "metal": ["-DGGML_METAL=on"]}
    return [*extra.get(backend, ["-DGGML_VULKAN=on"]), "-DGGML_RPC=on"]


def cuda_archs(gpus: tuple[NvidiaGpu, ...]) -> str | None:
    """CMAKE_CUDA_ARCHITECTURES for exactly these GPUs ("89-real"), None when none is known.

    Blackwell (compute capability 12.x) takes the architecture-specific "a" variant, which
    llama.cpp needs for its native MXFP4 kernels.
    """
    archs = []
    for gpu in gpus:
        found = re.fullmatch(r"(\d+)\.(\d+)", gpu.compute_cap.strip())
        if found is None:
            continue
        major, minor = int(found.group(1)), int(found.group(2))
        arch = f"{major}{minor}{'a' if major >= 12 else ''}-real"
        if arch not in archs:
            archs.append(arch)
    return ";".join(archs) or None


def system_toolkit() -> Toolkit | None:
    """The system's whole CUDA toolkit: $CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda."""
    candidates = [Path(os.environ[v]) / "bin" / "nvcc" for v in ("CUDA_HOME", "CUDA_PATH")
                  if os.environ.get(v)]  # fmt: skip
    on_path = shutil.which("nvcc")
    candidates += [Path(on_path)] if on_path else []
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for nvcc in candidates:
        if nvcc.is_file() and os.access(nvcc, os.X_OK) and has_cublas(nvcc.parents[1]):
            output, _ = _run([str(nvcc), "--version"])
            return Toolkit(nvcc, parse_version(_search(r"release\s*([0-9.]+)", output)))
    return None


def has_cublas(root: Path) -> bool:
    """Whether the toolkit at `root` has cuBLAS, which llama.cpp's CUDA backend links.

    A toolkit with the compiler only (some distributions' packages, or a few wheels unpacked
    by hand) cannot build it.
    """
    # lib/x86_64-linux-gnu: Debian's and Ubuntu's nvidia-cuda-toolkit (nvcc in /usr/bin)
    places = [root / "lib64", root / "lib", *root.glob("targets/*/lib"), *root.glob("lib/*-gnu")]
    return any(next(place.glob("libcublas.so*"), None) for place in places)


def cuda_plan(machine: Machine, toolkit: Toolkit | None) -> CudaPlan:
    """Which CUDA compiler to build with, given the driver and the system toolkit."""
    driver = machine.driver_cuda
    if toolkit is not None:
        notes = []
        if driver and toolkit.version and toolkit.version > driver:
            notes.append(
                f"the toolkit (CUDA {_dotted(toolkit.version)}) is newer than the driver runs "
                f"(CUDA {_dotted(driver)}): update the NVIDIA driver, or the build will not "
                "start on the GPU"
            )
        return CudaPlan("system", f"system CUDA toolkit {toolkit.nvcc}", toolkit, notes)
    if driver is None or driver[0] >= PYPI_CUDA_MAJOR:
        why = (
            f"driver runs CUDA {_dotted(driver)}"
            if driver
            else "no driver version known (a build for another machine, or no GPU here)"
        )
        reason = f"no system CUDA toolkit; NVIDIA's CUDA 13 wheels from PyPI ({why})"
        return CudaPlan("pypi", reason)
    return CudaPlan(
        "none",
        f"the NVIDIA driver {machine.driver_version or ''} runs CUDA {_dotted(driver)}, but the "
        f"CUDA compiler on PyPI is CUDA {PYPI_CUDA_MAJOR}, which needs driver {PYPI_CUDA_DRIVER} "
        "or newer, and no system CUDA toolkit was found (nvcc on PATH, $CUDA_HOME or "
        f"/usr/local/cuda). Either update the NVIDIA driver to {PYPI_CUDA_DRIVER} or newer, or "
        f"install the CUDA toolkit {_dotted(driver)} (or older) for your distribution from "
        "https://developer.nvidia.com/cuda-toolkit-archive (on Debian/Ubuntu: "
        f"`sudo apt install cuda-toolkit-{driver[0]}-{driver[1]}` from NVIDIA's repository), then "
        f"run `{INSTALL_COMMAND}` again. `{INSTALL_COMMAND} --backend cpu` builds for the CPU.",
    )


def parse_gpus(listing: str) -> tuple[NvidiaGpu, ...]:
    """nvidia-smi --query-gpu=name,memory.total,memory.free,compute_cap --format=csv,noheader,
    nounits (a GPU name may hold commas; the numbers never do)."""
    gpus = []
    for line in listing.splitlines():
        parts = [part.strip() for part in line.rsplit(",", 3)]
        if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
            gpus.append(NvidiaGpu(parts[0], int(parts[1]), int(parts[2]), parts[3]))
    return tuple(gpus)


def parse_version(text: str | None) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def describe(machine: Machine) -> list[str]:
    """Human lines about the machine's accelerators (for doctor and the install script)."""
    lines = [f"system: {machine.system} {machine.arch}"]
    if machine.apple_silicon:
        lines.append("GPU: Apple silicon (Metal)")
    if not machine.nvidia:
        lines.append("NVIDIA driver: none (no nvidia-smi, no /proc/driver/nvidia)")
        return lines
    cuda = f", runs CUDA {_dotted(machine.driver_cuda)}" if machine.driver_cuda else ""
    lines.append(f"NVIDIA driver: {machine.driver_version or 'version unknown'}{cuda}")
    lines += [
        f"GPU {i}: {gpu.name}, {gpu.memory_mib / 1024:.1f} GiB ({gpu.free_mib / 1024:.1f} GiB "
        f"free), compute capability {gpu.compute_cap}"
        for i, gpu in enumerate(machine.gpus)
    ]
    if machine.problem:
        lines.append(f"nvidia-smi: {machine.problem}")
    return lines


def _dotted(version: tuple[int, int] | None) -> str:
    return ".".join(map(str, version)) if version else "?"


def _search(pattern: str, text: str | None) -> str | None:
    found = re.search(pattern, text or "")
    return found.group(1) if found else None


def _run(command: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None), or (None, why it failed)."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{Path(command[0]).name} failed: {exc}"
    if done.returncode != 0:
        detail = (done.stdout + done.stderr).strip().splitlines()
        return None, f"{Path(command[0]).name} exited {done.returncode}: " + (
            detail[0] if detail else "no output"
        )
    return done.stdout, None

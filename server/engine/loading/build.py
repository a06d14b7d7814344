"""Build: what the installed llama.cpp can run on (its backends, CPU features, usable GPUs).

A backend compiled in (its ggml registry entry, or its library beside libllama) is not the same
as a device to run on: a CUDA build on a machine without a usable driver registers CUDA with no
device and runs on the CPU. cuda_problem() asks the CUDA runtime that build loaded why.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import llama_cpp.llama_cpp as lc

from server.engine.ggml import functions as ggml_functions
from server.engine.loading.offload import gpu_devices
from server.engine.loading.placement import GpuMemory

GPU_BACKENDS = ("CUDA", "Metal", "Vulkan", "ROCm", "HIP", "SYCL", "MUSA", "OpenCL", "CANN")
# The CUDA runtime sonames a CUDA build of llama.cpp links (newest first).
_CUDART = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


@dataclass(frozen=True)
class BuildInfo:
    """The installed llama-cpp-python: version, backends, CPU features and the GPUs it sees."""

    version: str
    backends: tuple[str, ...]  # registered ggml backends, e.g. ("CUDA", "RPC", "CPU")
    libraries: tuple[str, ...]  # backend libraries shipped beside libllama (ggml-cuda, ...)
    cpu_features: str  # llama.cpp's system info: "CPU : SSE3 = 1 | AVX2 = 1 | ..."
    devices: tuple[GpuMemory, ...]  # GPUs (and RPC hosts) llama.cpp can offload to now

    @property
    def gpu_backends(self) -> tuple[str, ...]:
        compiled = {*self.backends, *(_backend_name(lib) for lib in self.libraries)}
        return tuple(name for name in GPU_BACKENDS if name in compiled)

    @property
    def has_rpc(self) -> bool:
        return "RPC" in self.backends

    @property
    def local_gpus(self) -> tuple[GpuMemory, ...]:
        return tuple(device for device in self.devices if not device.host)


def build_info() -> BuildInfo:
    """The installed build, asked through llama.cpp's ggml backend registry."""
    ggml = ggml_functions()
    backends = []
    for i in range(ggml.ggml_backend_reg_count()):
        name = ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i))
        backends.append(name.decode() if name else "?")
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    names = {path.name.split(".")[0] for path in lib_dir.glob("libggml-*")}
    libraries = sorted(name.removeprefix("lib") for name in names)
    info = lc.llama_print_system_info()
    return BuildInfo(
        version=llama_cpp.__version__,
        backends=tuple(backends),
        libraries=tuple(libraries),
        cpu_features=(info.decode(errors="replace") if info else "").strip(" |"),
        devices=tuple(gpu_devices()),
    )


def cuda_problem() -> str | None:
    """Why the CUDA runtime of this build sees no GPU, in its words; None if it sees one.

    None as well where no CUDA runtime is loaded (a build without CUDA).
    """
    for soname in _CUDART:
        try:  # RTLD_NOLOAD: only the runtime the CUDA backend already loaded, never another
            cudart = ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        count = ctypes.c_int(0)
        error = cudart.cudaGetDeviceCount(ctypes.byref(count))
        if error == 0:
            return None if count.value > 0 else "no CUDA-capable device"
        cudart.cudaGetErrorString.restype = ctypes.c_char_p
        cudart.cudaGetErrorString.argtypes = [ctypes.c_int]
        message = cudart.cudaGetErrorString(error)
        return message.decode(errors="replace") if message else f"CUDA error {error}"
    return None


def _backend_name(library: str) -> str:
    """ggml-cuda -> CUDA, ggml-metal -> Metal (the registry's spelling)."""
    suffix = library.removeprefix("ggml-")
    return next((name for name in GPU_BACKENDS if name.lower() == suffix), suffix)

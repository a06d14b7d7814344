"""`gpt-oss-server doctor` and serve's start-up verdict: the build against the machine's GPUs.

The verdict for other builds (CUDA, Metal) is checked on their descriptions; this machine's own
build is asked for real (llama.cpp's backend registry), with a fake nvidia-smi on PATH where a
test needs an NVIDIA GPU.
"""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import pytest

from server.cli import main
from server.engine.loading.build import BuildInfo, build_info
from server.engine.loading.placement import ContextShape, GpuMemory, PlacementOptions
from server.ops import doctor
from server.ops.accelerator import Machine, NvidiaGpu
from tests.support.fake_gpu import fake_nvidia_smi, no_nvidia

GIB = 1024**3
FIX = "python scripts/install_llama_cpp.py && pip install ."
LINUX = Machine("Linux", "x86_64", nvidia=False)
RTX = NvidiaGpu("NVIDIA GeForce RTX 4090", 24564, 24080, "8.9")
WITH_4090 = Machine("Linux", "x86_64", True, "580.65.06", (13, 0), (RTX,))
OLD_DRIVER = Machine("Linux", "x86_64", True, "550.54.15", (12, 4), (RTX,))
MAC = Machine("Darwin", "arm64", nvidia=False)


def build(*backends: str, devices: tuple[GpuMemory, ...] = ()) -> BuildInfo:
    libraries = tuple(f"ggml-{name.lower()}" for name in backends)
    return BuildInfo("0.3.36", backends, libraries, "CPU : AVX2 = 1", devices)


CPU_BUILD = build("RPC", "CPU")
CUDA_BUILD = build("CUDA", "RPC", "CPU")


def test_a_gpu_the_build_cannot_use_is_a_warning_with_the_fix() -> None:
    finding = doctor.verdict(WITH_4090, CPU_BUILD, None)
    assert finding.level == logging.WARNING
    assert "NVIDIA GeForce RTX 4090 (24 GiB)" in finding.text
    assert "no CUDA backend (backends: RPC, CPU)" in finding.text
    assert FIX in finding.text


def test_a_cuda_build_without_a_gpu_falls_back_to_the_cpu_and_says_why() -> None:
    error = "CUDA driver version is insufficient for CUDA runtime version"
    finding = doctor.verdict(LINUX, CUDA_BUILD, error)
    assert finding.level == logging.INFO
    assert finding.text == (
        "this llama-cpp-python build has CUDA, but this machine has no NVIDIA GPU "
        f"(CUDA: {error}): running on the CPU"
    )


def test_a_cuda_build_and_a_driver_too_old_for_it() -> None:
    error = "CUDA driver version is insufficient for CUDA runtime version"
    finding = doctor.verdict(OLD_DRIVER, CUDA_BUILD, error)
    assert finding.level == logging.WARNING
    assert f"CUDA cannot use NVIDIA GeForce RTX 4090 (24 GiB): {error}" in finding.text
    assert "driver 550.54.15 runs CUDA 12.4" in finding.text
    assert "R580" in finding.text
    assert FIX in finding.text


def test_a_build_that_sees_its_gpu() -> None:
    gpu = GpuMemory("CUDA0", "NVIDIA GeForce RTX 4090", 23 * GIB, 24 * GIB)
    finding = doctor.verdict(WITH_4090, build("CUDA", "CPU", devices=(gpu,)), None)
    assert finding.level == logging.INFO
    assert finding.text == (
        "llama.cpp backends CUDA, CPU; GPUs: CUDA0 (NVIDIA GeForce RTX 4090, 23.0 GiB free)"
    )


def test_apple_silicon_without_metal_and_with_it() -> None:
    without = doctor.verdict(MAC, CPU_BUILD, None)
    assert without.level == logging.WARNING
    assert "Apple silicon, Metal" in without.text
    assert FIX in without.text
    gpu = GpuMemory("MTL0", "Apple M3 Max", 40 * GIB, 48 * GIB)
    assert doctor.verdict(MAC, build("Metal", "CPU", devices=(gpu,)), None).level == logging.INFO


def test_no_gpu_and_a_cpu_build_is_fine() -> None:
    finding = doctor.verdict(LINUX, CPU_BUILD, None)
    assert finding == doctor.Finding(
        logging.INFO, "llama.cpp backends RPC, CPU; no GPU on this machine"
    )


def test_placement_for_a_gpu_the_build_does_not_use_yet() -> None:
    lines = doctor.placement_lines(
        WITH_4090, CPU_BUILD, ContextShape(32768, n_seq=4), PlacementOptions()
    )
    assert lines[0].startswith("placement after the fix above (a CUDA build), 32768-token")
    assert lines[1].startswith("  gpt-oss-20b: GPU: 24/24 layers")
    assert "MoE experts" not in lines[1]
    assert lines[2].startswith("  gpt-oss-120b: GPU: 36/36 layers")
    assert "MoE experts of layers 0-" in lines[2]  # 24 GB: part of 120b's experts in RAM
    cpu = doctor.placement_lines(LINUX, CPU_BUILD, ContextShape(32768), PlacementOptions())
    assert cpu[1].startswith("  gpt-oss-20b: CPU only: 24 layers")


def test_this_build_as_llama_cpp_reports_it() -> None:
    info = build_info()
    assert "CPU" in info.backends
    assert info.cpu_features.startswith("CPU :")
    assert info.version
    # the libraries beside libllama were read: ggml's base library is always one of them
    assert "ggml-base" in info.libraries
    assert all(name.startswith("ggml-") for name in info.libraries)


def test_serve_warns_at_start_up_when_the_gpu_sits_unused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if "CUDA" in build_info().gpu_backends:
        pytest.skip("the installed llama-cpp-python has CUDA: nothing to warn about")
    fake_nvidia_smi(monkeypatch, tmp_path / "bin")
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit):
        main(["serve", "--model", str(tmp_path / "missing.gguf")])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("NVIDIA GeForce RTX 4090" in w and FIX in w for w in warnings), warnings


def test_serve_without_a_gpu_says_so_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    no_nvidia(monkeypatch, tmp_path)
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit):
        main(["serve", "--model", str(tmp_path / "missing.gguf")])
    gpu_lines = [r for r in caplog.records if "GPU" in r.getMessage()]
    assert len(gpu_lines) == 1
    assert gpu_lines[0].levelno == logging.INFO
    assert not any(FIX in r.getMessage() for r in caplog.records)


def test_the_doctor_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_nvidia_smi(monkeypatch, tmp_path / "bin")
    main(["doctor", "--n-ctx", "65536"])
    out = capsys.readouterr().out
    assert out.startswith("llama-cpp-python ")
    assert "  NVIDIA driver: 580.65.06, runs CUDA 13.0" in out
    assert (
        "  GPU 0: NVIDIA GeForce RTX 4090, 24.0 GiB (23.5 GiB free), compute capability 8.9" in out
    )
    assert "65536-token context, 4 sequences" in out
    assert "  gpt-oss-20b: " in out
    assert "  gpt-oss-120b: " in out
    if "CUDA" not in build_info().gpu_backends:
        assert "WARNING: this machine has NVIDIA GeForce RTX 4090 (24 GiB)" in out

"""The GPU check's carried folder (scripts/gpu_check/prepare.py) and its report, here.

The device tool moves at most 64 MiB of working tree and carried paths, at most 8 paths: the
check carries one folder, which must stay under the 48 MiB the preparation keeps for it, hold
the CUDA sources a build for the GPU needs and none of what the sdist carries beside them. The
rehearsal's first phase writes the JSON and Markdown report the device run writes.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.support.repo_python import run_python

MIB = 1024 * 1024

pytestmark = pytest.mark.slow  # downloads the sdist (cached) and the wheels from PyPI


@pytest.fixture(scope="module")
def carry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gpu-check") / "carry"
    done = run_python(["-m", "scripts.gpu_check.prepare", "--carry", str(folder)], timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def test_the_carried_folder_fits_the_device_tool(carry: Path) -> None:
    manifest = json.loads((carry / "manifest.json").read_text())
    total = sum(p.stat().st_size for p in carry.rglob("*") if p.is_file())
    assert total == manifest["carry_bytes"] or abs(total - manifest["carry_bytes"]) < 4096
    # a build an earlier device run sent back (kept in .gpu-check/builds) rides beside the rest
    builds = sum((carry / name).stat().st_size for name in manifest["builds"])
    assert builds <= 32 * MIB
    assert total - builds < 48 * MIB
    assert sorted(p.name for p in carry.iterdir() if p.name not in manifest["builds"]) == [
        "llama-cpp-python.tar.xz", "manifest.json", "wheels",
    ]  # fmt: skip
    wheels = manifest["wheels"]
    assert all(name.endswith(".whl") for name in wheels)
    names = {name.split("-")[0].lower() for name in wheels}
    assert {"fastapi", "uvicorn", "pydantic", "pydantic_core", "openai_harmony", "gguf"} <= names
    assert not any(name.startswith("numpy") for name in wheels)  # the device has it


def test_the_pruned_source_keeps_what_the_cuda_build_reads(carry: Path) -> None:
    with tarfile.open(carry / "llama-cpp-python.tar.xz") as archive:
        names = archive.getnames()
    assert all(not n.startswith("llama_cpp_python-") for n in names)  # no sdist prefix left
    prefix = "vendor/llama.cpp/"
    kept = {n.removeprefix(prefix) for n in names if n.startswith(prefix)}
    for needed in ("CMakeLists.txt", "ggml/src/ggml-cuda/CMakeLists.txt",
                   "ggml/src/ggml-cuda/mmq.cu", "ggml/src/ggml-cpu/ggml-cpu.c",
                   "tools/llama-bench/llama-bench.cpp", "tools/server/server.cpp",
                   "scripts/ui-assets.cmake", "include/llama.h"):  # fmt: skip
        assert needed in kept, needed
    instances = [n for n in kept if n.startswith("ggml/src/ggml-cuda/template-instances/")]
    assert len(instances) > 50  # the long names too (a tar's pax records)
    assert not any(n.startswith(("models/", "docs/", "ggml/src/ggml-vulkan/")) for n in kept)
    assert "llama_cpp/llama_cpp.py" in names


def test_the_rehearsal_writes_the_report(carry: Path, tmp_path: Path) -> None:
    """The check's first phase on this machine from the prepared folder: the source unpacked,
    the wheels checked for python 3.12 offline."""
    out = tmp_path / "out"
    done = run_python(
        ["-m", "scripts.gpu_check", "--cpu", "--phases", "setup", "--out", str(out), "--carry",
         str(carry), "--work", str(tmp_path / "work")],
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["mode"] == "cpu rehearsal"
    assert [(p["name"], p["status"]) for p in report["phases"]] == [("setup", "ok")]
    table = (out / "gpu-check.md").read_text()
    assert "| setup | ok |" in table
    assert (out / "gpu-check-logs.tar.gz").is_file()
    assert (tmp_path / "work" / "src" / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file()

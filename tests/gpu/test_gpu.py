"""On a real NVIDIA GPU with a CUDA build: doctor's verdict, every layer placed on the GPU,
--idle-unload giving the GPU memory back (nvidia-smi), and the prompt cache restored from disk
into a model on the GPU.

Marked `gpu`: they skip where there is no GPU or the build has no CUDA backend, and fail there
instead with GPT_OSS_REQUIRE_GPU=1 (the GPU check sets it). The model is $GPT_OSS_GPU_MODEL
(the GPU check's synthetic gpt-oss-20b), else the trained tiny model.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devkit.models import TRAINED, cached_gguf
from devkit.serving import server_process
from server.bench.procs import ServerProcess
from server.engine.loading.gguf_header import read_tensor_infos
from tests.support.prompt_cache import disk_metrics, usage

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
MIB = 1024 * 1024


def gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line for line in done.stdout.splitlines() if line.strip()]


def gpu_used_bytes() -> int:
    """Memory in use on GPU 0, every process together (nvidia-smi; the machine is ours)."""
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.split()[0]) * MIB


@pytest.fixture(scope="module", autouse=True)
def cuda_gpu() -> None:
    from server.engine.loading.build import build_info

    reason = None
    if not gpus():
        reason = "no NVIDIA GPU (nvidia-smi lists none)"
    elif "CUDA" not in build_info().gpu_backends:
        reason = "this llama-cpp-python build has no CUDA backend"
    if reason is None:
        return
    if os.environ.get("GPT_OSS_REQUIRE_GPU"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def model() -> Path:
    named = os.environ.get("GPT_OSS_GPU_MODEL")
    return Path(named) if named else cached_gguf(TRAINED)


def gpu_weight_bytes(model: Path) -> int:
    """The bytes of the tensors llama.cpp puts on the GPU: all but the token embedding."""
    return sum(t.n_bytes for t in read_tensor_infos(model) if t.name != "token_embd.weight")


def base(proc: ServerProcess) -> str:
    return proc.health_url.removesuffix("/health")


def wait_for_state(proc: ServerProcess, wanted: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(proc.health_url, timeout=10).json().get("model_state") == wanted:
            return
        time.sleep(0.2)
    raise AssertionError(f"the model never became {wanted}")


@pytest.fixture
def serve(model: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    with server_process(model, tmp_path, "--n-ctx", "4096", "--log-level", "info") as proc:
        yield proc


def test_doctor_sees_the_gpu_and_the_cuda_build() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "server", "doctor"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout + done.stderr
    assert "GPU backends: CUDA" in text
    assert re.search(r"GPU 0: .+ GiB", text), text
    assert "WARNING" not in text, text


def test_auto_places_every_layer_on_the_gpu(serve: ServerProcess, model: Path) -> None:
    answer = httpx.post(f"{base(serve)}/v1/chat/completions", json=CHAT, timeout=300)
    assert answer.status_code == 200, answer.text
    log = serve.log_path.read_text(errors="replace")
    assert "placement on CUDA0" in log, log[-3000:]
    layers = re.search(r"GPU: (\d+)/(\d+) layers", log)
    assert layers is not None, log[-3000:]
    assert layers.group(1) == layers.group(2)
    assert gpu_used_bytes() >= gpu_weight_bytes(model)


def test_idle_unload_gives_the_gpu_memory_back(model: Path, tmp_path: Path) -> None:
    options = ("--n-ctx", "4096", "--idle-unload", "2s", "--log-level", "info")
    with server_process(model, tmp_path, *options) as proc:
        assert httpx.post(f"{base(proc)}/v1/chat/completions", json=CHAT, timeout=300).is_success
        loaded = gpu_used_bytes()
        wait_for_state(proc, "unloaded")
        time.sleep(1.0)  # nvidia-smi's reading trails the frees
        unloaded = gpu_used_bytes()
        assert loaded - unloaded >= 0.8 * gpu_weight_bytes(model), (loaded, unloaded)
        again = httpx.post(f"{base(proc)}/v1/chat/completions", json=CHAT, timeout=300)
        assert again.status_code == 200, again.text
        assert gpu_used_bytes() - unloaded >= 0.8 * gpu_weight_bytes(model)


def test_prompt_cache_restores_into_the_gpu_after_a_restart(model: Path, tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    options = ("--n-ctx", "16384", "--prompt-cache-dir", str(kv))
    with server_process(model, tmp_path, *options) as first:
        cold = usage(first, "A")
    assert cold["input_tokens_details"]["cached_tokens"] == 0
    with server_process(model, tmp_path, *options) as second:
        warm = usage(second, "B")
        metrics = disk_metrics(second)
        log = second.log_path.read_text(errors="replace")
    assert "placement on CUDA0" in log
    assert warm["input_tokens"] == cold["input_tokens"] > 6000
    assert 0 < warm["input_tokens"] - warm["input_tokens_details"]["cached_tokens"] <= 16
    assert metrics["gpt_oss_prompt_cache_disk_hits_total"] == 1

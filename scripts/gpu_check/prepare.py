"""Prepare what the GPU check carries to a machine that reaches no registry.

    python -m scripts.gpu_check.prepare [--carry .gpu-check/carry] [--check]

Writes, under one git-ignored folder (one path of the device tool's `carry`):

- `llama-cpp-python.tar.xz`: the PyPI sdist of the llama-cpp-python that pyproject.toml pins
  (sha256 checked against the index), pruned to what a build of libllama, libmtmd, llama-bench
  and llama-server with the CPU and CUDA backends needs, plus its `llama_cpp` Python package
  (ctypes only: it loads the library the check builds, `LLAMA_CPP_LIB_PATH`). The sdist is
  76.6 MB (a git pack, vocabulary test GGUFs, docs, every other backend); the pruned archive is
  a few MB.
- `wheels/`: the python 3.12 manylinux wheels of the server's dependencies that the device's
  image lacks (fastapi, uvicorn, pydantic, openai-harmony, gguf, bpe-openai, ...), at the
  versions installed here, no sdists.
- `manifest.json`: versions, sha256 sums and sizes.

`--check` only measures an existing carry folder: its size must stay under the device's 64 MiB
(the working tree travels too, so the check keeps a margin for it) and it exits 1 when over.
Standard library only, plus pip.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CARRY = ROOT / ".gpu-check" / "carry"
BUILDS = ROOT / ".gpu-check" / "builds"  # builds device runs sent back, kept between sessions
DEVICE_LIMIT = 64 * 1024 * 1024  # what the device tool moves: the checkout and the carried paths
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpt-oss-server"
INDEX = "https://pypi.org/simple/llama-cpp-python/"
MIB = 1024 * 1024
BUILD_LIMIT = 32 * MIB  # a carried build (CUDA libraries, llama-bench, llama-server) at most
# The device tool moves at most 64 MiB of working tree and carried paths together; the carry
# folder keeps this much of it, the rest is the checkout (a few MiB).
CARRY_LIMIT = 48 * MIB
ARCHIVE = "llama-cpp-python.tar.xz"

# What the CUDA/CPU build of libllama, libmtmd, llama-bench and llama-server does not read:
# paths relative to the sdist's vendor/llama.cpp (fnmatch patterns; a folder goes whole).
PRUNED = (
    ".github", ".devops", "models", "docs", "media", "gguf-py", "conversion", "benches",
    "tests", "examples", "pocs", "app", "skills", "ci", "grammars", "requirements",
    "prompts", "*.py", "*.nix", "flake.lock", "*.md", "AUTHORS", "CODEOWNERS",
    "ggml/tests", "ggml/examples",
    "tools/ui/src", "tools/ui/tests", "tools/ui/static", "tools/ui/package-lock.json",
    "tools/server/tests", "tools/server/bench", "tools/server/themes", "tools/server/public*",
    "tools/mtmd/legacy-models", "tools/*/README*", "tools/*/*.md",
    "scripts/*.py", "scripts/*.sh", "scripts/*/",
    "ggml/src/ggml-cann", "ggml/src/ggml-et", "ggml/src/ggml-hexagon", "ggml/src/ggml-metal",
    "ggml/src/ggml-musa", "ggml/src/ggml-opencl", "ggml/src/ggml-openvino",
    "ggml/src/ggml-sycl", "ggml/src/ggml-virtgpu", "ggml/src/ggml-vulkan",
    "ggml/src/ggml-webgpu", "ggml/src/ggml-zdnn", "ggml/src/ggml-zendnn", "ggml/src/ggml-kompute",
)  # fmt: skip
# Kept although a pattern above matches: what CMake reads.
KEPT = ("scripts/build-info.sh", "scripts/*.cmake", "ggml/src/ggml-cpu/**")

# The server's dependencies (and llama-cpp-python's) that the device's image lacks; their own
# dependencies come with them. Versions: those installed here.
NEEDED = (
    "fastapi", "uvicorn", "pydantic", "pydantic-settings", "openai-harmony", "gguf",
    "bpe-openai", "prometheus-client", "diskcache", "inscriptis", "lxml", "mcp", "tiktoken",
)  # fmt: skip
# What the device's image has (KINDS.md's package list) and the carried packages need only at
# some version any recent image has: not carried. The small pure ones whose versions matter
# (typing-extensions for pydantic, anyio and h11 for starlette and uvicorn) are carried anyway.
ON_DEVICE = {
    "numpy", "psutil", "httpx", "httpcore", "certifi", "huggingface-hub", "hf-xet", "pyyaml",
    "tqdm", "jinja2", "markupsafe", "filelock", "fsspec", "packaging", "requests", "urllib3",
    "charset-normalizer", "regex", "shellingham", "typer", "rich", "markdown-it-py", "mdurl",
    "pygments",
}  # fmt: skip
# Wheels of which the server reads only some files: the rest is left out of the carried copy.
# bpe-openai: the server reads data/o200k_base.tiktoken.gz (locating the package without
# importing it), never its 74 MB Rust extension nor the other vocabularies.
STRIPPED = {
    "bpe-openai": ("bpe_openai/_bindings*", "bpe_openai/data/cl100k*", "bpe_openai/data/voyage*")
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip


def pinned_version() -> str:
    """The llama-cpp-python version pyproject.toml asks for at least (the one CI builds)."""
    found = re.search(r'"llama-cpp-python>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    if found is None:
        raise SystemExit("pyproject.toml names no llama-cpp-python>=VERSION")
    return found.group(1)


def fetch_sdist(version: str) -> Path:
    """The sdist from PyPI's simple index (PEP 691), cached, its sha256 checked."""
    name = f"llama_cpp_python-{version}.tar.gz"
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    entry = next((f for f in files if f["filename"] == name), None)
    if entry is None:
        raise SystemExit(f"PyPI lists no {name}")
    want = entry["hashes"]["sha256"]
    path = CACHE / "sdist" / name
    if not path.is_file() or sha256(path) != want:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        with urllib.request.urlopen(entry["url"], timeout=600) as answer, tmp.open("wb") as f:
            shutil.copyfileobj(answer, f)
        if sha256(tmp) != want:
            tmp.unlink()
            raise SystemExit(f"{name}: sha256 differs from the index's {want}")
        tmp.replace(path)
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pruned(rel: str) -> bool:
    """Whether a path under vendor/llama.cpp stays out of the archive."""
    if any(fnmatch.fnmatch(rel, pattern) for pattern in KEPT):
        return False
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in PRUNED:
        folder = pattern.endswith("/")
        for i, prefix in enumerate(prefixes):
            last = i == len(prefixes) - 1
            if folder and last:
                continue  # "x/" matches folders only, i.e. a prefix with more below it
            if fnmatch.fnmatch(prefix, pattern.rstrip("/")):
                return True
    return False


def write_archive(sdist: Path, out: Path) -> dict[str, int]:
    """The pruned tree as tar.xz, members in a fixed order with fixed times (reproducible)."""
    version = sdist.name.removesuffix(".tar.gz")
    kept = dropped = 0
    buffer = io.BytesIO()
    with tarfile.open(sdist) as src, tarfile.open(fileobj=buffer, mode="w") as dst:
        for member in sorted(src.getmembers(), key=lambda m: m.name):
            rel = member.name.removeprefix(f"{version}/")
            keep = False
            if rel.startswith("llama_cpp/") or rel in ("LICENSE.md", "pyproject.toml"):
                keep = True
            elif rel.startswith("vendor/llama.cpp/"):
                keep = not pruned(rel.removeprefix("vendor/llama.cpp/"))
            if not keep or not (member.isfile() or member.issym()):
                dropped += member.size
                continue
            kept += member.size
            member.name = rel
            member.pax_headers = {}  # a long name's "path" record would restore the old name
            member.mtime = 0
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    out.write_bytes(lzma.compress(buffer.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    return {"unpacked_bytes": kept, "dropped_bytes": dropped}


def installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError as exc:
        raise SystemExit(f"{name} is not installed here: pip install -e '.[test]' first") from exc


def download_wheels(folder: Path) -> list[str]:
    """pip download of NEEDED for CPython 3.12 on manylinux x86-64, wheels only; what the
    device has is dropped again."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    specs = [f"{name}=={installed(name)}" for name in NEEDED]
    command = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "-d", str(folder)]  # fmt: skip
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run([*command, *specs], check=True)
    names = []
    for wheel in sorted(folder.glob("*.whl")):
        project = wheel.name.split("-")[0].lower().replace("_", "-")
        if project in ON_DEVICE:
            wheel.unlink()
            continue
        if project in STRIPPED:
            strip_wheel(wheel, STRIPPED[project])
        names.append(wheel.name)
    for other in folder.iterdir():
        if other.suffix != ".whl":
            raise SystemExit(f"pip downloaded {other.name}, not a wheel")
    return names


def strip_wheel(wheel: Path, patterns: tuple[str, ...]) -> None:
    """Rewrite the wheel without the members matching patterns (RECORD without their lines)."""
    tmp = wheel.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if any(fnmatch.fnmatch(info.filename, p) for p in patterns):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                kept = [
                    ln
                    for ln in lines
                    if not any(fnmatch.fnmatch(ln.split(",")[0], p) for p in patterns)
                ]
                data = ("\n".join(kept) + "\n").encode()
            dst.writestr(info, data)
    tmp.replace(wheel)


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(carry: Path) -> dict[str, int]:
    sizes = {p.name: tree_bytes(p) for p in sorted(carry.iterdir())}
    sizes["total"] = sum(sizes.values())
    return sizes


def join_sent_builds(folders: list[Path], store: Path | None = None) -> list[Path]:
    """Builds a device run wrote under $OUT (`build-<source>-<arch>.tar.xz.part0`, ...), joined
    into `store` (BUILDS); returns every build kept there."""
    store = store or BUILDS
    for folder in folders:
        for first in sorted(folder.glob("build-*.tar.xz.part0")):
            store.mkdir(parents=True, exist_ok=True)
            name = first.name.removesuffix(".part0")
            parts = sorted(folder.glob(f"{name}.part*"), key=lambda p: int(p.suffix[5:]))
            joined = store / f".{name}.joining"
            with joined.open("wb") as sink:
                for part in parts:
                    sink.write(part.read_bytes())
            joined.replace(store / name)
            print(f"kept {name} ({len(parts)} parts) in {store}")
    return sorted(store.glob("build-*.tar.xz"))


def carry_builds(carry: Path, archive_sha256: str, folders: list[Path]) -> list[str]:
    """Carry the kept builds of this source (the check unpacks the one for its GPUs)."""
    for old in carry.glob("build-*.tar.xz"):
        old.unlink()
    carried = []
    for build in join_sent_builds(folders):
        if build.name.startswith(f"build-{archive_sha256[:12]}-"):
            if build.stat().st_size > BUILD_LIMIT:
                print(f"{build.name} is over {BUILD_LIMIT // MIB} MiB: not carried")
                continue
            shutil.copyfile(build, carry / build.name)
            carried.append(build.name)
    return carried


def checkout_bytes() -> int:
    """What the device tool sends beside the carried folder: tracked files and untracked ones
    git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=False).stdout  # fmt: skip
    paths = (ROOT / name for name in listed.decode().split("\0") if name)
    return sum(p.stat().st_size for p in paths if p.is_file())


def check(carry: Path) -> int:
    if not (carry / "manifest.json").is_file():
        print(f"{carry} is not prepared: python -m scripts.gpu_check.prepare", file=sys.stderr)
        return 2
    sizes = measure(carry)
    for name, size in sizes.items():
        print(f"{name:40s} {size / MIB:8.2f} MiB")
    builds = sum(size for name, size in sizes.items() if name.startswith("build-"))
    if sizes["total"] - builds > CARRY_LIMIT:
        print(f"over the {CARRY_LIMIT // MIB} MiB kept for carried files", file=sys.stderr)
        return 1
    sent = sizes["total"] + checkout_bytes()
    print(f"{'with the checkout':40s} {sent / MIB:8.2f} MiB")
    if sent > DEVICE_LIMIT:
        print(f"over the device tool's {DEVICE_LIMIT // MIB} MiB", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--carry", type=Path, default=DEFAULT_CARRY)
    parser.add_argument("--check", action="store_true", help="only measure the carry folder")
    parser.add_argument(
        "--builds",
        type=Path,
        nargs="*",
        default=[],
        help="folders holding the build a device run sent back (its $OUT files): kept in "
        ".gpu-check/builds and carried while the source is the same",
    )
    args = parser.parse_args(argv)
    carry: Path = args.carry
    if args.check:
        return check(carry)
    version = pinned_version()
    sdist = fetch_sdist(version)
    carry.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=carry) as tmp:
        archive = Path(tmp) / ARCHIVE
        unpacked = write_archive(sdist, archive)
        archive.replace(carry / ARCHIVE)
    wheels = download_wheels(carry / "wheels")
    archive_sha256 = sha256(carry / ARCHIVE)
    manifest = {
        "llama_cpp_python": version,
        "sdist_sha256": sha256(sdist),
        "archive_sha256": archive_sha256,
        **unpacked,
        "wheels": wheels,
        "builds": carry_builds(carry, archive_sha256, args.builds),
    }
    (carry / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    manifest["carry_bytes"] = measure(carry)["total"]
    (carry / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return check(carry)


if __name__ == "__main__":
    sys.exit(main())

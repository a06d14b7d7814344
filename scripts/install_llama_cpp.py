"""Install llama-cpp-python built with CMake flags (default: the RPC backend), once per flag set.

pip caches the wheels it builds by download URL only, so `CMAKE_ARGS=... pip install
llama-cpp-python` on a machine that built it before gets the old build, whatever the flags; and
`--no-cache-dir` rebuilds it every time (≈ 8 min on two cores). This script keeps its own wheel
cache keyed by the version, the flags, the interpreter and the platform:

    python scripts/install_llama_cpp.py                         # -DGGML_RPC=on
    python scripts/install_llama_cpp.py --cmake-args "-DGGML_CUDA=on -DGGML_RPC=on"

It runs before the project is installed (standard library only), builds the version that
pyproject.toml asks for at least, and installs it into this interpreter; `pip install -e .`
afterwards keeps it. `--print-wheel` prints the cached wheel's path (CI reuses it).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FLAGS = "-DGGML_RPC=on"


def floor_version() -> str:
    """The lowest llama-cpp-python version pyproject.toml allows (the one CI pins)."""
    found = re.search(r'"llama-cpp-python>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    if found is None:
        raise SystemExit("pyproject.toml names no llama-cpp-python>=VERSION")
    return found.group(1)


def cache_dir(version: str, flags: str) -> Path:
    key = "|".join((version, " ".join(sorted(flags.split())), sys.implementation.cache_tag,
                    sysconfig.get_platform()))  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "gpt-oss-server" / "wheels" / f"llama-cpp-python-{version}-{digest}"


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
    partial.rename(directory)  # complete builds only: an interrupted one is rebuilt
    return sorted(directory.glob("llama_cpp_python-*.whl"))[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmake-args", default=DEFAULT_FLAGS, help="CMAKE_ARGS for the build")
    parser.add_argument("--version", default=None, help="default: pyproject.toml's floor")
    parser.add_argument("--print-wheel", action="store_true", help="print the wheel's path only")
    args = parser.parse_args()
    version = args.version or floor_version()
    wheel = cached_wheel(version, args.cmake_args)
    if args.print_wheel:
        print(wheel)
        return
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(wheel)],
        check=True,
    )
    print(f"installed {wheel.name} built with CMAKE_ARGS={args.cmake_args!r}")


if __name__ == "__main__":
    main()

"""A fake `nvidia-smi` on PATH: what the accelerator detection reads on a machine with a GPU."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from server.ops import accelerator

RTX_4090 = "NVIDIA GeForce RTX 4090, 24564, 24080, 8.9"


def fake_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch,
    directory: Path,
    *,
    driver: str = "580.65.06",
    cuda: str = "13.0",
    gpus: tuple[str, ...] = (RTX_4090,),
    fails: str | None = None,
) -> Path:
    """Put an nvidia-smi script first on PATH (in this process and the children it starts).

    `fails`: the script prints this and exits 9, as nvidia-smi does without a loaded driver.
    """
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    if fails is not None:
        body = f"cat <<'EOF'\n{fails}\nEOF\nexit 9\n"
    else:
        listing = "\n".join(gpus)
        body = (
            'case "$*" in\n'
            f"  *--query-gpu*) cat <<'EOF'\n{listing}\nEOF\n  ;;\n"
            f"  *) echo '| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda} |'"
            "\n  ;;\nesac\n"
        )
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
    return script


def no_nvidia(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No nvidia-smi on PATH and no /proc/driver/nvidia: a machine without an NVIDIA driver."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(accelerator, "NVIDIA_PROC", tmp_path / "no-driver")

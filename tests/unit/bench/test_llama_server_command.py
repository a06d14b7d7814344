"""llama-server's command line for the bench plan: every layer on the GPU is `-ngl all`, since
llama-server reads -1 as `auto` (fit to the free memory) while llama-bench and this server's
engine read it as every layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.bench.llama_bench import BIN_DIR_VAR
from server.bench.llama_server import server_command
from server.bench.plan import Plan


def plan(n_gpu_layers: int) -> Plan:
    return Plan(
        model_path=Path("/models/m.gguf"),
        prompt_sizes=(512,),
        gen_tokens=128,
        repetitions=1,
        warmup=0,
        rounds=1,
        n_threads=2,
        n_gpu_layers=n_gpu_layers,
        n_ctx=1024,
        n_slots=1,
        use_mmap=False,
        flash_attn="auto",
        seed=0,
    )


@pytest.fixture(autouse=True)
def binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "llama-server").write_text("")
    monkeypatch.setenv(BIN_DIR_VAR, str(tmp_path))


@pytest.mark.parametrize(("layers", "flag"), [(-1, "all"), (0, "0"), (12, "12")])
def test_gpu_layers_flag(layers: int, flag: str, tmp_path: Path) -> None:
    command = server_command(plan(layers), 8080)
    assert command[0] == str(tmp_path / "llama-server")
    assert command[command.index("-ngl") + 1] == flag

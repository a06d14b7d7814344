"""The prompt cache's directory is private (server.private_files): the start-up refuses one that
others may write, before minutes of loading, and creates a missing one 0700."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from server.contracts.errors import StartupError
from server.ops.settings import Settings
from server.ops.startup import check_prompt_cache_dir, engine_config, start_engine


def test_serve_refuses_an_unsafe_prompt_cache_dir_before_loading(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    directory.mkdir()
    directory.chmod(0o777)
    settings = Settings(prompt_cache_dir=directory)
    config = engine_config(settings, tmp_path / "no-such-model.gguf")  # never opened
    with pytest.raises(StartupError, match=r"--prompt-cache-dir: .* others than its owner may"):
        start_engine(settings, config)


def test_a_missing_prompt_cache_dir_is_created_0700(tmp_path: Path) -> None:
    directory = tmp_path / "cache" / "kv"
    settings = Settings(prompt_cache_dir=directory)
    check_prompt_cache_dir(engine_config(settings, tmp_path / "model.gguf"))
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_a_file_in_its_place_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kv").write_text("")
    settings = Settings(prompt_cache_dir=tmp_path / "kv")
    with pytest.raises(StartupError, match="is not a directory"):
        check_prompt_cache_dir(engine_config(settings, tmp_path / "model.gguf"))

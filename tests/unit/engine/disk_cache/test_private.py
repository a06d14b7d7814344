"""Private directories (server.engine.disk_cache.private) and the start-up's refusal of an unsafe
prompt-cache directory, before any model is loaded."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from server.contracts.errors import StartupError
from server.engine.disk_cache.private import UnsafeDirectory, private_dir
from server.ops.settings import Settings
from server.ops.startup import engine_config, start_engine


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_missing_directory_is_created_0700(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        made = private_dir(tmp_path / "a" / "kv")
    finally:
        os.umask(umask)
    assert made == tmp_path / "a" / "kv"
    assert mode(made) == 0o700
    assert private_dir(made) == made  # an existing private one is accepted as it is
    assert mode(made) == 0o700


def test_an_existing_0755_directory_of_this_user_is_accepted(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    assert private_dir(directory) == directory


@pytest.mark.parametrize("bits", [0o775, 0o757, 0o777, 0o1777])
def test_a_directory_group_or_others_can_write_is_refused(tmp_path: Path, bits: int) -> None:
    directory = tmp_path / "kv"
    directory.mkdir()
    directory.chmod(bits)
    with pytest.raises(UnsafeDirectory, match=r"can be written by other users.*chmod go-w"):
        private_dir(directory)


def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    directory = tmp_path / "kv"
    directory.mkdir(mode=0o700)
    os.chown(directory, 4242, 4242)
    with pytest.raises(UnsafeDirectory, match=r"belongs to another user \(uid 4242\)"):
        private_dir(directory)


def test_a_link_or_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "file").write_text("")
    for name in ("link", "file"):
        with pytest.raises(UnsafeDirectory, match="is not a directory"):
            private_dir(tmp_path / name)


def test_serve_refuses_an_unsafe_prompt_cache_dir_before_loading(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    directory.mkdir()
    directory.chmod(0o777)
    settings = Settings(prompt_cache_dir=directory)
    config = engine_config(settings, tmp_path / "no-such-model.gguf")  # never opened
    with pytest.raises(StartupError, match=r"--prompt-cache-dir: .* can be written by other"):
        start_engine(settings, config)

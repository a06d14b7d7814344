"""Private files: the responses store and its directory, the helper's checks (as ssh's)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from server.api.messages.signature import load_key
from server.api.responses.store import ResponseStore, StoredResponse
from server.contracts.transcript import UserMessage
from server.private_files import PrivatePathError, open_private, private_dir, private_file
from tests.support.root import require_root

pytestmark = pytest.mark.skipif(os.name != "posix", reason="owners and modes are POSIX")


@pytest.fixture(autouse=True)
def _usual_umask() -> Iterator[None]:
    """The umask most machines have (files 0644, directories 0755 unless told otherwise)."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def another_users(path: Path) -> Path:
    """`path` given to another user (needs root), else a directory of root's for a non-root run."""
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        return path
    return Path("/")


def test_store_directory_and_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "responses.sqlite3"
    store = ResponseStore(path)
    record = StoredResponse("resp_1", {"id": "resp_1"}, (UserMessage("secret plans"),), None)
    store.put_sync(record)  # a write: the -wal and -shm files exist now
    try:
        files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
        assert all(file.exists() for file in files)
        assert mode(path.parent) == 0o700
        assert {file.name: mode(file) for file in files} == {file.name: 0o600 for file in files}
    finally:
        store.close()


def test_store_files_of_earlier_versions_are_made_private(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    store = ResponseStore(path)
    store.count()
    store.close()
    os.chmod(path, 0o644)  # as an earlier version left it
    reopened = ResponseStore(path)
    assert reopened.count() == 0
    reopened.close()
    assert mode(path) == 0o600


@pytest.mark.parametrize("open_mode", [0o775, 0o757, 0o777], ids=oct)
def test_a_directory_others_may_write_is_refused(tmp_path: Path, open_mode: int) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    os.chmod(directory, open_mode)
    store = ResponseStore(directory / "responses.sqlite3")
    with pytest.raises(PrivatePathError, match=f"mode {open_mode:04o}.*chmod go-w"):
        store.count()
    assert not (directory / "responses.sqlite3").exists()


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o755)
    with pytest.raises(PrivatePathError, match="belongs to another user"):
        private_dir(another_users(directory))


def test_private_dir_creates_missing_parents_and_accepts_its_own(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "a" / "b")
    assert made == tmp_path / "a" / "b"
    assert mode(made) == 0o700
    existing = tmp_path / "readable"
    existing.mkdir(mode=0o755)
    assert private_dir(existing) == existing  # read-only for others: accepted, as ssh does
    (tmp_path / "file").write_text("x")
    with pytest.raises(PrivatePathError, match="not a directory"):
        private_dir(tmp_path / "file")


def test_private_files_are_created_0600_and_others_refused(tmp_path: Path) -> None:
    assert mode(private_file(tmp_path / "new")) == 0o600
    with open_private(tmp_path / "written", "wb") as file:
        file.write(b"data")
    assert mode(tmp_path / "written") == 0o600
    readable = tmp_path / "readable"
    readable.write_text("x")  # 0644 under the umask
    with pytest.raises(PrivatePathError, match=r"mode 0644.*chmod 600"):
        private_file(readable)
    private_file(readable, tighten=True)
    assert mode(readable) == 0o600
    (tmp_path / "link").symlink_to(readable)
    with pytest.raises(PrivatePathError, match="symbolic link"):
        open_private(tmp_path / "link")


def test_a_file_of_another_user_is_refused_even_when_tightening(tmp_path: Path) -> None:
    require_root("giving a file to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.write_text("x")
    os.chmod(theirs, 0o600)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(PrivatePathError, match="belongs to another user"):
        private_file(theirs, tighten=True)


def test_the_signing_key_is_drawn_once_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "thinking-signature.key"
    with ThreadPoolExecutor(8) as pool:  # servers starting together on one state directory
        keys = set(pool.map(lambda _: load_key(path), range(16)))
    assert len(keys) == 1
    assert keys == {load_key(path)} == {path.read_bytes()}
    assert mode(path) == 0o600
    assert [file.name for file in tmp_path.iterdir()] == [path.name]  # no drafts left


def test_a_parent_others_may_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    """As ssh's StrictModes: a stranger who may write a parent could swap the directory."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(PrivatePathError, match=f"directory {shared}, above .*mode 0777"):
        private_dir(shared / "mine" / "cache")
    os.chmod(shared, 0o1777)  # sticky, as /tmp: nobody else may rename or delete our entries
    assert private_dir(shared / "mine" / "cache") == shared / "mine" / "cache"


def test_a_parent_reached_through_a_link_is_checked(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    (open_dir / "real").mkdir(parents=True)
    os.chmod(open_dir, 0o777)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "link").symlink_to(open_dir / "real")
    with pytest.raises(PrivatePathError, match=f"directory {open_dir}, above"):
        private_dir(private / "link" / "cache")


def test_a_parent_of_another_user_is_refused(tmp_path: Path) -> None:
    require_root("giving a directory to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    (theirs / "mine").mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(PrivatePathError, match=f"directory {theirs}, above .*another user"):
        private_dir(theirs / "mine")

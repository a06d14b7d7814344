"""Private files: the responses store and its directory, the helper's checks (as ssh's)."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
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
    assert private_dir(tmp_path / "c" / "d" / "e") == tmp_path / "c" / "d" / "e"
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


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_parent_of_any_user_but_this_one_and_root_is_refused(tmp_path: Path) -> None:
    """uid 1 as much as 65534: only this user's and root's parents are trusted."""
    theirs = tmp_path / "daemons"
    (theirs / "mine").mkdir(parents=True, mode=0o755)
    os.chown(theirs, 1, 1)
    with pytest.raises(PrivatePathError, match=r"another user \(uid 1\), who could swap"):
        private_dir(theirs / "mine")


def test_each_mode_opens_as_its_name_says(tmp_path: Path) -> None:
    path = tmp_path / "data"
    with open_private(path, "wb") as file:
        file.write(b"hello")
    with open_private(path, "ab") as file:
        file.write(b" world")
    with open_private(path) as file:  # "rb"
        assert file.read() == b"hello world"
    with open_private(path, "r+b") as file:
        assert file.read(5) == b"hello"
        file.seek(0)
        file.write(b"HE")
    assert path.read_bytes() == b"HEllo world"
    with open_private(path, "wb") as file:
        file.write(b"new")
    assert path.read_bytes() == b"new"
    with pytest.raises(FileExistsError):
        open_private(path, "xb")
    with open_private(tmp_path / "fresh", "xb") as file:
        file.write(b"x")
    assert (tmp_path / "fresh").read_bytes() == b"x"
    assert mode(tmp_path / "fresh") == 0o600
    with pytest.raises(FileNotFoundError):  # read modes create nothing
        open_private(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        open_private(tmp_path / "missing", "r+b")
    assert not (tmp_path / "missing").exists()


def test_a_directory_is_not_a_private_file(tmp_path: Path) -> None:
    with pytest.raises(PrivatePathError, match=re.escape(f"{tmp_path} is not a regular file")):
        open_private(tmp_path)


def test_paths_under_home_are_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert private_dir("~/state") == tmp_path / "state"
    assert mode(tmp_path / "state") == 0o700
    with open_private("~/state/key", "wb") as file:
        file.write(b"k")
    assert (tmp_path / "state" / "key").read_bytes() == b"k"


def refusal(action: Callable[[], object]) -> str:
    with pytest.raises(PrivatePathError) as caught:
        action()
    return str(caught.value)


def test_refusals_say_what_others_may_do_and_how_to_fix_it(tmp_path: Path) -> None:
    directory = tmp_path / "open"
    directory.mkdir()
    os.chmod(directory, 0o770)
    assert refusal(lambda: private_dir(directory)) == (
        f"directory {directory} has mode 0770: others than its owner may change it; "
        f"`chmod go-w {directory}` or choose another path"
    )
    inside = directory / "state"
    assert refusal(lambda: private_dir(inside)) == (
        f"directory {directory}, above {inside}, has mode 0770: others than its owner could "
        f"swap what it holds; `chmod go-w {directory}` (or `chmod +t`) or choose another path"
    )
    file = tmp_path / "readable"
    file.write_text("x")
    os.chmod(file, 0o640)
    assert refusal(lambda: private_file(file)) == (
        f"file {file} has mode 0640: others than its owner may read or change it; "
        f"`chmod 600 {file}` or choose another path"
    )
    os.chmod(file, 0o600)
    assert private_file(file) == file  # already private: accepted as it is
    assert private_file(file, tighten=True) == file
    assert mode(file) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
def test_refusals_name_the_other_user(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.write_text("x")
    os.chmod(theirs, 0o600)
    os.chown(theirs, 65534, 65534)
    assert refusal(lambda: open_private(theirs)) == (
        f"file {theirs} belongs to another user (uid 65534); the server keeps private data "
        "there only in its own: choose another path or change its owner"
    )
    parent = tmp_path / "parent"
    (parent / "mine").mkdir(parents=True)
    os.chown(parent, 1, 1)
    assert refusal(lambda: private_dir(parent / "mine")) == (
        f"directory {parent}, above {parent / 'mine'}, belongs to another user (uid 1), who "
        "could swap what it holds: choose another path"
    )


def test_a_refused_file_leaves_no_descriptor_open(tmp_path: Path) -> None:
    readable = tmp_path / "readable"
    readable.write_text("x")
    before = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else None
    for _ in range(3):
        with pytest.raises(PrivatePathError):
            open_private(readable)
        with pytest.raises(PrivatePathError):
            open_private(tmp_path)
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before

"""The prompt cache on disk, on the real tiny engine: save, restart, restore; faults; budget.

Each test starts engines of its own on a temporary cache directory ("a restart" is closing one
engine and starting another on the same directory). A state restored from disk must give the
same greedy tokens as a cold evaluation of the same prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import os
import random
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from server.engine.base import BatchPart, EngineConfig, EngineResult
from server.engine.disk_cache.kv_files import MAC_BYTES, MAGIC, SUFFIX
from server.engine.disk_cache.prompt_cache import identity
from server.engine.disk_cache.state_layout import StateLayout, read_layout
from server.engine.llama import LlamaEngine
from server.engine.llama_context import LlamaContext
from server.private_files import PrivatePathError
from tests.support.engine_runs import GREEDY
from tests.support.root import require_root

pytestmark = pytest.mark.slow  # engines started and restarted per test


@pytest.fixture(scope="module")
def tiny_gguf(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny model of this module's own: the identity holds the file's mtime,
    and the shared build's mtime is its last use (any test process marks it)."""
    copy = tmp_path_factory.mktemp("model") / tiny_gguf.name
    shutil.copyfile(tiny_gguf, copy)
    return copy


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 100000) for _ in range(n)]


def config(tiny_gguf: Path, directory: Path | None, **changes: object) -> EngineConfig:
    base = EngineConfig(
        model_path=str(tiny_gguf),
        n_ctx=2048,
        n_threads=2,
        prompt_cache_dir=None if directory is None else str(directory),
        prompt_cache_min_tokens=64,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@contextmanager
def running(cfg: EngineConfig) -> Iterator[LlamaEngine]:
    engine = LlamaEngine(cfg)
    try:
        yield engine
    finally:
        engine.close()


def run(
    engine: LlamaEngine, prompt: Sequence[int], save_points: Sequence[int] = ()
) -> tuple[list[int], EngineResult]:
    async def collect() -> tuple[list[int], EngineResult]:
        stream = engine.submit(prompt, GREEDY, None, save_points)
        out = [t async for chunk in stream for t in chunk]
        return out, stream.result

    return asyncio.run(collect())


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SUFFIX}"))


def entry(directory: Path, n_tokens: int) -> Path:
    (found,) = directory.glob(f"*-{n_tokens:08d}-*{SUFFIX}")
    return found


def cold_output(tiny_gguf: Path, prompt: Sequence[int]) -> list[int]:
    with running(config(tiny_gguf, None)) as engine:
        return run(engine, prompt)[0]


def test_a_save_point_survives_a_restart_and_restores_exactly(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    shared = tokens(1, 300)
    with running(config(tiny_gguf, tmp_path)) as engine:
        _, first = run(engine, shared + tokens(2, 100), save_points=[len(shared)])
        assert first.usage.cached_tokens == 0
    assert entry(tmp_path, len(shared)).read_bytes().startswith(MAGIC)
    other = shared + tokens(3, 80)  # a new conversation with the same start
    with running(config(tiny_gguf, tmp_path)) as engine:
        out, result = run(engine, other)
        stats = engine.prompt_cache
    assert result.usage.cached_tokens == len(shared)
    assert result.usage.evaluated_tokens == 80
    assert stats is not None
    assert stats.hits == 1
    assert stats.bytes_read > 0
    assert out == cold_output(tiny_gguf, other)


def test_shutdown_saves_the_conversation(tiny_gguf: Path, tmp_path: Path) -> None:
    prompt = tokens(4, 200)
    with running(config(tiny_gguf, tmp_path)) as engine:
        out, _ = run(engine, prompt)
    held = prompt + out[:-1]  # the last sampled token was never evaluated
    assert entry(tmp_path, len(held)).exists()
    follow_up = held + out[-1:] + tokens(5, 20)
    with running(config(tiny_gguf, tmp_path)) as engine:
        _, result = run(engine, follow_up)
    assert result.usage.cached_tokens == len(held)


def test_corrupted_and_truncated_entries_are_misses_and_deleted(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    shared = tokens(6, 200)
    with running(config(tiny_gguf, tmp_path)) as engine:
        run(engine, shared + tokens(7, 10), save_points=[100, len(shared)])
    longer, shorter = entry(tmp_path, len(shared)), entry(tmp_path, 100)
    data = bytearray(longer.read_bytes())
    data[-MAC_BYTES - 10] ^= 0x01  # a flipped bit in the KV state (the MAC is the last bytes)
    longer.write_bytes(bytes(data))
    shorter.write_bytes(shorter.read_bytes()[:-100])  # a cut-off write
    prompt = shared + tokens(8, 30)
    with running(config(tiny_gguf, tmp_path)) as engine:
        out, result = run(engine, prompt)
        stats = engine.prompt_cache
    assert result.error is None
    assert result.usage.cached_tokens == 0
    assert stats is not None
    assert stats.corrupt == 2
    assert stats.misses == 1
    assert stats.hits == 0
    assert not longer.exists()
    assert not shorter.exists()
    assert out == cold_output(tiny_gguf, prompt)


def test_entries_of_other_settings_or_models_never_load(
    tiny_gguf: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tokens(9, 200)
    with running(config(tiny_gguf, tmp_path)) as engine:
        run(engine, shared + tokens(10, 10), save_points=[len(shared)])
    saved = entry(tmp_path, len(shared))
    prompt = shared + tokens(11, 30)
    for changes in ({"swa_full": False}, {"n_ctx": 1024}, {"flash_attn": "off"}):
        with running(config(tiny_gguf, tmp_path, **changes)) as engine:
            _, result = run(engine, prompt)
        assert result.usage.cached_tokens == 0, changes
    # a file of another identity under this identity's name, signed with this directory's
    # key (as a server of other settings sharing the directory writes it): the identity in
    # its header refuses it, and it is deleted
    foreign = tmp_path / "foreign"
    with running(config(tiny_gguf, foreign, n_ctx=1024)) as engine:
        run(engine, shared + tokens(12, 10), save_points=[len(shared)])
    other = entry(foreign, len(shared)).read_bytes()
    assert other.startswith(MAGIC)
    saved.write_bytes(signed(tmp_path, other[:-MAC_BYTES]))
    caplog.set_level(logging.WARNING, "server.engine.disk_cache")
    with running(config(tiny_gguf, tmp_path)) as engine:
        _, result = run(engine, prompt)
        stats = engine.prompt_cache
    assert result.usage.cached_tokens == 0
    assert stats is not None
    assert stats.corrupt == 1
    assert not saved.exists()
    assert "made by another model or other KV settings" in caplog.text


LAYOUT = StateLayout(magic="d83c14af", n_stream=1, v_trans=False)


def test_the_placement_is_not_part_of_the_identity(tiny_gguf: Path, tmp_path: Path) -> None:
    """A reload places the model by the memory free then: its saved conversations still load."""
    base = config(tiny_gguf, tmp_path)
    placed = dataclasses.replace(base, n_gpu_layers=3, cpu_tensor_patterns=("ffn_.*_exps",))
    assert identity(placed, 2048, LAYOUT) == identity(base, 2048, LAYOUT)
    assert identity(dataclasses.replace(base, swa_full=False), 2048, LAYOUT) != identity(
        base, 2048, LAYOUT
    )
    for layout in (
        dataclasses.replace(LAYOUT, v_trans=True),
        dataclasses.replace(LAYOUT, n_stream=2),
        dataclasses.replace(LAYOUT, magic="d83c14b0"),
    ):
        assert identity(base, 2048, layout) != identity(base, 2048, LAYOUT), layout
    assert identity(base, 1024, LAYOUT) != identity(base, 2048, LAYOUT)
    shared = tokens(44, 200)
    with running(base) as engine:
        run(engine, shared + tokens(45, 10), save_points=[len(shared)])
    with running(dataclasses.replace(base, cpu_tensor_patterns=("ffn_.*_exps",))) as engine:
        _, result = run(engine, shared + tokens(46, 30))
    assert result.usage.cached_tokens == len(shared)


def test_the_layout_is_read_from_the_contexts_own_states(tiny_gguf: Path) -> None:
    """V is stored transposed without flash attention; one stream per sequence when each has
    cells of its own. The probe leaves the context empty; every sequence's states have its
    layout."""
    layouts = {}
    for flash_attn, invariant in (("on", False), ("off", False), ("auto", False), ("on", True)):
        cfg = config(tiny_gguf, None, flash_attn=flash_attn, batch_invariant=invariant)
        ctx = LlamaContext(dataclasses.replace(cfg, n_slots=2))
        try:
            layouts[flash_attn, invariant] = layout = read_layout(ctx.probe_state())
            assert ctx.seq_end(0) == 0
            ctx.decode([BatchPart(1, tokens(120, 3), 0, False)])  # another sequence, more cells
            assert read_layout(ctx.seq_state(1)) == layout
        finally:
            ctx.close()
    on, off = layouts["on", False], layouts["off", False]
    assert (on.v_trans, off.v_trans) == (False, True)
    assert layouts["auto", False] == on  # auto resolves to flash attention on the CPU
    assert (on.n_stream, layouts["on", True].n_stream) == (1, 2)


def test_auto_and_on_share_entries_where_auto_resolves_to_on(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    """The identity holds the layout llama.cpp resolved, not the setting that chose it."""
    shared = tokens(110, 200)
    with running(config(tiny_gguf, tmp_path, flash_attn="on")) as engine:
        run(engine, shared + tokens(111, 10), save_points=[len(shared)])
    with running(config(tiny_gguf, tmp_path, flash_attn="auto")) as engine:
        _, result = run(engine, shared + tokens(112, 30))
    assert result.usage.cached_tokens == len(shared)


def with_identity(data: bytes, identity_of: bytes) -> bytes:
    """The entry `data` (its MAC removed) under the identity in the header of `identity_of`."""

    def header(entry: bytes) -> tuple[dict[str, object], int]:
        size = int.from_bytes(entry[len(MAGIC) : len(MAGIC) + 4], "little")
        return json.loads(entry[len(MAGIC) + 4 : len(MAGIC) + 4 + size]), len(MAGIC) + 4 + size

    fields, end = header(data[:-MAC_BYTES])
    fields["identity"] = header(identity_of)[0]["identity"]
    encoded = json.dumps(fields).encode()
    return MAGIC + len(encoded).to_bytes(4, "little") + encoded + data[end:-MAC_BYTES]


def test_an_entry_of_the_other_v_layout_is_dropped_and_evicts_nothing(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    """A state of the other V layout under this identity (what `--flash-attn auto` resolving
    otherwise after a restart wrote under an identity without the layout) cannot load: it is
    a bad file, deleted once; not a lack of room, for which idle conversations and the slot's
    own prefix would be dropped."""
    shared = tokens(100, 200)
    with running(config(tiny_gguf, tmp_path / "off", flash_attn="off")) as engine:
        run(engine, shared + tokens(101, 10), save_points=[len(shared)])
    other_layout = entry(tmp_path / "off", len(shared)).read_bytes()
    directory = tmp_path / "auto"
    with running(config(tiny_gguf, directory)) as engine:
        run(engine, shared + tokens(101, 10), save_points=[len(shared)])
    planted = entry(directory, len(shared))
    planted.write_bytes(signed(directory, with_identity(other_layout, planted.read_bytes())))
    idle = tokens(102, 100)
    with running(config(tiny_gguf, directory, n_slots=3)) as engine:
        run(engine, idle)  # an idle conversation in one slot
        run(engine, shared[:100] + tokens(103, 10))  # the prompt's first 100 in another
        out, result = run(engine, shared + tokens(104, 30))
        _, back = run(engine, idle + tokens(105, 70))
        stats = engine.prompt_cache
    assert result.usage.cached_tokens == 100  # the slot's own prefix kept
    assert not planted.exists()  # not tried again
    assert back.usage.cached_tokens == 100  # the idle conversation, still in memory
    assert stats is not None
    assert (stats.hits, stats.corrupt) == (0, 1)
    assert out == cold_output(tiny_gguf, shared + tokens(104, 30))


def test_the_budget_deletes_the_least_recently_used(tiny_gguf: Path, tmp_path: Path) -> None:
    with running(config(tiny_gguf, tmp_path)) as engine:
        run(engine, tokens(13, 300), save_points=[299])
    one = entry(tmp_path, 299)
    budget = int(one.stat().st_size * 3.5)  # room for three entries of this size
    cfg = config(tiny_gguf, tmp_path, prompt_cache_bytes=budget)
    with running(cfg) as engine:
        for seed in (14, 15, 16, 17):
            run(engine, tokens(seed, 300), save_points=[299])
        stats = engine.prompt_cache
    assert sum(p.stat().st_size for p in entries(tmp_path)) <= budget
    assert stats is not None
    assert stats.evicted >= 2
    assert not one.exists()  # the least recently used went first


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs the right to mount: root in CI's container). Skipped where that
    right is missing, unless GPT_OSS_REQUIRE_MOUNT=1 (CI), where it is a failure."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount_point)]
    mounted = shutil.which("mount") and subprocess.run(mount, check=False, capture_output=True)
    if not mounted or mounted.returncode != 0:
        reason = "cannot mount a small tmpfs here"
        if os.environ.get("GPT_OSS_REQUIRE_MOUNT") == "1":
            pytest.fail(f"{reason} (GPT_OSS_REQUIRE_MOUNT=1)")
        pytest.skip(reason)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_a_full_disk_stops_saving_with_one_warning(
    tiny_gguf: Path, small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="server.engine.disk_cache.kv_files")
    with running(config(tiny_gguf, small_disk)) as engine:
        for seed in (18, 19, 20):
            _, result = run(engine, tokens(seed, 1700), save_points=range(300, 1700, 300))
            assert result.error is None
        stats = engine.prompt_cache
    full = [r for r in caplog.records if "disk is full" in r.getMessage()]
    assert len(full) == 1
    assert stats is not None
    assert stats.skipped_saves >= 1  # every save after the warning
    assert not list(small_disk.glob(".tmp-*"))  # the failed write left nothing behind


# --- trust: the directory is private, entries are authenticated, odd files are harmless ---


def saved_pair(tiny_gguf: Path, directory: Path, seed: int) -> tuple[list[int], Path, Path]:
    """A 200-token start saved at 100 and 200 tokens: (the start, its 200 and 100 entries)."""
    shared = tokens(seed, 200)
    with running(config(tiny_gguf, directory)) as engine:
        run(engine, shared + tokens(seed + 1, 10), save_points=[100, len(shared)])
    return shared, entry(directory, len(shared)), entry(directory, 100)


def test_an_entry_planted_from_another_directory_is_deleted_not_loaded(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    """Whoever writes a well-formed entry for a known prefix (a public system prompt) without
    the directory's key must not get its KV state loaded."""
    shared, mine, _ = saved_pair(tiny_gguf, tmp_path / "mine", 30)
    _, theirs, _ = saved_pair(tiny_gguf, tmp_path / "theirs", 30)
    assert mine.name == theirs.name  # same model, settings and prefix
    mine.write_bytes(theirs.read_bytes())  # planted: valid format, made elsewhere
    (tmp_path / "mine" / entry(tmp_path / "mine", 100).name).unlink()
    prompt = shared + tokens(32, 30)
    with running(config(tiny_gguf, tmp_path / "mine")) as engine:
        out, result = run(engine, prompt)
        stats = engine.prompt_cache
    assert result.usage.cached_tokens == 0
    assert stats is not None
    assert (stats.hits, stats.corrupt) == (0, 1)
    assert not mine.exists()
    assert out == cold_output(tiny_gguf, prompt)


def test_a_fifo_under_an_entry_name_is_deleted_and_the_shorter_entry_loads(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    shared, longer, shorter = saved_pair(tiny_gguf, tmp_path, 33)
    longer.unlink()
    os.mkfifo(longer)  # opening it to read would wait for a writer forever
    with running(config(tiny_gguf, tmp_path)) as engine:
        _, result = run(engine, shared + tokens(35, 30))
        stats = engine.prompt_cache
    assert result.usage.cached_tokens == 100
    assert stats is not None
    assert (stats.hits, stats.corrupt) == (1, 1)
    assert not longer.exists()
    assert shorter.exists()


def signed(directory: Path, data: bytes) -> bytes:
    """`data` with the directory's entry MAC appended, where the directory has a key."""
    key = directory / "entries.key"
    return data + hmac.digest(key.read_bytes(), data, "sha256") if key.exists() else data


def test_an_entry_with_a_malformed_header_is_deleted_and_the_shorter_entry_loads(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    """Even under the right key: a header whose fields have the wrong types is a bad file (it
    must not hide the valid shorter entry on every later lookup)."""
    shared, longer, shorter = saved_pair(tiny_gguf, tmp_path, 36)
    saved = longer.read_bytes()
    size = int.from_bytes(saved[len(MAGIC) : len(MAGIC) + 4], "little")
    fields = json.loads(saved[len(MAGIC) + 4 : len(MAGIC) + 4 + size])  # the right identity
    header = json.dumps({**fields, "payload_bytes": "x"}).encode()
    data = MAGIC + len(header).to_bytes(4, "little") + header + bytes(1000)
    longer.write_bytes(signed(tmp_path, data))
    prompt = shared + tokens(38, 30)
    for _ in range(2):  # the bad file is gone after the first lookup
        with running(config(tiny_gguf, tmp_path)) as engine:
            _, result = run(engine, prompt)
        assert result.usage.cached_tokens == 100
        assert not longer.exists()
    assert shorter.exists()


def test_the_budget_deletes_only_entries(tiny_gguf: Path, tmp_path: Path) -> None:
    """Files that are not entries, and another process's temporary file being written, stay;
    only a stale temporary file of the cache's own naming is cleaned up."""
    _, longer, _ = saved_pair(tiny_gguf, tmp_path, 39)
    notes = tmp_path / "notes.kv"
    notes.write_bytes(bytes(longer.stat().st_size * 4))
    writing = tmp_path / f".tmp-999999-1-{longer.name}"  # another server's write in progress
    writing.write_bytes(bytes(100))
    stale = tmp_path / f".tmp-999999-2-{longer.name}"  # left by a process killed long ago
    stale.write_bytes(bytes(100))
    foreign_stale = tmp_path / ".tmp-editor-swap"
    foreign_stale.write_bytes(bytes(100))
    for old in (stale, foreign_stale):
        os.utime(old, (time.time() - 2 * 3600,) * 2)
    budget = int(longer.stat().st_size * 2.5)
    with running(config(tiny_gguf, tmp_path, prompt_cache_bytes=budget)) as engine:
        for seed in (41, 42, 43):
            run(engine, tokens(seed, 300), save_points=[299])
        stats = engine.prompt_cache
    assert stats is not None
    assert stats.evicted >= 1
    assert notes.exists()
    assert writing.exists()
    assert foreign_stale.exists()
    assert not stale.exists()
    kept = [p for p in entries(tmp_path) if p != notes and not p.name.startswith(".")]
    assert sum(p.stat().st_size for p in kept) <= budget


def test_the_directory_is_private_and_entries_are_0600(tiny_gguf: Path, tmp_path: Path) -> None:
    directory = tmp_path / "new" / "kv"
    umask = os.umask(0o022)
    try:
        saved_pair(tiny_gguf, directory, 44)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = list(directory.iterdir())
    assert len(files) >= 2
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}


@pytest.mark.parametrize("unsafe", ["group-writable", "another user's"])
def test_a_directory_others_can_write_is_refused(
    tiny_gguf: Path, tmp_path: Path, unsafe: str
) -> None:
    directory = tmp_path / "kv"
    directory.mkdir()
    if unsafe == "group-writable":
        directory.chmod(0o775)
        expected = "others than its owner may change it"
    else:
        require_root("giving a directory to another user needs root")
        os.chown(directory, 4242, 4242)
        directory.chmod(0o700)
        expected = "belongs to another user"
    with pytest.raises(PrivatePathError, match=expected):
        LlamaEngine(config(tiny_gguf, directory))
    assert list(directory.iterdir()) == []


# --- memory: reads only for jobs about to run, one read per entry, queue order kept ---

LONG = dataclasses.replace(GREEDY, max_tokens=1000, stop_tokens=frozenset())


def test_disk_reads_wait_until_a_slot_is_free(tiny_gguf: Path, tmp_path: Path) -> None:
    """A burst after a restart must not hold every waiting job's state in memory: while the one
    slot is busy nothing is read; then each job is read when it can run."""
    starts = [tokens(50 + i, 200) for i in range(3)]
    with running(config(tiny_gguf, tmp_path)) as engine:
        for start in starts:
            run(engine, start + tokens(60, 5), save_points=[len(start)])
    sizes = sum(p.stat().st_size for p in tmp_path.glob(f"*-{200:08d}-*{SUFFIX}"))

    async def burst(engine: LlamaEngine) -> tuple[int, list[EngineResult]]:
        busy = engine.submit(tokens(70, 100), LONG)
        await anext(aiter(busy))  # it runs in the only slot
        waiting = [engine.submit(start + tokens(71, 20), GREEDY) for start in starts]
        later = time.monotonic() + 1.0
        steps = 0
        async for chunk in busy:  # the engine steps on: time enough for reads, had they started
            steps += len(chunk)
            if steps >= 30 and time.monotonic() > later:
                break
        stats = engine.prompt_cache
        assert stats is not None
        read_while_busy = stats.bytes_read
        assert engine.load.running == 1  # still busy: the check above meant something
        busy.cancel()
        for stream in [busy, *waiting]:
            async for _ in stream:
                pass
        return read_while_busy, [stream.result for stream in waiting]

    with running(config(tiny_gguf, tmp_path, n_slots=1)) as engine:
        read_while_busy, results = asyncio.run(burst(engine))
        stats = engine.prompt_cache
    assert read_while_busy == 0
    assert [r.usage.cached_tokens for r in results] == [200, 200, 200]
    assert stats is not None
    assert stats.bytes_read == sizes


def test_jobs_waiting_on_one_entry_share_one_read_and_keep_their_order(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    shared = tokens(80, 300)
    with running(config(tiny_gguf, tmp_path)) as engine:
        run(engine, shared + tokens(81, 5), save_points=[len(shared)])
    size = entry(tmp_path, len(shared)).stat().st_size
    prompts = [shared + tokens(82 + i, 20) for i in range(3)]

    async def together(engine: LlamaEngine) -> tuple[list[int], list[EngineResult]]:
        busy = engine.submit(tokens(90, 50), LONG)  # keeps the engine thread stepping
        await anext(aiter(busy))
        streams = [engine.submit(prompt, GREEDY) for prompt in prompts]  # one step's arrivals
        first: list[int] = []

        async def consume(index: int) -> None:
            async for _ in streams[index]:
                if index not in first:
                    first.append(index)

        await asyncio.gather(*(consume(i) for i in range(len(streams))))
        busy.cancel()
        async for _ in busy:
            pass
        return first, [stream.result for stream in streams]

    with running(config(tiny_gguf, tmp_path, n_slots=4)) as engine:
        first, results = asyncio.run(together(engine))
        stats = engine.prompt_cache
    assert stats is not None
    assert stats.bytes_read == size  # one read for the three
    assert all(r.usage.cached_tokens >= len(shared) for r in results)
    assert first == [0, 1, 2]  # started (so prefilled, so answered) in their queue order


def test_the_saves_at_shutdown_wait_for_room(tiny_gguf: Path, tmp_path: Path) -> None:
    """Two conversations held at shutdown, room for one state waiting for the writer (the
    budget bounds it): the second save waits for the first write instead of being dropped."""
    with running(config(tiny_gguf, tmp_path)) as engine:
        run(engine, tokens(47, 300), save_points=[299])
    size = entry(tmp_path, 299).stat().st_size
    cfg = config(tiny_gguf, tmp_path / "two", n_slots=2, prompt_cache_bytes=int(size * 1.5))

    async def both(engine: LlamaEngine) -> None:
        streams = [engine.submit(tokens(seed, 300), GREEDY) for seed in (48, 49)]
        for stream in streams:
            _ = [t async for chunk in stream for t in chunk]

    with running(cfg) as engine:
        asyncio.run(both(engine))
        stats = engine.prompt_cache
    assert stats is not None
    assert (stats.saves, stats.skipped_saves) == (2, 0)

"""The test models, built once per machine: the synthetic presets (server/synth) and the trained
tiny model (devkit/trained), cached under ~/.cache/gpt-oss-server/synthetic (or
$GPT_OSS_TEST_CACHE) by a hash of what decides their bytes, safe under concurrent builders.

`python -m devkit.models --preset tiny|20b|trained --out PATH` writes one to a path.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devkit.trained import model as trained_model
from server.ops import settings
from server.synth import build

logger = logging.getLogger(__name__)

TRAINED = "trained"
PRESETS = [*sorted(build.PRESETS), TRAINED]


def build_model(preset: str, out_path: Path, seed: int = 0) -> Path:
    """Write the `preset` model at out_path (atomically). The trained preset ignores seed: its
    weights are the committed trained parameters."""
    if preset == TRAINED:
        return build.write_atomically(out_path, trained_model.write_gguf)
    return build.build_gguf(preset, out_path, seed)


def builder_hash() -> str:
    """Short hash of the builder's sources: cache key so that a changed builder rebuilds."""
    digest = hashlib.sha256()
    for path in build.builder_sources():
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def default_cache_dir() -> Path:
    env = os.environ.get("GPT_OSS_TEST_CACHE")
    if env:
        return Path(env)
    return settings.default_cache_dir() / "synthetic"


# Every change to the builder (or to the trained parameters) names a new file; the builds it
# replaces are removed once no one has used them for a while, so that the cache holds about one
# model per preset and not one per edit (the 20b preset is 12 GB).
KEEP_NEWEST = 2  # builds of a preset kept whatever their age: another checkout may use one
STALE_AFTER_S = 3600.0  # an older build is removed once unused this long


def _lock_path(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


def _use_marker(path: Path) -> Path:
    return path.parent / f".{path.name}.used"


def _use(path: Path) -> bool:
    """Mark a cached build as used now (a marker file's mtime: what pruning reads); False if
    it is gone. The model file itself is never touched: its mtime is part of the identity of
    the KV states a server saves for it (prompt cache), so marking it would make every server
    that runs meanwhile miss the states saved before. Under a shared lock on the build's lock
    file, which pruning takes exclusively, so a build in use is either marked before pruning
    looks at it or found gone here."""
    with open(_lock_path(path), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        if not path.exists():
            return False
        with contextlib.suppress(OSError):  # a read-only cache: there, just not ours to mark
            _use_marker(path).touch()
    return True


def _last_used(path: Path) -> float:
    """When the build was last used: its marker's mtime, or the build's own where later (a
    build not yet used again since it was written)."""
    times = []
    for candidate in (path, _use_marker(path)):
        try:
            times.append(candidate.stat().st_mtime)
        except FileNotFoundError:  # never marked, or removed by another process's pruning
            continue
    return max(times, default=0.0)


def prune_builds(directory: Path, family: str, keep: Path, now: float | None = None) -> list[Path]:
    """Remove the builds `directory/{family}*.gguf` other than `keep` and the KEEP_NEWEST
    most recently used, where unused for STALE_AFTER_S; returns those removed."""
    now = time.time() if now is None else now
    builds = [p for p in directory.glob(f"{family}*.gguf") if p != keep]
    builds.sort(key=_last_used, reverse=True)
    removed = []
    for old in builds[max(0, KEEP_NEWEST - 1) :]:
        lock_path = _lock_path(old)
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # being built or marked used right now
                continue
            if now - _last_used(old) < STALE_AFTER_S:
                continue
            old.unlink(missing_ok=True)  # (another process's pruning may have been first)
            removed.append(old)
            _use_marker(old).unlink(missing_ok=True)
            lock_path.unlink(missing_ok=True)
    if removed:
        logger.info("removed %d unused synthetic model build(s): %s", len(removed),
                    ", ".join(p.name for p in removed))  # fmt: skip
    return removed


def cached_gguf(preset: str = "tiny", cache_dir: Path | None = None) -> Path:
    """Path of the synthetic `preset` model, built once per machine (safe under races); a new
    build removes the preset's earlier builds that have gone unused (prune_builds)."""
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    if preset == TRAINED:
        family = "gpt-oss-trained-"
        path = directory / f"{family}{trained_model.content_hash()}.gguf"
    else:
        family = f"gpt-oss-{preset}-synthetic-"
        path = directory / f"{family}{builder_hash()}.gguf"
    if path.exists() and _use(path):
        return path
    with open(_lock_path(path), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            build_model(preset, path)
            prune_builds(directory, family, path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--preset", choices=PRESETS, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    start = time.perf_counter()
    path = build_model(args.preset, args.out, args.seed)
    seconds = round(time.perf_counter() - start, 2)
    size = path.stat().st_size
    logger.info("wrote %s: %d bytes in %.2f s", path, size, seconds)
    print(json.dumps({"path": str(path), "size_bytes": size, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The server on the trained tiny gpt-oss (the `trained` preset), for unscripted agent tests.

Nothing is forced: the hook (devkit.floors.Generations) only records every generation. The
server is greedy by default (temperature 0: clients that send none get the same tokens every
run) and dates every conversation CONVERSATION_DATE (--conversation-date;
devkit/trained/tasks.py), so the server's part of a prompt is the same tokens on any day.

Control runs: GPT_OSS_TRAINED_GGUF serves another GGUF (the earlier model, a perturbed one), and
GPT_OSS_TRAINED_COPY_ONE_IN=10 makes the model the baseline that copies one item in ten; the
floors must then fail (devkit/notes/trained-model-runs.md).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from openai_harmony import HarmonyEncoding
from starlette.types import ASGIApp

from devkit import floors
from devkit.floors import TrainedServer
from devkit.trained.tasks import MODEL_NAME
from server.private_files import open_private, private_dir
from tests.support.responses import StreamRecorder

MODEL = MODEL_NAME
__all__ = ["MODEL", "TrainedServer", "trained_server"]


@contextmanager
def trained_server(
    encoding: HarmonyEncoding,
    store_dir: Path,
    n_ctx: int,
    recorder: Callable[[ASGIApp], Any] = StreamRecorder,
) -> Iterator[TrainedServer]:
    gguf = os.environ.get("GPT_OSS_TRAINED_GGUF")
    one_in = os.environ.get("GPT_OSS_TRAINED_COPY_ONE_IN")
    with floors.trained_server(
        encoding,
        store_dir,
        n_ctx,
        recorder,
        gguf=Path(gguf) if gguf else None,
        copy_one_in=int(one_in) if one_in else None,
    ) as running:
        yield running


@contextmanager
def locked_place(place: Path, lock_name: str) -> Iterator[Path]:
    """`place`, a fixed directory made empty, held under a lock beside it while a module's tests
    run (another test run on the machine waits for it), removed afterwards. Its parent must be
    this user's alone (private_dir), or the test fails."""
    with open_private(private_dir(place.parent) / lock_name, "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(place, ignore_errors=True)
        place.mkdir()
        try:
            yield place
        finally:
            shutil.rmtree(place, ignore_errors=True)

"""The browser's page work off the server's event loop: worker processes with a time limit.

Making a page (HTML to text, wrapping, find, search results: page.py) can take seconds on a
large page, and Python code cannot be interrupted from another thread, so it runs in a small
pool of worker processes (pebble): a call past its time limit, or whose caller is cancelled (the
tool's timeout), has its worker killed and a fresh one started; the event loop only waits. The
workers are spawned (a threaded server is never forked) when the tool is made, and kept, so a
small page costs a round trip between processes; they run at a lower priority than the server
(NICENESS), so that where cores are few a page's work waits for the server's streams.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from pebble import ProcessExpired, ProcessPool

from server.tools.browser.page import PageError

T = TypeVar("T")
NICENESS = 10  # the workers' priority below the server's: a page never slows its streams


def _lower_priority() -> None:
    """Run in each worker as it starts."""
    os.nice(NICENESS)


class PageWorkers:
    """`workers` processes shared by every conversation."""

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers
        self._pool: ProcessPool | None = None

    def start(self) -> None:
        """Start the workers now (in the background: spawning takes a moment), so that the first
        call does not wait for them."""
        self._started().schedule(abs, (0,))

    def _started(self) -> ProcessPool:
        if self._pool is None:
            self._pool = ProcessPool(
                self.workers,
                initializer=_lower_priority,
                context=multiprocessing.get_context("spawn"),
            )
        return self._pool

    async def run(self, function: Callable[..., T], *args: Any, timeout_s: float) -> T:
        """`function(*args)` in a worker: its result, or a PageError when it raised, ran past
        `timeout_s` or its worker died. Cancelling the caller kills the worker."""
        future = self._started().schedule(function, args, timeout=timeout_s)
        try:
            return await asyncio.wrap_future(future)
        except TimeoutError as exc:
            raise PageError(f"Reading the page took longer than {timeout_s:g} s.") from exc
        except ProcessExpired as exc:
            raise PageError("The page could not be read: its worker process ended.") from exc
        except BrokenProcessPool as exc:  # no worker could start: the next call tries anew
            await self.close()
            raise PageError("The page could not be read: no worker process could start.") from exc
        except Exception as exc:  # the page's own failure (a parser's), never the server's
            raise PageError(f"The page could not be read: {type(exc).__name__}.") from exc

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()  # type: ignore[no-untyped-call]  # pebble leaves it untyped
            await asyncio.to_thread(pool.join)

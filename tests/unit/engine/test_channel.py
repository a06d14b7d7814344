"""TokenChannel: paced chunks, the first token and the end never held back, no wake per token.

The engine side runs in a thread of its own, as the engine's; pacing intervals are far longer
than anything here takes, so no assertion depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from unittest import mock

from server.contracts.events import Timings, Usage
from server.engine.base import EngineResult, StopReason
from server.engine.channel import TokenChannel

LONG = 30.0  # seconds: a pacing interval no test may wait out


def result() -> EngineResult:
    return EngineResult(StopReason.MAX_TOKENS, Usage(1, 0, 1, 3), Timings(), None, None)


def step(channel: TokenChannel, *tokens: int) -> None:
    """An engine step's tokens for one generation: pushed, then flushed (Scheduler.step)."""
    for token in tokens:
        channel.push(token)
    channel.flush()


async def consume(channel: TokenChannel, interval: float, got: list[list[int]]) -> float:
    started = time.perf_counter()
    async for chunk in channel.paced(interval):
        got.append(chunk)
    return time.perf_counter() - started


def test_first_token_at_once_then_the_rest_together_when_the_generation_ends() -> None:
    async def main() -> tuple[list[list[int]], float, int]:
        loop = asyncio.get_running_loop()
        channel = TokenChannel(loop)
        got: list[list[int]] = []
        first_seen = threading.Event()

        async def watch() -> None:
            while not got:
                await asyncio.sleep(0.001)
            first_seen.set()

        def engine() -> None:
            step(channel, 1)
            assert first_seen.wait(LONG)  # the first token reached the consumer alone
            for token in range(2, 50):
                step(channel, token)
            channel.close(result())

        with mock.patch.object(
            loop, "call_soon_threadsafe", wraps=loop.call_soon_threadsafe
        ) as wakes:
            thread = threading.Thread(target=engine)
            thread.start()
            watcher = asyncio.ensure_future(watch())
            elapsed = await consume(channel, LONG, got)
            await watcher
            thread.join()
        return got, elapsed, wakes.call_count

    got, elapsed, wakes = asyncio.run(main())
    assert got == [[1], list(range(2, 50))]
    assert elapsed < LONG / 2  # the end cut the pacing short
    assert wakes == 2  # the first token, the end: none for the 48 tokens in between


def test_unpaced_chunks_hold_every_token_in_order() -> None:
    async def main() -> list[list[int]]:
        channel = TokenChannel(asyncio.get_running_loop())

        def engine() -> None:
            for token in range(500):
                step(channel, token)
                if token % 50 == 0:
                    time.sleep(0.002)
            channel.close(result())

        thread = threading.Thread(target=engine)
        thread.start()
        got: list[list[int]] = []
        await consume(channel, 0.0, got)
        thread.join()
        return got

    got = asyncio.run(main())
    assert [t for chunk in got for t in chunk] == list(range(500))
    assert all(got)  # no empty chunk


def test_a_consumer_that_waits_for_the_next_token_is_woken_by_it() -> None:
    async def main() -> list[list[int]]:
        channel = TokenChannel(asyncio.get_running_loop())
        got: list[list[int]] = []
        task = asyncio.ensure_future(consume(channel, 0.0, got))
        await asyncio.sleep(0.01)  # the consumer waits: nothing was pushed yet
        threading.Thread(target=step, args=(channel, 7)).start()
        while not got:
            await asyncio.sleep(0.001)
        threading.Thread(target=channel.close, args=(result(),)).start()
        await asyncio.wait_for(task, LONG)
        return got

    assert asyncio.run(main()) == [[7]]


def test_after_a_chunk_the_consumer_unpaces_the_next_comes_at_once() -> None:
    """Harmony's header tokens show the client nothing: the consumer says so (`unpace`), and the
    first text that follows is handed over when it comes, not a pacing interval later; the
    chunk after a shown one is paced again."""

    async def main() -> tuple[list[list[int]], float]:
        channel = TokenChannel(asyncio.get_running_loop())
        got: list[list[int]] = []
        taken = [threading.Event(), threading.Event()]

        def engine() -> None:
            try:
                step(channel, 1)  # a header token
                if taken[0].wait(LONG):
                    step(channel, 2)  # the first text: not held back
                if taken[1].wait(LONG):
                    step(channel, 3)  # paced again: it comes with the end
            finally:
                channel.close(result())

        thread = threading.Thread(target=engine)
        started = time.perf_counter()
        thread.start()
        second_after = LONG
        async for chunk in channel.paced(LONG):
            got.append(chunk)
            if chunk == [1]:
                channel.unpace()
            elif chunk == [2]:
                second_after = time.perf_counter() - started
            if len(got) <= len(taken):
                taken[len(got) - 1].set()
        thread.join()
        return got, second_after

    got, second_after = asyncio.run(main())
    assert got == [[1], [2], [3]]
    assert second_after < LONG / 2


def test_a_steps_tokens_wake_the_consumer_once_at_the_flush() -> None:
    """The header tokens and the first text token picked in one step reach the consumer in one
    chunk: pushing wakes nothing (a consumer woken at the first token took the GIL from the
    picks after it), the flush wakes it once."""

    async def main() -> tuple[list[list[int]], list[int]]:
        loop = asyncio.get_running_loop()
        channel = TokenChannel(loop)
        got: list[list[int]] = []
        counts: list[int] = []
        with mock.patch.object(
            loop, "call_soon_threadsafe", wraps=loop.call_soon_threadsafe
        ) as wakes:
            task = asyncio.ensure_future(consume(channel, 0.0, got))
            await asyncio.sleep(0.01)  # the consumer waits for the first wake

            def engine() -> None:
                for token in (200005, 35644, 200008, 1000):  # <|channel|>analysis<|message|> text
                    channel.push(token)
                counts.append(wakes.call_count)
                channel.flush()
                counts.append(wakes.call_count)

            thread = threading.Thread(target=engine)
            thread.start()
            while not got:
                await asyncio.sleep(0.001)
            thread.join()
            channel.close(result())
            await asyncio.wait_for(task, LONG)
        return got, counts

    got, counts = asyncio.run(main())
    assert counts == [0, 1]
    assert got == [[200005, 35644, 200008, 1000]]


def test_evaluating_waits_for_the_engine_to_begin_or_end_and_no_longer_than_asked() -> None:
    """A consumer waits in `evaluating` until the engine thread says it begins (`begin`) or the
    generation ends, and at most the time it gives."""

    async def main() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        waits = []
        for engine_side in ("begin", "close", None):
            channel = TokenChannel(loop)
            started = time.perf_counter()
            if engine_side is not None:
                act = (
                    channel.begin if engine_side == "begin" else lambda c=channel: c.close(result())
                )
                threading.Timer(0.05, act).start()
            await channel.evaluating(LONG if engine_side else 0.1)
            waits.append(time.perf_counter() - started)
            started = time.perf_counter()
            await channel.evaluating(LONG if engine_side else 0.0)  # once begun: at once
            if engine_side:
                assert time.perf_counter() - started < LONG / 2
        return waits[0], waits[1], waits[2]

    begun, ended, never = asyncio.run(main())
    assert 0.04 < begun < LONG / 2
    assert 0.04 < ended < LONG / 2
    assert 0.09 < never < LONG / 2  # nobody began it: the time given


def test_a_cancel_watch_hears_the_cancel_once_watched_and_never_after_its_end() -> None:
    """`on_cancel`: the callback runs on the thread that cancels (at once when the channel was
    cancelled before the watch began), and not after the watch ended."""
    loop = asyncio.new_event_loop()
    try:
        heard: list[str] = []
        watched = TokenChannel(loop)
        watched.on_cancel(lambda: heard.append(threading.current_thread().name))
        other = TokenChannel(loop)
        unwatch = other.on_cancel(lambda: heard.append("ended watch"))
        unwatch()
        assert heard == []
        thread = threading.Thread(target=watched.cancel, name="consumer")
        thread.start()
        thread.join()
        other.cancel()
        assert heard == ["consumer"]
        watched.on_cancel(lambda: heard.append("late"))
        assert heard == ["consumer", "late"]
    finally:
        loop.close()


def test_a_channel_whose_loop_is_gone_is_cancelled_and_says_so() -> None:
    """The engine finds the consumer's loop closed (nobody listens): the channel is cancelled,
    and a decode watching it hears it, as from a client that left."""
    loop = asyncio.new_event_loop()
    channel = TokenChannel(loop)
    heard: list[bool] = []
    channel.on_cancel(lambda: heard.append(channel.cancelled))
    loop.close()
    step(channel, 1)
    assert channel.cancelled
    assert heard == [True]

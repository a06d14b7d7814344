"""Serve the app with uvicorn: a banner once listening, and a graceful shutdown.

On SIGTERM or Ctrl-C, uvicorn stops accepting connections and waits for the requests in flight.
After `shutdown_grace_s`, the engine is stopped: every generation still running ends, and its
stream gets its terminal event (the API layer's answer to an engine that shut down) instead of a
cut connection. Requests waiting for the model to load again (--idle-unload) end at the signal
itself, and the load stops: the drain does not wait for a whole load. A second Ctrl-C quits at
once. The process then exits with status 0 (uvicorn re-raises the signal it caught once it is
done; the handlers installed here absorb it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

import uvicorn

from server.engine.rpc.hosts import is_loopback
from server.ops.healthcheck import ALL_INTERFACES, client_url
from server.ops.runtime import Runtime, ServedModels
from server.ops.settings import Settings

log = logging.getLogger("gpt_oss_server")

BACKSTOP_S = 10  # after the grace period, how long uvicorn waits before cancelling tasks
WS_MARGIN = 64 * 1024  # bytes past --max-request-bytes a WebSocket message is still read


class GracefulServer(uvicorn.Server):
    """uvicorn.Server that announces itself once listening and bounds the shutdown drain."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        on_started: Callable[[], None],
        stop_generations: Callable[[], None],
        grace_s: float,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self._on_started = on_started
        self._stop_generations = stop_generations
        self._grace_s = grace_s
        self._on_shutdown = on_shutdown

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()
        stopper = asyncio.create_task(self._stop_after_grace())
        try:
            await super().shutdown(sockets)
        finally:
            stopper.cancel()

    async def _stop_after_grace(self) -> None:
        await asyncio.sleep(self._grace_s)
        if self.server_state.connections or self.server_state.tasks:
            log.warning(
                "requests still running %g s after the shutdown signal: stopping their "
                "generations (each stream gets its terminal event)",
                self._grace_s,
            )
            await asyncio.to_thread(self._stop_generations)


def exposure_warning(host: str, has_api_key: bool) -> str | None:
    """The warning to print when the server is reachable from other machines without a key."""
    if has_api_key or is_loopback(host):
        return None
    where = "all interfaces" if host in ALL_INTERFACES else host
    rule = "!" * 78
    return "\n".join(
        [
            rule,
            f"!! gpt-oss-server listens on {where} WITHOUT an API key.",
            "!! Anyone who can reach this port can use the model and read stored responses.",
            "!! Set --api-key (or GPT_OSS_API_KEY), or bind --host 127.0.0.1.",
            rule,
        ]
    )


def serve(
    app: Any, settings: Settings, models: ServedModels, on_started: Callable[[], None]
) -> None:
    """Run until SIGTERM or Ctrl-C, then drain (see the module docstring)."""
    warning = exposure_warning(settings.host, settings.api_key is not None)

    def started() -> None:
        on_started()
        if warning is not None:  # last, under the banner, where it is seen
            log.warning("\n%s", warning)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s) + BACKSTOP_S,
        # the Responses socket reads messages up to the request body limit and answers one a
        # little over it with an error event; uvicorn closes on a larger one (1009) unread
        ws_max_size=settings.max_request_bytes + WS_MARGIN,
    )
    server = GracefulServer(
        config,
        on_started=started,
        stop_generations=models.close,
        grace_s=settings.shutdown_grace_s,
        # requests waiting for a model to load end at once, and the loads stop
        on_shutdown=models.begin_shutdown,
    )
    with _absorb_replayed_signals():
        server.run()
    log.info("gpt-oss-server stopped")


@contextmanager
def _absorb_replayed_signals() -> Iterator[None]:
    """Handlers for the signal uvicorn replays after its own graceful shutdown."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def absorb(signum: int, _frame: FrameType | None) -> None:
        log.debug("signal %d handled by the graceful shutdown", signum)

    previous = {sig: signal.signal(sig, absorb) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def banner(settings: Settings, runtime: Runtime, others: Sequence[Runtime] = ()) -> str:
    """What the server says once it listens: model (and the others it serves), placement, URL,
    a snippet to paste."""
    info = runtime.engine.info
    url = client_url(settings.host, settings.port)
    placement = runtime.placement.summary if runtime.placement else "see the log above"
    where = " (all interfaces)" if settings.host in ALL_INTERFACES else ""
    lines = [
        "gpt-oss-server is ready",
        f"  model      {runtime.model_name}: {info.description}, {info.size_bytes / 1e9:.1f} GB",
        f"  file       {info.path}",
        f"  context    {info.n_ctx} tokens (trained for {info.n_ctx_train})",
        f"  placement  {placement}",
        *(
            f"  also       {other.model_name}: {other.engine.info.path} (loaded on demand)"
            for other in others
        ),
        f"  API        {url}{where}: /chat/completions, /responses, /models (and /health)",
        f"  chat page  {url.removesuffix('/v1')}/ (in a browser)",
        "Try it:",
        _curl_snippet(url, runtime.model_name, settings.api_key is not None),
        _python_snippet(url, runtime.model_name, settings.api_key is not None),
    ]
    return "\n".join(lines)


def _curl_snippet(url: str, model: str, with_key: bool) -> str:
    auth = ' -H "Authorization: Bearer $GPT_OSS_API_KEY"' if with_key else ""
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Say hello"}}]}}'
    return f"curl -s {url}/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


def _python_snippet(url: str, model: str, with_key: bool) -> str:
    key = 'os.environ["GPT_OSS_API_KEY"]' if with_key else '"unused"'
    return (
        "python -c 'import os; from openai import OpenAI; "
        f'client = OpenAI(base_url="{url}", api_key={key}); '
        f'reply = client.chat.completions.create(model="{model}", '
        'messages=[{"role": "user", "content": "Say hello"}]); '
        "print(reply.choices[0].message.content)'"
    )

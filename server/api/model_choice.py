"""Which served model a request's `model` picks, and the notice a stream gives while it loads.

Each served model (server.ops.runtime.ServedModels) has its generator; `ModelChoice` (on
app.state.choice) finds a request's by any of the model's names. With one model served any name
is accepted, as a single-model server always did (the response echoes the name asked for); with
several, a name none answers to is a 404 in the API's own shape (OpenAI's `model_not_found`;
Anthropic's `not_found_error` on /v1/messages, by server.api.error_handlers) naming what is
served. A request that names no model gets the first.

A streamed request for a model that is not loaded waits while it loads (and, under the memory
budget, while another model is unloaded or finishes its requests): `loading_notice` opens its
stream at once with an SSE comment saying so, and repeats it while the wait lasts, so the
client sees the server working instead of a silent connection. Comments are part of SSE;
every client's event parser skips them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from server.api.stream_run import with_keepalive
from server.contracts.errors import NotFound
from server.core.generation import Generator
from server.ops.runtime import Runtime, ServedModels

LOADING_NOTICE_S = 2.0  # how often a stream waiting for its model's load says so


class ModelNotFound(NotFound):
    """A `model` no served model answers to (404), worded as OpenAI words it."""

    error_type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, asked: str, served: tuple[str, ...]) -> None:
        super().__init__(
            f"The model `{asked}` does not exist on this server; it serves: {', '.join(served)}",
            param="model",
        )


@dataclass(frozen=True, slots=True)
class Served:
    """One served model: its runtime and its generator."""

    runtime: Runtime
    generator: Generator

    @property
    def name(self) -> str:
        return self.runtime.model_name

    def echo(self, asked: str | None) -> str:
        """The model a response names: the name asked for (an alias stays an alias), else
        the model's id."""
        return asked or self.name

    @property
    def loaded(self) -> bool:
        return self.runtime.residency_report.state.value == "loaded"


class ModelChoice:
    """Every served model's generator, found by any of the model's names."""

    def __init__(self, models: ServedModels, generators: Mapping[str, Generator]) -> None:
        self.models = models
        self.served = tuple(Served(r, generators[r.model_name]) for r in models.runtimes)

    @property
    def default(self) -> Served:
        return self.served[0]

    def pick(self, asked: str | None) -> Served:
        runtime = self.models.find(asked)
        if runtime is None:
            raise ModelNotFound(str(asked), self.models.names)
        return next(s for s in self.served if s.runtime is runtime)


def chosen(request: Request, asked: str | None) -> Served:
    """The served model a request's `model` picks (ModelNotFound: none)."""
    choice: ModelChoice = request.app.state.choice
    return choice.pick(asked)


def loading_notice(response: Response, served: Served) -> Response:
    """A streamed response for a model not loaded yet, opening with a comment that it loads
    and repeating it while nothing else comes and the model is still not loaded."""
    if served.loaded or not isinstance(response, StreamingResponse):
        return response
    body = response.body_iterator
    notice = f": loading model {served.name}; this request waits for it\n\n".encode()

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in body:
                yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)
        finally:  # the client left: the stream behind it closes (its generation stops)
            close = getattr(body, "aclose", None)
            if close is not None:
                await close()

    async def noticed() -> AsyncIterator[bytes]:
        yield notice
        async for chunk in with_keepalive(chunks(), LOADING_NOTICE_S):
            if chunk is None:
                if not served.loaded:
                    yield notice
                continue
            yield chunk

    response.body_iterator = noticed()
    return response

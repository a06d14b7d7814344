"""create_app(): the FastAPI application. Wiring only: state, routers, error handlers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import anyio
from fastapi import Depends, FastAPI

from server import __version__
from server.api.auth import require_api_key
from server.api.chat.router import router as chat_router
from server.api.completions.router import router as completions_router
from server.api.error_handlers import install_error_handlers
from server.api.host_check import HostCheckMiddleware
from server.api.limits import BodyLimitMiddleware
from server.api.messages.router import MessagesState
from server.api.messages.router import router as messages_router
from server.api.messages.signature import KEY_FILE, ThinkingSigner, load_key
from server.api.metrics import Metrics, RequestMetricsMiddleware
from server.api.metrics import router as metrics_router
from server.api.model_choice import ModelChoice
from server.api.models import health_router
from server.api.models import router as models_router
from server.api.ollama import router as ollama_router
from server.api.responses.router import ResponsesState
from server.api.responses.router import router as responses_router
from server.api.responses.socket import router as responses_socket_router
from server.api.web import router as web_router
from server.contracts.errors import StartupError
from server.core.generation import Generator, SamplingDefaults
from server.core.history import History
from server.core.summaries import SummaryConfig
from server.harmony.render import assistant_start_tokens
from server.ops.runtime import Runtime, ServedModels
from server.ops.settings import Settings
from server.ops.startup import load_models
from server.ops.tools import start_server_tools
from server.private_files import PrivatePathError, private_dir
from server.tools.mcp import McpConfigError, McpServers, load_config


def create_app(settings: Settings, runtime: Runtime | ServedModels | None = None) -> FastAPI:
    """The app; loads the models at startup unless ready ones are given (then not owned).

    StartupError at once if the state directory (settings.state_dir) or the signing key in it
    is not private (server.private_files).
    """
    key = _state_key(settings)
    signer = ThinkingSigner(key)
    mcp = _mcp_servers(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if isinstance(runtime, Runtime):
            models = ServedModels((runtime,))
        elif runtime is not None:
            models = runtime
        else:
            models = await asyncio.to_thread(load_models, settings)
        loaded = models.default
        app.state.settings = settings
        app.state.models = models
        app.state.runtime = loaded  # the first (default) model's
        app.state.model_name = loaded.model_name
        app.state.started_at = int(time.time())
        metrics = Metrics({r.model_name: r.engine for r in models.runtimes})
        generators = _generators(settings, models, metrics)
        app.state.metrics = metrics
        app.state.choice = ModelChoice(models, generators)
        app.state.generator = generators[loaded.model_name]  # the first model's
        app.state.responses = ResponsesState.from_settings(settings, key)
        app.state.messages = MessagesState.from_settings(settings, signer)
        app.state.server_tools = await start_server_tools(settings)
        app.state.mcp = mcp
        await anyio.sleep(0)  # loads anyio's asyncio backend, which a streamed response needs
        try:
            yield
        finally:
            await app.state.server_tools.close()
            app.state.responses.store.close()
            await mcp.close()
            if runtime is None:
                models.close()

    app = FastAPI(title="gpt-oss-server", version=__version__, lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequestMetricsMiddleware)
    app.add_middleware(  # outermost: a request from a foreign name or origin reaches nothing
        HostCheckMiddleware, bound_host=settings.host, allowed_hosts=settings.allowed_hosts
    )
    app.include_router(health_router)
    app.include_router(metrics_router)
    app.include_router(web_router)  # the chat page at `/`: static files, no key
    app.include_router(responses_socket_router)  # checks the key itself, before its handshake
    for router in (
        models_router,
        ollama_router,
        chat_router,
        completions_router,
        responses_router,
        messages_router,
    ):
        app.include_router(router, dependencies=[Depends(require_api_key)])
    return app


def _generators(settings: Settings, models: ServedModels, metrics: Metrics) -> dict[str, Generator]:
    """Each served model's generator (its own history and admission), by the model's id, and
    its metrics (labelled by model when there are several)."""
    defaults = SamplingDefaults(settings.temperature, settings.top_p, seed=settings.seed)
    generators = {}
    for served in models.runtimes:
        name = served.model_name
        start = assistant_start_tokens(served.encoding)
        generator = Generator(
            served.engine,
            served.encoding,
            defaults,
            History(start, settings.history_max_entries),
            partial(metrics.observe, model=name) if metrics.labelled else metrics.observe,
            summaries=SummaryConfig(max_tokens=settings.summary_max_tokens),
            strict_tools=settings.strict_tools,
            stream_interval_s=settings.stream_interval_ms / 1000,
        )
        metrics.watch(generator.admission, name)
        generators[name] = generator
    if metrics.labelled:
        metrics.watch_models(list(models.runtimes))
    else:
        metrics.watch_model(models.default)
    return generators


def _state_key(settings: Settings) -> bytes:
    """The server's signing key, kept in the private state directory: thinking blocks' and
    (a key derived from it) MCP approval requests' signatures."""
    try:
        return load_key(private_dir(settings.state_dir) / KEY_FILE)
    except PrivatePathError as exc:
        raise StartupError(f"the state directory cannot be used: {exc}") from exc


def _mcp_servers(settings: Settings) -> McpServers:
    """The operator's MCP servers (none without --mcp-config); StartupError for a bad file."""
    try:
        servers = load_config(settings.mcp_config) if settings.mcp_config is not None else {}
    except McpConfigError as exc:
        raise StartupError(str(exc)) from exc
    return McpServers(servers, settings.mcp_allowed_urls)

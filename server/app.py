"""create_app(): the FastAPI application. Wiring only: state, routers, error handlers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from server.ops.startup import load_runtime
from server.ops.tools import start_server_tools
from server.private_files import PrivatePathError, private_dir
from server.tools.mcp import McpConfigError, McpServers, load_config


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    """The app; loads the model at startup unless a ready runtime is given (then not owned).

    StartupError at once if the state directory (settings.state_dir) or the signing key in it
    is not private (server.private_files).
    """
    key = _state_key(settings)
    signer = ThinkingSigner(key)
    mcp = _mcp_servers(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded = runtime if runtime is not None else await asyncio.to_thread(load_runtime, settings)
        app.state.settings = settings
        app.state.runtime = loaded
        app.state.model_name = loaded.model_name
        app.state.started_at = int(time.time())
        defaults = SamplingDefaults(settings.temperature, settings.top_p, seed=settings.seed)
        history = History(assistant_start_tokens(loaded.encoding), settings.history_max_entries)
        app.state.metrics = Metrics(loaded.engine)
        app.state.generator = Generator(
            loaded.engine,
            loaded.encoding,
            defaults,
            history,
            app.state.metrics.observe,
            summaries=SummaryConfig(max_tokens=settings.summary_max_tokens),
            strict_tools=settings.strict_tools,
            stream_interval_s=settings.stream_interval_ms / 1000,
        )
        app.state.metrics.watch(app.state.generator.admission)
        app.state.metrics.watch_model(loaded)
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
                loaded.close()

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

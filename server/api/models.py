"""/health, /api/hello, /v1/models and /v1/server (the facts the chat page shows about this server).

/v1/server also names the server-run tools the operator turned on (`tools`: the python tool, the
browser, the MCP servers by label only; never their commands, URLs or headers), so the chat page
offers a switch for each.

Each says whether the model is in memory (`model_state`: loaded, unloading, unloaded, loading;
see server.ops.residency); /v1/models lists the model under its name and its aliases (the names
Codex's --oss asks LM Studio for).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from server import __version__
from server.api.auth import carries_api_key
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from server.tools.mcp import McpServers

UNHEALTHY = "the model cannot generate; the reason is in the server log and in /v1/server"

router = APIRouter()
health_router = APIRouter()


@health_router.get("/health", response_model=None)
async def health(request: Request) -> dict[str, Any] | JSONResponse:
    """200 while the engine can generate (also while the model is unloaded: the next request loads
    it); 503 once it cannot (an RPC host left) or when loading it again failed (until a load
    succeeds). No key is needed, so the reason (which may name the model's path or an RPC host)
    goes only to a request the /v1 routes would accept; any other gets `UNHEALTHY`."""
    runtime: Runtime = request.app.state.runtime
    residency = runtime.residency_report
    state = residency.state.value
    failure = runtime.engine.failure or residency.load_error
    if failure is not None:
        body = {"status": "error", "model": runtime.model_name, "model_state": state}
        error = failure if carries_api_key(request) else UNHEALTHY
        return JSONResponse({**body, "error": error}, status_code=503)
    return {"status": "ok", "model": runtime.model_name, "model_state": state}


@health_router.get("/api/hello")
@health_router.head("/api/hello", include_in_schema=False)  # one operation in the schema
async def hello() -> dict[str, str]:
    """Anthropic's reachability probe: Claude Code sends HEAD at start (a preconnect) and `claude
    doctor` a GET, and takes 200 for "connected". No key, nothing about the server."""
    return {"message": "hello"}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    runtime: Runtime = request.app.state.runtime
    info = runtime.engine.info
    meta = {
        "description": info.description,
        "n_ctx_train": info.n_ctx_train,
        "n_params": info.n_params,
        "size": info.size_bytes,
        "n_vocab": info.n_vocab,
    }
    models = [
        {
            "id": name,
            "object": "model",
            "created": request.app.state.started_at,
            "owned_by": "openai",
            "context_length": info.n_ctx,
            "meta": meta
            if name == runtime.model_name
            else {**meta, "alias_of": runtime.model_name},
        }
        for name in runtime.names
    ]
    return {"object": "list", "data": models}


@router.get("/v1/server")
async def server_facts(request: Request) -> dict[str, Any]:
    """What the chat page's server view shows: model, context, placement, slots, policy."""
    runtime: Runtime = request.app.state.runtime
    settings: Settings = request.app.state.settings
    info, load = runtime.engine.info, runtime.engine.load
    residency = runtime.residency_report
    return {
        "object": "server",
        "version": __version__,
        "model": runtime.model_name,
        "aliases": list(runtime.aliases),
        "model_state": residency.state.value,
        "idle_unload_s": residency.idle_unload_s,
        "reloads": residency.loads,
        "last_reload_s": residency.last_load_s,
        "last_unload_s": residency.last_unload_s,
        "reload_error": residency.load_error,
        "reload_failures": residency.load_failures,
        "reload_retry_in_s": residency.retry_in_s,
        "description": info.description,
        "size": info.size_bytes,
        "n_ctx": info.n_ctx,
        "n_ctx_train": info.n_ctx_train,
        "placement": runtime.placement.summary if runtime.placement else None,
        "slots": load.slots,
        "max_waiting": load.max_waiting,
        "reasoning_visibility": settings.reasoning_visibility,
        "reasoning_effort": settings.reasoning_effort,
        "temperature": settings.temperature,
        "tools": _server_tools(request),
    }


def _server_tools(request: Request) -> dict[str, Any]:
    """The server-run tools a /v1/responses request may name: `code_interpreter` (the python
    tool), `web_search` (the browser) and the operator's MCP servers by label."""
    state = request.app.state
    enabled = state.server_tools.tools
    servers: McpServers = state.mcp
    return {
        "code_interpreter": "python" in enabled,
        "web_search": "browser" in enabled,
        "mcp": sorted(servers.servers),
    }

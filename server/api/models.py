"""/health, /api/hello, /v1/models and /v1/server (the facts the chat page shows about this server).

/v1/server also names the server-run tools the operator turned on (`tools`: the python tool, the
browser, the MCP servers by label only; never their commands, URLs or headers), so the chat page
offers a switch for each.

Each says whether the model is in memory (`model_state`: loaded, unloading, unloaded, loading;
see server.ops.residency); /v1/models lists every served model under its name and its aliases
(the names Codex's --oss asks LM Studio for), in OpenAI's shape, or in Anthropic's when the
request carries `anthropic-version` (Anthropic's SDKs and Claude Code send it), and
/v1/models/{id} answers one of them (404 in the API's shape for a name none answers to). With
several models, /health and /v1/server speak of the first (the default) and list each model's
state (`models`) and the memory budget they share (`budget`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from server import __version__
from server.api.auth import carries_api_key
from server.api.model_choice import ModelNotFound
from server.ops.runtime import Runtime, ServedModels
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
    return {"status": "ok", "model": runtime.model_name, "model_state": state, **_states(request)}


def _states(request: Request) -> dict[str, Any]:
    """With several models: each one's state, by id."""
    models: ServedModels = request.app.state.models
    if not models.several:
        return {}
    return {"models": {r.model_name: r.residency_report.state.value for r in models.runtimes}}


@health_router.get("/api/hello")
@health_router.head("/api/hello", include_in_schema=False)  # one operation in the schema
async def hello() -> dict[str, str]:
    """Anthropic's reachability probe: Claude Code sends HEAD at start (a preconnect) and `claude
    doctor` a GET, and takes 200 for "connected". No key, nothing about the server."""
    return {"message": "hello"}


ANTHROPIC_VERSION = "anthropic-version"  # the header Anthropic's clients send on every request


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """Every served model under each of its names (OpenAI's list, or Anthropic's)."""
    models: ServedModels = request.app.state.models
    named = [(name, r) for r in models.runtimes for name in r.names]
    if ANTHROPIC_VERSION in request.headers:
        data = [_anthropic_model(request, name, r) for name, r in named]
        return {
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    return {"object": "list", "data": [_openai_model(request, name, r) for name, r in named]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    """One model by any of its names; 404 (`model_not_found`) for a name none answers to."""
    models: ServedModels = request.app.state.models
    runtime = next((r for r in models.runtimes if model_id in r.names), None)
    if runtime is None:
        raise ModelNotFound(model_id, models.names)
    if ANTHROPIC_VERSION in request.headers:
        return _anthropic_model(request, model_id, runtime)
    return _openai_model(request, model_id, runtime)


def _openai_model(request: Request, name: str, runtime: Runtime) -> dict[str, Any]:
    info = runtime.engine.info
    meta = {
        "description": info.description,
        "n_ctx_train": info.n_ctx_train,
        "n_params": info.n_params,
        "size": info.size_bytes,
        "n_vocab": info.n_vocab,
    }
    return {
        "id": name,
        "object": "model",
        "created": request.app.state.started_at,
        "owned_by": "openai",
        "context_length": info.n_ctx,
        "meta": meta if name == runtime.model_name else {**meta, "alias_of": runtime.model_name},
    }


def _anthropic_model(request: Request, name: str, runtime: Runtime) -> dict[str, Any]:
    started = datetime.fromtimestamp(request.app.state.started_at, tz=UTC)
    return {
        "type": "model",
        "id": name,
        "display_name": name if name == runtime.model_name else f"{name} ({runtime.model_name})",
        "created_at": started.isoformat().replace("+00:00", "Z"),
    }


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
        **_several(request),
    }


def _several(request: Request) -> dict[str, Any]:
    """With several models: each one (id, aliases, state, context, file) and the budget."""
    models: ServedModels = request.app.state.models
    report = models.fleet_report
    if not models.several or report is None:
        return {}
    return {
        "models": [
            {
                "id": r.model_name,
                "aliases": list(r.aliases),
                "model_state": r.residency_report.state.value,
                "reload_error": r.residency_report.load_error,
                "n_ctx": r.engine.info.n_ctx,
                "description": r.engine.info.description,
            }
            for r in models.runtimes
        ],
        "budget": {
            "bytes": report.budget_bytes,
            "used_bytes": report.used_bytes,
            "peak_bytes": report.peak_bytes,
            "max_loaded": report.max_loaded,
            "loaded": list(report.loaded),
        },
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

"""Ollama's model-management probes, answered for the models served, so that
`codex --oss --local-provider ollama` works against this server.

Codex 0.169 checks GET /v1/models (the server is up), GET /api/version (at least 0.13.4; a 404
would do), GET /api/tags (is the model there?) and, when its model is not listed, POST /api/pull;
then it talks Responses on /v1. Answered honestly: the served models are listed under their names
and aliases (/api/ps: those in memory); pulling one of those names succeeds at once (nothing to
download); pulling
anything else is an error in Ollama's shape ({"error": ...}, a line of the stream when streamed),
which Codex shows the user. Generation goes through the OpenAI routes; Ollama's own /api/chat and
/api/generate are not served.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server import __version__
from server.ops.runtime import Runtime, ServedModels

router = APIRouter(include_in_schema=False)  # Ollama's shape, not part of the OpenAPI schema

OLLAMA_API_VERSION = "0.13.4"  # the Ollama API level these probes answer as (Codex's minimum)
NDJSON = "application/x-ndjson"


@router.get("/api/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION, "gpt_oss_server": __version__}


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    """Each served model under each of its names."""
    models: ServedModels = request.app.state.models
    return {"models": [_model(request, r, name) for r in models.runtimes for name in r.names]}


@router.get("/api/ps")
async def running(request: Request) -> dict[str, Any]:
    """The models in memory (not one that --idle-unload or the memory budget unloaded)."""
    models: ServedModels = request.app.state.models
    loaded = [r for r in models.runtimes if r.residency_report.state.value == "loaded"]
    return {"models": [_model(request, r, r.model_name) for r in loaded]}


@router.post("/api/pull", response_model=None)
async def pull(request: Request) -> Response:
    """Success at once for a name of the served model; Ollama's error for any other."""
    models: ServedModels = request.app.state.models
    body = await _json_object(request)
    if isinstance(body, Response):
        return body
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        return JSONResponse({"error": "model is required"}, status_code=400)
    stream = body.get("stream", True) is not False
    served = _served(models, name)
    if not stream:
        if served:
            return JSONResponse({"status": "success"})
        return JSONResponse({"error": _not_served(models, name)}, status_code=404)
    last = {"status": "success"} if served else {"error": _not_served(models, name)}
    return _ndjson({"status": "pulling manifest"}, last)


async def _json_object(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object, or Ollama's 400."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        return JSONResponse({"error": "invalid JSON in the request body"}, status_code=400)
    if not isinstance(body, dict):
        return JSONResponse({"error": "the request body must be a JSON object"}, status_code=400)
    return body


def _not_served(models: ServedModels, name: str) -> str:
    if not models.several:
        runtime = models.default
        return (
            f"gpt-oss-server serves one model and downloads nothing: {name!r} is not it. Ask "
            f"for {' or '.join(runtime.names)} (codex: -m {runtime.model_name}), or restart the "
            "server with --model or --model-aliases"
        )
    return (
        f"gpt-oss-server downloads nothing, and serves no model named {name!r}. Ask for one of "
        f"{', '.join(models.names)}, or restart the server with another --model"
    )


def _served(models: ServedModels, name: str) -> bool:
    names = set(models.names)
    return name in names or name.removesuffix(":latest") in names


def _ndjson(*lines: dict[str, Any]) -> Response:
    return Response("".join(json.dumps(line) + "\n" for line in lines), media_type=NDJSON)


def _model(request: Request, runtime: Runtime, name: str) -> dict[str, Any]:
    info = runtime.engine.info
    started = datetime.fromtimestamp(request.app.state.started_at, tz=UTC)
    return {
        "name": name,
        "model": name,
        "modified_at": started.isoformat(),
        "size": info.size_bytes,
        "digest": "",
        "details": {
            "format": "gguf",
            "family": "gpt-oss",
            "families": ["gpt-oss"],
            "parameter_size": f"{info.n_params / 1e9:.1f}B",
            "quantization_level": "",
        },
    }

"""/health and /v1/models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.ops.runtime import Runtime

router = APIRouter()
health_router = APIRouter()


@health_router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    runtime: Runtime = request.app.state.runtime
    return {"status": "ok", "model": runtime.model_name}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    runtime: Runtime = request.app.state.runtime
    info = runtime.engine.info
    return {
        "object": "list",
        "data": [
            {
                "id": runtime.model_name,
                "object": "model",
                "created": request.app.state.started_at,
                "owned_by": "openai",
                "context_length": info.n_ctx,
                "meta": {
                    "description": info.description,
                    "n_ctx_train": info.n_ctx_train,
                    "n_params": info.n_params,
                    "size": info.size_bytes,
                    "n_vocab": info.n_vocab,
                },
            }
        ],
    }

"""A Codex-shaped first request (the developer prompt, tools and environment of a real Codex
request, ≈7k tokens) sent to a `serve` process, its usage, and the prompt cache's disk counters
in /metrics: what the prompt-cache restart tests read."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server.bench.procs import ServerProcess

CAPTURE = Path(__file__).resolve().parents[1] / "data" / "codex" / "exec_round2.json"


def first_request(conversation: str) -> dict[str, Any]:
    """Codex's first request of a thread, with this conversation's own user message."""
    body = json.loads(CAPTURE.read_text())
    request: dict[str, Any] = copy.deepcopy(body)
    request["input"] = [item for item in body["input"] if item.get("type") == "message"]
    request["input"][-1]["content"] = [
        {"type": "input_text", "text": f"{conversation}: read the ten log files and report."}
    ]
    request["reasoning"].pop("summary", None)
    request.update(stream=False, store=False, max_output_tokens=4, prompt_cache_key="restart")
    return request


def usage(proc: ServerProcess, conversation: str) -> dict[str, Any]:
    base = proc.health_url.removesuffix("/health")
    response = httpx.post(f"{base}/v1/responses", json=first_request(conversation), timeout=600)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["usage"]
    return result


def disk_metrics(proc: ServerProcess) -> dict[str, float]:
    text = httpx.get(proc.health_url.replace("/health", "/metrics"), timeout=10).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("gpt_oss_prompt_cache_disk_")
    }

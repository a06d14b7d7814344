"""`kill -9` during a burst of stored responses loses none that the clients were told about.

A real `gpt-oss-server serve` process on the tiny GGUF gets a burst of concurrent store=true
requests, streaming and not: short ones that finish, long ones still generating. Once every
short one has been reported (terminal event, or the 200 body), the process is SIGKILLed. The
server restarted on the same SQLite file must return each reported response, with the same
output, from GET /v1/responses/{id}. (Responses store before their terminal event leaves.)
"""

from __future__ import annotations

import asyncio
import json
import signal
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.serve_process import ServerProcess

pytestmark = pytest.mark.slow  # kills and restarts a server process


N_SHORT, N_LONG = 24, 4
KILL_AFTER = 12  # reported responses; the other short ones are finishing, or storing
TERMINALS = ("response.completed", "response.incomplete", "response.failed")


@dataclass
class Burst:
    """What the clients were told: reported responses (id -> output) and ids seen in flight."""

    reported: dict[str, list[Any]] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    requests: int = 0


async def _stream(client: httpx.AsyncClient, body: dict[str, Any], burst: Burst) -> None:
    async with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event["type"] == "response.created":
                burst.in_flight.add(event["response"]["id"])
            elif event["type"] in TERMINALS:
                response_id: str = event["response"]["id"]
                burst.reported[response_id] = event["response"]["output"]
                burst.in_flight.discard(response_id)


async def _create(client: httpx.AsyncClient, body: dict[str, Any], burst: Burst) -> None:
    response = await client.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    burst.reported[data["id"]] = data["output"]


def _body(index: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "gpt-oss-tiny",
        "input": f"Request {index}: tell me something.",
        "store": True,
        "max_output_tokens": max_tokens,
        "temperature": 0.7,
        "seed": index,
    }


async def _burst_then_kill(url: str, server: ServerProcess) -> Burst:
    burst = Burst()
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        tasks = [
            asyncio.ensure_future((_stream if i % 2 else _create)(client, _body(i, 4 + i), burst))
            for i in range(N_SHORT)
        ]
        tasks += [
            asyncio.ensure_future(_stream(client, _body(100 + i, 3500), burst))
            for i in range(N_LONG)
        ]
        burst.requests = len(tasks)
        while len(burst.reported) < KILL_AFTER:
            assert not all(task.done() for task in tasks), "the burst ended before the kill"
            await asyncio.sleep(0.002)
        server.process.send_signal(signal.SIGKILL)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, AssertionError)]
    assert not errors, errors
    return burst


def test_kill_9_loses_no_reported_response(start_server: Any) -> None:
    first = start_server()
    burst = asyncio.run(_burst_then_kill(first.url, first))
    assert first.process.wait(timeout=30) == -signal.SIGKILL
    assert KILL_AFTER <= len(burst.reported) < N_SHORT + N_LONG
    assert burst.in_flight, "no stream was in flight at the kill"
    second = start_server()  # the same --responses-store-path
    with httpx.Client(base_url=second.url, timeout=30) as client:
        for response_id, output in burst.reported.items():
            got = client.get(f"/v1/responses/{response_id}")
            assert got.status_code == 200, (response_id, got.text)
            assert got.json()["output"] == output
    print(  # the closing note's numbers: `pytest -s` shows them
        f"kill -9: {burst.requests} requests, {len(burst.reported)} reported and all found "
        f"after the restart, {len(burst.in_flight)} streams in flight at the kill"
    )

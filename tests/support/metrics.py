"""Reading one value of the server's Prometheus /metrics in a test."""

from __future__ import annotations

from fastapi.testclient import TestClient


def metric(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is not in /metrics")

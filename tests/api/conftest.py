"""In-process HTTP on the real tiny engine (starlette's TestClient runs the app's lifespan)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from server.ops.runtime import Runtime
from tests.support.tiny_engine import tiny_app


@pytest.fixture(scope="session")
def client(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(tiny_app(runtime)) as test_client:
        yield test_client

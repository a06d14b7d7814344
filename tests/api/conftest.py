"""In-process HTTP on the real tiny engine (starlette's TestClient runs the app's lifespan)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings


@pytest.fixture(scope="session")
def client(runtime: Runtime) -> Iterator[TestClient]:
    app = create_app(Settings(reasoning_effort="medium"), runtime)
    with TestClient(app) as test_client:
        yield test_client

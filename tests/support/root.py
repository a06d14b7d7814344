"""Tests that need root (giving a file or a directory to another user): skipped with the reason
on a run as an ordinary user, except under GPT_OSS_REQUIRE_ROOT=1 (CI runs as root), where such
a run is a failure: a CI that lost root would otherwise pass without them."""

from __future__ import annotations

import os

import pytest

REQUIRE_ENV = "GPT_OSS_REQUIRE_ROOT"


def require_root(reason: str) -> None:
    """Return as root; else skip with `reason`, or fail under GPT_OSS_REQUIRE_ROOT=1."""
    if os.geteuid() == 0:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1)")
    pytest.skip(reason)

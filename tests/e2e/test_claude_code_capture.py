"""The trained model's corpus captures Claude Code's first request from the real CLI."""

from __future__ import annotations

import datetime
import json
import tempfile
from pathlib import Path

import pytest

from devkit.claude_capture import DATE, PLACEHOLDER, capture_request, with_ask
from server.api.messages.schemas import MessagesRequest
from tests.support.claude_code import claude_binary

pytestmark = pytest.mark.slow  # the real Claude Code CLI

__all__ = ["claude_binary"]  # the fixture, shared with test_claude_code.py


def test_the_capture_is_the_same_on_every_run_and_takes_an_ask(claude_binary: Path) -> None:
    first = capture_request(claude_binary)
    again = capture_request(claude_binary)
    assert first == again  # temporary directories and the day normalised away
    text = json.dumps(first)
    assert PLACEHOLDER in text
    assert DATE in text
    assert datetime.date.today().isoformat() not in text
    assert tempfile.gettempdir() + "/" not in text
    assert "/home/user/project" in text
    assert {t["name"] for t in first["tools"]} >= {"Bash", "Edit", "Read", "Write"}
    asked = with_ask(first, 'Run `echo "a b"`.', "2025-02-03")
    request = MessagesRequest.model_validate(asked)
    asked_text = json.dumps(asked)
    assert PLACEHOLDER not in asked_text
    assert DATE not in asked_text
    assert "2025-02-03" in asked_text
    assert 'Run `echo \\"a b\\"`.' in asked_text
    assert request.tools

"""The tools the operator turned on, built at start-up: each says what it reaches or why it is
off, and an unusable sandbox leaves the python tool off instead of failing the start."""

from __future__ import annotations

import asyncio
import logging

import pytest

from server.ops.settings import Settings
from server.ops.tools import build_server_tools, start_server_tools
from server.tools.browser.tool import BrowserTool
from server.tools.python.tool import PythonTool


def test_nothing_is_on_by_default() -> None:
    built = build_server_tools(Settings())
    assert built.tools == {}
    assert built.report == []


def test_a_sandbox_that_cannot_run_turns_the_python_tool_off_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(python_tool=True, python_tool_interpreter="/nonexistent/python3")
    with caplog.at_level(logging.INFO, logger="server.ops.tools"):
        built = asyncio.run(start_server_tools(settings))
    assert "python" not in built.tools
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "python tool OFF: the sandbox's interpreter /nonexistent/python3 was not found"
    )


def test_the_browser_says_what_it_reaches() -> None:
    built = build_server_tools(
        Settings(browser_tool=True, browser_search_url="http://127.0.0.1:8888/search")
    )
    assert isinstance(built.tools["browser"], BrowserTool)
    assert built.report == [
        "browser tool on: search via http://127.0.0.1:8888/search; pages on public addresses only"
    ]
    asyncio.run(built.close())


def test_the_python_tool_is_on_where_its_sandbox_runs() -> None:
    built = build_server_tools(Settings(python_tool=True, python_tool_timeout_s=5))
    if "python" not in built.tools:
        pytest.skip(built.report[0])  # test_python_tool.py fails on this where it must run
    assert isinstance(built.tools["python"], PythonTool)
    assert built.report[0].startswith("python tool on: ")
    assert "in a bubblewrap sandbox, no network, 5 s a call, 1024 MiB" in built.report[0]

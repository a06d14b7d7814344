"""Forced-token scripts the tests share: harmony text for what the model "says".

A script is the assistant's output after `<|start|>assistant`, as harmony text with its special
tokens; `devkit.forced.ForcedScript` turns it into the token ids the engine emits. The
builders keep the header forms in one place; the constants are the conversations several test
modules script alike.
"""

from __future__ import annotations

import json
from typing import Any


def reasoning(text: str) -> str:
    """An analysis message and the start of the next message's header."""
    return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"


def answer(text: str) -> str:
    """A final answer that ends the turn."""
    return f"<|channel|>final<|message|>{text}<|return|>"


def reason_then_answer(thought: str, text: str) -> str:
    """Reasoning, then the final answer."""
    return reasoning(thought) + answer(text)


def call(tool: str, arguments: str) -> str:
    """A function call on the commentary channel (harmony's own form), ending the turn."""
    return (
        f"<|channel|>commentary to=functions.{tool} <|constrain|>json<|message|>{arguments}<|call|>"
    )


def reason_then_call(thought: str, tool: str, arguments: str) -> str:
    """Reasoning, then a function call."""
    return reasoning(thought) + call(tool, arguments)


def mcp_call(label: str, tool: str, arguments: str) -> str:
    """A call of an MCP server's tool: the namespace is the server's label."""
    header = f"<|channel|>commentary to={label}.{tool} <|constrain|>json"
    return f"{header}<|message|>{arguments}<|call|>"


def python_call(code: str) -> str:
    """A python call as gpt-oss writes it: from the analysis channel, content type `code`."""
    return f"<|channel|>analysis to=python code<|message|>{code}<|call|>"


def browser_call(function: str, arguments: dict[str, Any]) -> str:
    """A browser call as gpt-oss writes it: from the analysis channel."""
    header = f"<|channel|>analysis to=browser.{function} code"
    return f"{header}<|message|>{json.dumps(arguments)}<|call|>"


GREETING = reason_then_answer("User greets. Reply briefly.", "Hello! 👋 How can I help?")
ARITHMETIC = reason_then_answer("Math.", "2 + 2 = 4.")
WEATHER_CALL = reason_then_call("Need weather.", "get_weather", '{"city":"Paris"}')
LIST_FILES_CALL = reason_then_call("Need to list files.", "exec_command", '{"cmd":"ls"}')

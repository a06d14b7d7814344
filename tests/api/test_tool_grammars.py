"""Tool calls sampled under their grammars on the real tiny engine: every call must parse.

Random weights are the adversary: only the call header is forced (so the model calls the tool
at once instead of reasoning at length); the arguments are sampled for real at temperature 1
with a different seed per call, split across both APIs, streamed and not, several at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jsonschema
import lark
import pytest
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from tests.support.chat import post
from tests.support.chat import stream as chat_stream
from tests.support.responses import create
from tests.support.responses import stream as responses_stream
from tests.support.tool_schemas import REGEX, STRICT_SCHEMA, codex_apply_patch

CALLS = 100
PARALLEL = 4
LOOSE_SCHEMA: dict[str, Any] = {  # minProperties is not enforced: any JSON object is sampled
    "type": "object",
    "properties": {"q": {"type": "string"}},
    "minProperties": 1,
}


@dataclass(frozen=True)
class Call:
    api: str
    streamed: bool
    text: str  # the arguments, or a custom tool's input
    complete: bool  # ended by <|call|> (finish_reason tool_calls, status completed)


def _header(name: str) -> str:
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"


def _chat(client: TestClient, body: dict[str, Any], streamed: bool) -> Call:
    if streamed:
        chunks = [json.loads(d) for d in chat_stream(client, **body)[:-1]]
        choices = [c for chunk in chunks for c in chunk["choices"]]
        fragments = [t for c in choices for t in c["delta"].get("tool_calls") or []]
        text = "".join(t["function"].get("arguments", "") for t in fragments)
        finish = next(c["finish_reason"] for c in reversed(choices) if c.get("finish_reason"))
    else:
        response = post(client, **body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        text = choice["message"]["tool_calls"][0]["function"]["arguments"]
        finish = choice["finish_reason"]
    assert finish in ("tool_calls", "length")
    return Call("chat", streamed, text, finish == "tool_calls")


def _responses(client: TestClient, body: dict[str, Any], streamed: bool) -> Call:
    response = responses_stream(client, **body).terminal["response"] if streamed else None
    response = response or create(client, **body)
    calls = [i for i in response["output"] if i["type"] in ("function_call", "custom_tool_call")]
    assert len(calls) == 1
    item = calls[0]
    text = item["arguments"] if item["type"] == "function_call" else item["input"]
    complete = response["status"] == "completed"
    assert complete == (item["status"] == "completed"), response
    assert complete or response["status"] == "incomplete"
    return Call("responses", streamed, text, complete)


def sample_calls(
    client: TestClient,
    forced: ForcedScript,
    tool: dict[str, Any],
    *,
    apis: tuple[str, ...],
    max_tokens: int,
    n: int = CALLS,
) -> list[Call]:
    """`n` calls of `tool` (named by tool_choice), round-robin over APIs and streaming."""
    name = tool.get("name") or tool["function"]["name"]
    for _ in range(n):
        forced.push(_header(name))

    def one(i: int) -> Call:
        api, streamed = apis[i % len(apis)], (i // len(apis)) % 2 == 0
        common = {"temperature": 1.0, "seed": 1000 + i}
        if api == "chat":
            body = {
                **common,
                "messages": [{"role": "user", "content": "Use the tool."}],
                "tools": [tool],
                "tool_choice": {"type": "function", "function": {"name": name}},
                "max_tokens": max_tokens,
            }
            return _chat(client, body, streamed)
        flat = {k: v for k, v in {**tool, **tool.get("function", {})}.items() if k != "function"}
        body = {
            **common,
            "input": "Use the tool.",
            "tools": [flat],
            "tool_choice": {"type": flat["type"], "name": name},
            "max_output_tokens": max_tokens,
            "store": False,
        }
        return _responses(client, body, streamed)

    with ThreadPoolExecutor(PARALLEL) as pool:
        calls = list(pool.map(one, range(n)))
    assert forced.pending == 0
    return calls


def _function(name: str, schema: dict[str, Any], strict: bool | None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": "A tool.", "parameters": schema}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def _report(calls: list[Call], check: Callable[[Call], None]) -> tuple[int, int]:
    for call in calls:
        check(call)
    return sum(c.complete for c in calls), len(calls)


@pytest.mark.slow
def test_strict_schema_calls_always_validate(client: TestClient, forced: ForcedScript) -> None:
    tool = _function("plan_trip", STRICT_SCHEMA, strict=True)
    calls = sample_calls(client, forced, tool, apis=("chat", "responses"), max_tokens=400)

    def check(call: Call) -> None:
        assert call.complete, call
        jsonschema.validate(json.loads(call.text), STRICT_SCHEMA)

    assert _report(calls, check) == (CALLS, CALLS)
    assert {(c.api, c.streamed) for c in calls} == {
        (api, s) for api in ("chat", "responses") for s in (True, False)
    }


@pytest.mark.slow
def test_loose_tool_calls_are_one_json_object(client: TestClient, forced: ForcedScript) -> None:
    tool = _function("search", LOOSE_SCHEMA, strict=False)
    calls = sample_calls(client, forced, tool, apis=("chat", "responses"), max_tokens=160)

    def check(call: Call) -> None:
        if call.complete:
            assert isinstance(json.loads(call.text), dict), call
        else:
            assert call.text.startswith("{"), call

    complete, total = _report(calls, check)
    assert complete >= total // 4  # random weights do close most objects


def lark_parser(definition: str) -> lark.Lark:
    """Codex's grammar for the `lark` package, which refuses zero-width terminals."""
    return lark.Lark(definition.replace("/(.*)/", "/(.+)/?"), start="start")


_SUFFIXES = ("", "*** End Patch\n", "+x\n*** End Patch\n", "*** Delete File: x\n*** End Patch\n")
_PARTIAL = re.compile(r"[+\- ].*|@@( .*)?|\*\*\* (Add File|Delete File|Update File|Move to): .*")
_HEADS = (
    *("*** Begin Patch", "*** End Patch", "*** End of File", "*** Add File: "),
    *("*** Delete File: ", "*** Update File: ", "*** Move to: ", "@@ "),
)


def viable_patch_prefix(parser: lark.Lark, text: str) -> bool:
    """Complete lines the grammar allows in that order, then a start of an allowed line."""
    lines, _, partial = text.rpartition("\n")
    done = lines + "\n" if lines else ""
    if not any(_parses(parser, done + s) for s in _SUFFIXES):
        return False
    return (
        not partial
        or bool(_PARTIAL.fullmatch(partial))
        or any(h.startswith(partial) for h in _HEADS)
    )


def _parses(parser: lark.Lark, text: str) -> bool:
    try:
        parser.parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


@pytest.mark.slow
def test_apply_patch_inputs_parse_under_codex_grammar(
    client: TestClient, forced: ForcedScript
) -> None:
    tool = codex_apply_patch()
    parser = lark_parser(tool["format"]["definition"])
    calls = sample_calls(client, forced, tool, apis=("responses",), max_tokens=160)

    def check(call: Call) -> None:
        if call.complete:
            assert _parses(parser, call.text), call
        else:
            assert viable_patch_prefix(parser, call.text), call  # the server unwraps the input

    _report(calls, check)  # random weights rarely finish a patch within the limit: most are cut


@pytest.mark.slow
def test_regex_tool_inputs_match(client: TestClient, forced: ForcedScript) -> None:
    tool = {
        "type": "custom",
        "name": "fetch",
        "description": "Fetch a path.",
        "format": {"type": "grammar", "syntax": "regex", "definition": REGEX},
    }
    calls = sample_calls(client, forced, tool, apis=("responses",), max_tokens=120)

    def check(call: Call) -> None:
        assert call.complete, call
        assert re.fullmatch(REGEX, call.text), call

    assert _report(calls, check) == (CALLS, CALLS)


def test_viable_prefix_check_tells_patches_apart() -> None:
    parser = lark_parser(codex_apply_patch()["format"]["definition"])
    start = "*** Begin Patch\n*** Update File: a.py\n@@ def f\n-old\n+new\n"
    assert viable_patch_prefix(parser, start)
    assert viable_patch_prefix(parser, start + "*** End")
    assert not viable_patch_prefix(parser, "*** Begin Patch\n+orphan line\n")
    assert not viable_patch_prefix(parser, start + "garbage\n")
    assert _parses(parser, start + "*** End Patch\n")

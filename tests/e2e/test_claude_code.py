"""The real Claude Code CLI (npm @anthropic-ai/claude-code, pinned) against /v1/messages.

Claude Code runs headless (`claude -p ... --output-format stream-json --verbose`, stdin closed,
HOME in a temp dir) with ANTHROPIC_BASE_URL pointing at the server on 127.0.0.1. The server runs
the real tiny engine; forced scripts choose what the model says, one script per request Claude
Code makes. Every request it sent is recorded; its shape (method, path, query, headers, body
keys, content block types, the stream's events; never its prompt text) is logged and written
beside the test's temporary files (`pytest --log-cli-level=INFO` shows it), for the record of
what Claude Code sends.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from devkit.client_pins import CLAUDE_CODE
from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.anthropic import (
    Exchange,
    ExchangeRecorder,
    check_messages_sse,
)
from tests.support.claude_code import (
    MODEL,
    N_CTX,
    SMALL_N_CTX,
    TOKEN,
    ClaudeRun,
    Server,
    run_claude,
)
from tests.support.responses import served

pytestmark = pytest.mark.slow  # the real Claude Code CLI (installed from npm once per machine)

log = logging.getLogger(__name__)

RECORDED_VALUES = ("anthropic-version", "anthropic-beta", "content-type", "x-app")

BASH_CALL = (
    "<|channel|>analysis<|message|>THOUGHT-ONE: run it with Bash.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.Bash <|constrain|>json"
    '<|message|>{"command":"echo hello-from-bash","description":"Print a greeting"}<|call|>'
)
BASH_ANSWER = (
    "<|channel|>analysis<|message|>THOUGHT-TWO: it printed.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The command printed hello-from-bash.<|return|>"
)


@pytest.fixture(scope="module")
def script(encoding: HarmonyEncoding) -> ForcedScript:
    return ForcedScript(encoding)


@pytest.fixture(scope="module")
def server(tiny_gguf: Path, script: ForcedScript, encoding: HarmonyEncoding) -> Iterator[Server]:
    """The server with its own engine (a context large enough for Claude Code) and a key."""
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=N_CTX, n_threads=2)
    engine = LlamaEngine(config, sampling_hook=script)
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    settings = Settings(api_key=TOKEN, messages_ping_s=1.0)
    recorder = ExchangeRecorder(create_app(settings, runtime))
    try:
        with served(recorder) as url:
            yield Server(url.removesuffix("/v1"), recorder)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def small_server(tiny_gguf: Path, encoding: HarmonyEncoding) -> Iterator[Server]:
    """The server with a context smaller than Claude Code's first prompt."""
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=SMALL_N_CTX, n_threads=2)
    engine = LlamaEngine(config)
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    recorder = ExchangeRecorder(create_app(Settings(api_key=TOKEN), runtime))
    try:
        with served(recorder) as url:
            yield Server(url.removesuffix("/v1"), recorder)
    finally:
        engine.close()


def shape(exchange: Exchange) -> dict[str, Any]:
    """What a request looked like, without its prompt text."""
    body = exchange.json()
    headers = {
        name: (value if name in RECORDED_VALUES else "...")
        for name, value in sorted(exchange.headers.items())
    }
    out: dict[str, Any] = {
        "method": exchange.method,
        "path": exchange.path,
        "query": exchange.query,
        "status": exchange.status,
        "response_content_type": exchange.content_type,
        "headers": headers,
    }
    if exchange.content_type.startswith("text/event-stream"):
        payloads = check_messages_sse(exchange.response.decode().splitlines()).payloads
        out["response_stream"] = _stream_shape(payloads)
    if isinstance(body, dict):
        out["body_keys"] = sorted(body)
        out["messages"] = [_message_shape(m) for m in body.get("messages", [])]
        out["system"] = _system_shape(body.get("system"))
        out["tools"] = [_tool_shape(tool) for tool in body.get("tools", [])]
        for key in ("max_tokens", "thinking", "output_config", "context_management", "stream"):
            if key in body:
                out[key] = body[key]
        if isinstance(body.get("metadata"), dict):
            out["metadata_keys"] = sorted(body["metadata"])
    return out


def _stream_shape(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """The event types sent (runs of deltas counted), the blocks and the final usage."""
    events: list[str] = []
    for payload in payloads:
        name = payload["type"]
        if name == "content_block_delta":
            name = f"content_block_delta({payload['delta']['type']})"
        if events and events[-1].startswith(name):
            count = int(events[-1].rpartition("x")[2]) if " x" in events[-1] else 1
            events[-1] = f"{name} x{count + 1}"
        else:
            events.append(name)
    usage = [p["usage"] for p in payloads if p["type"] == "message_delta"]
    return {"events": events, "usage": usage[-1] if usage else None}


def _message_shape(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        return {"role": message.get("role"), "content": "string"}
    blocks = []
    for block in content or []:
        keys = sorted(k for k in block if k not in ("text", "thinking", "signature", "input"))
        blocks.append({"type": block.get("type"), "keys": keys})
    return {"role": message.get("role"), "content": blocks}


def _system_shape(system: Any) -> Any:
    if isinstance(system, list):
        return [sorted(block) for block in system]
    return type(system).__name__


def _tool_shape(tool: dict[str, Any]) -> dict[str, Any]:
    return {"name": tool.get("name"), "keys": sorted(tool)}


@dataclass
class BashTurn:
    run: ClaudeRun
    first_prompt: list[int]
    first_output: list[int]
    second_prompt: list[int]


@pytest.fixture(scope="module")
def bash_turn(
    claude_binary: Path,
    server: Server,
    script: ForcedScript,
    tmp_path_factory: pytest.TempPathFactory,
) -> BashTurn:
    workdir = tmp_path_factory.mktemp("work")
    home = tmp_path_factory.mktemp("home")
    first_output = script.push(BASH_CALL)
    script.push(BASH_ANSWER)
    before = len(script.prompts)
    run = run_claude(claude_binary, server, workdir, home, "Run echo hello-from-bash.")
    shapes = [shape(exchange) for exchange in run.exchanges]
    record = tmp_path_factory.mktemp("claude-code-shapes") / "requests.json"
    record.write_text(json.dumps(shapes, indent=2))
    version = CLAUDE_CODE.version
    log.info("Claude Code %s requests (in %s):\n%s", version, record, record.read_text())
    assert run.returncode == 0, run.stderr[-4000:]
    assert script.pending == 0, "Claude Code made fewer model requests than scripted"
    first, second = script.prompts[before:]
    return BashTurn(run, first, first_output, second)


def test_bash_turn_ends_with_a_success_result(bash_turn: BashTurn) -> None:
    run = bash_turn.run
    result = run.result
    assert result["subtype"] == "success", result
    assert result["is_error"] is False
    assert result["result"] == "The command printed hello-from-bash."
    streams = run.streams()
    assert [s.blocks()[-1]["type"] for s in streams] == ["tool_use", "text"]
    assert [[b["type"] for b in s.blocks()] for s in streams] == [
        ["thinking", "tool_use"],
        ["thinking", "text"],
    ]
    (call,) = [b for b in streams[0].blocks() if b["type"] == "tool_use"]
    assert call["name"] == "Bash"
    assert call["id"].startswith("toolu_")


def test_the_bash_output_comes_back_as_a_tool_result(bash_turn: BashTurn) -> None:
    requests = bash_turn.run.messages_requests()
    assert [request.status for request in bash_turn.run.exchanges] == [200, 200]
    first, second = requests
    assert first.query == second.query == "beta=true"
    assert "mid-conversation-tool-changes" in first.headers["anthropic-beta"]
    assert first.headers["authorization"] == f"Bearer {TOKEN}"
    messages = second.json()["messages"]
    (call,) = [b for b in messages[-2]["content"] if b["type"] == "tool_use"]
    (result,) = [b for b in messages[-1]["content"] if b["type"] == "tool_result"]
    assert result["tool_use_id"] == call["id"]
    assert "hello-from-bash" in json.dumps(result["content"])


def test_the_second_request_extends_the_first_prompt(
    bash_turn: BashTurn, encoding: HarmonyEncoding
) -> None:
    first, output, second = bash_turn.first_prompt, bash_turn.first_output, bash_turn.second_prompt
    # round 2 = round 1's prompt + exactly the tokens the model sampled + the tool result
    assert second[: len(first) + len(output)] == first + output
    tail = encoding.decode_utf8(second[len(first) + len(output) :])
    assert tail.startswith("<|start|>functions.Bash to=assistant<|channel|>commentary")
    assert "hello-from-bash" in tail
    usage = bash_turn.run.streams()[1].payloads
    (delta,) = [p for p in usage if p["type"] == "message_delta"]
    assert delta["usage"]["cache_read_input_tokens"] >= len(first) + len(output) - 1


def test_a_prompt_longer_than_the_context_stops_claude_code_with_prompt_too_long(
    claude_binary: Path, small_server: Server, tmp_path: Path
) -> None:
    """Claude Code reads the 400 as a context overflow: it says "Prompt is too long" and stops,
    rather than taking it for an unsupported feature and resending with betas stripped."""
    run = run_claude(claude_binary, small_server, tmp_path, tmp_path / "home", "Say done.")
    requests = run.messages_requests()
    assert [r.status for r in requests] == [400], [(r.status, r.response[:200]) for r in requests]
    error = json.loads(requests[0].response)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ")
    assert error["message"].endswith(f" tokens > {SMALL_N_CTX} maximum")
    result = run.result
    assert result["is_error"] is True, result
    assert "Prompt is too long" in json.dumps(result), result

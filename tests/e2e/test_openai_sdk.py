"""The official openai SDK against the server over real HTTP on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from devkit.forced import ForcedScript
from devkit.serving import free_port

pytestmark = pytest.mark.slow  # starts `gpt-oss-server serve` processes


@pytest.fixture
def sdk(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def test_streamed_chat_with_reasoning(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(
        "<|channel|>analysis<|message|>Simple greeting.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hi there, friend.<|return|>"
    )
    stream = sdk.chat.completions.create(
        model="gpt-oss-tiny",
        messages=[{"role": "user", "content": "Hello"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"reasoning": {"effort": "low"}},
    )
    reasoning, content, finish, usage = [], [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            reasoning.append(extra.get("reasoning") or "")
            content.append(choice.delta.content or "")
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert "".join(reasoning) == "Simple greeting."
    assert "".join(content) == "Hi there, friend."
    assert finish == ["stop"]
    assert usage is not None
    assert usage.completion_tokens_details is not None
    assert (usage.completion_tokens_details.reasoning_tokens or 0) > 0


def test_non_streamed_chat(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(
        "<|channel|>analysis<|message|>Math.<|end|><|start|>assistant"
        "<|channel|>final<|message|>2 + 2 = 4.<|return|>"
    )
    completion = sdk.chat.completions.create(
        model="gpt-oss-tiny", messages=[{"role": "user", "content": "2+2?"}]
    )
    message = completion.choices[0].message
    assert message.content == "2 + 2 = 4."
    assert (message.model_extra or {})["reasoning"] == "Math."
    assert sdk.models.list().data[0].id == "gpt-oss-tiny"


@pytest.fixture(scope="module")
def cli_server(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`gpt-oss-server serve` as a user runs it, on the tiny GGUF."""
    port = free_port()
    env = {**os.environ, "GPT_OSS_CACHE_DIR": str(tmp_path_factory.mktemp("server-cache"))}
    command = [
        sys.executable,
        "-m",
        "server",
        "serve",
        "--model",
        str(tiny_gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n-ctx",
        "2048",
        "--n-threads",
        "2",
    ]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process)
        yield url
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
        # uvicorn shuts down cleanly on SIGTERM, then re-raises it
        assert process.returncode in (0, -signal.SIGTERM), output
        assert "Traceback" not in output, output


def _wait_healthy(url: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {process.stdout.read() if process.stdout else ''}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become healthy")


def test_cli_serve_answers_health_models_and_a_streamed_chat(
    cli_server: str, tiny_gguf: Path
) -> None:
    health = httpx.get(f"{cli_server}/health").json()
    assert health == {"status": "ok", "model": tiny_gguf.stem, "model_state": "loaded"}
    sdk = OpenAI(base_url=f"{cli_server}/v1", api_key="unused", max_retries=0)
    assert sdk.models.list().data[0].id == tiny_gguf.stem  # the served name first, then aliases
    stream = sdk.chat.completions.create(
        model=tiny_gguf.stem,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=24,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert len(finish) == 1  # random weights: "length" or, by chance, "stop"/"tool_calls"
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert usage is not None
    assert 0 < usage.completion_tokens <= 24
    assert usage.prompt_tokens > 0


def test_cli_reports_a_missing_model_clearly(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    result = subprocess.run(
        [sys.executable, "-m", "server", "serve", "--model", str(missing)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPT_OSS_CACHE_DIR": str(tmp_path)},
    )
    assert result.returncode == 1
    assert f"model file {missing} does not exist" in result.stderr
    assert "Traceback" not in result.stderr

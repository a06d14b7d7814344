"""The chat with a running server (`--url`), over its own Chat Completions API.

The conversation goes back as messages, earlier answers as the text the server sent; the
server's History replays them as the tokens it sampled, so its engine reuses the KV state of
the conversation (the usage's `cached_tokens` says how much). Streaming: the reasoning comes as
`delta.reasoning`, the answer as `delta.content`, and the last chunk carries the usage and
llama-server style `timings`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from server.ops.chat.turns import Answer, Conversation, Thinking, TurnEnd, TurnEvent, TurnStats

CONNECT_TIMEOUT_S = 10.0


class ChatConnectError(Exception):
    """The server cannot be used: unreachable, a refused key, no model."""


def api_root(url: str) -> str:
    """The /v1 URL of a server named by its address or its /v1 URL."""
    root = url.rstrip("/")
    if not root.startswith(("http://", "https://")):
        root = f"http://{root}"
    return root if root.endswith("/v1") else f"{root}/v1"


class RemoteChat:
    """A gpt-oss-server (or another server with the same API) reached over HTTP. Build it on
    the event loop that runs its turns, then `await connect()`."""

    def __init__(self, url: str, api_key: str | None, model: str | None = None) -> None:
        self.url = api_root(url)
        self._wanted = model  # a name of one of the server's models; None: its first
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=None)  # a long prefill sends nothing
        self._client = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout)
        self.model_name = ""

    async def connect(self) -> str:
        """Ask the server for its models and take the one wanted, or its first
        (ChatConnectError when it cannot be used, or serves no model of the wanted name)."""
        try:
            response = await self._client.get("/models")
        except httpx.HTTPError as exc:
            raise ChatConnectError(f"cannot reach {self.url}: {exc}") from exc
        if response.status_code != 200:
            raise ChatConnectError(f"{self.url}/models: {_error_message(response)}")
        try:
            models = [str(model["id"]) for model in response.json()["data"]]
            self.model_name = models[0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ChatConnectError(f"{self.url}/models lists no model") from exc
        if self._wanted is not None:
            if self._wanted not in models:
                raise ChatConnectError(
                    f"{self.url} serves no model named {self._wanted!r}; it serves: "
                    f"{', '.join(models)}"
                )
            self.model_name = self._wanted
        return self.model_name

    async def turn(self, conversation: Conversation, prompt: str) -> AsyncIterator[TurnEvent]:
        body = {
            "model": self.model_name,
            "messages": messages(conversation, prompt),
            "reasoning_effort": conversation.effort,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        stream = _Stream()
        try:
            async with self._client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    yield TurnEnd(complete=False, error=_error_message(response))
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        break
                    for event in stream.feed(json.loads(data)):
                        yield event
        except httpx.HTTPError as exc:
            yield TurnEnd(complete=False, error=f"the connection to {self.url} failed: {exc}")
            return
        except ValueError:
            yield TurnEnd(complete=False, error=f"{self.url} sent a chunk that is not JSON")
            return
        yield stream.end()

    async def close(self) -> None:
        await self._client.aclose()


def messages(conversation: Conversation, prompt: str) -> list[dict[str, str]]:
    """The conversation as Chat Completions messages (the model's text as the server sent it:
    what its History recognises)."""
    out = []
    if conversation.instructions:
        out.append({"role": "system", "content": conversation.instructions})
    for exchange in conversation.exchanges:
        out.append({"role": "user", "content": exchange.user})
        text = "".join(text for _, text in exchange.messages)
        if text:
            out.append({"role": "assistant", "content": text})
    out.append({"role": "user", "content": prompt})
    return out


class _Stream:
    """Chat completion chunks -> turn events, and what the turn's end reports."""

    def __init__(self) -> None:
        self.answer: list[str] = []
        self.finish_reason: str | None = None
        self.stats: TurnStats | None = None
        self.error: str | None = None

    def feed(self, chunk: dict[str, Any]) -> list[TurnEvent]:
        events: list[TurnEvent] = []
        if "error" in chunk:
            error = chunk["error"]
            self.error = str(error.get("message", error) if isinstance(error, dict) else error)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning"):
                events.append(Thinking(str(delta["reasoning"])))
            if delta.get("content"):
                self.answer.append(str(delta["content"]))
                events.append(Answer(str(delta["content"])))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        if chunk.get("usage"):
            self.stats = _stats(chunk["usage"], chunk.get("timings") or {})
        return events

    def end(self) -> TurnEnd:
        complete = self.finish_reason == "stop" and self.error is None
        answer = "".join(self.answer)
        return TurnEnd(
            complete=complete,
            messages=(("final", answer),) if answer else (),
            stats=self.stats,
            error=self.error,
            reason=self.finish_reason or "",
        )


def _stats(usage: dict[str, Any], timings: dict[str, Any]) -> TurnStats:
    details = usage.get("prompt_tokens_details") or {}
    return TurnStats(
        completion_tokens=int(usage.get("completion_tokens", 0)),
        tokens_per_s=float(timings.get("predicted_per_second", 0.0)),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int(details.get("cached_tokens", 0)),
    )


def _error_message(response: httpx.Response) -> str:
    """The server's own error message (OpenAI's envelope), else the status."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {response.status_code}: {message or response.reason_phrase}"

"""Chat Completions with n > 1 on the real tiny engine: one generation per choice, side by side,
streamed (chunks by choice index, one usage chunk, one [DONE]) and folded; n beyond the slots
is a clear 400."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletion
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from tests.support.chat import USER_HI, chunks_of, post, stream
from tests.support.scripts import answer


def test_choices_folded(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(answer("Alpha."))
    forced.push(answer("Beta gamma."))
    response = post(client, messages=USER_HI, n=2, logprobs=True, seed=3)
    assert response.status_code == 200
    body = ChatCompletion.model_validate(response.json())
    assert [choice.index for choice in body.choices] == [0, 1]
    contents = {choice.message.content for choice in body.choices}
    assert contents == {"Alpha.", "Beta gamma."}
    for choice in body.choices:
        assert choice.finish_reason == "stop"
        assert choice.logprobs is not None
        assert (
            "".join(entry.token for entry in choice.logprobs.content or [])
            == choice.message.content
        )
    assert body.usage is not None
    script_tokens = sum(
        len(encoding.encode(answer(text or ""), allowed_special="all")) for text in contents
    )
    assert body.usage.completion_tokens == script_tokens
    assert body.usage.total_tokens == body.usage.prompt_tokens + script_tokens
    assert body.usage.prompt_tokens == len(forced.prompts[-1])


def test_choices_streamed(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(answer("One."))
    forced.push(answer("Two."))
    forced.push(answer("Three."))
    datas = stream(client, messages=USER_HI, n=3, stream_options={"include_usage": True})
    assert datas.count("[DONE]") == 1
    chunks = chunks_of(datas)
    texts: dict[int, str] = {}
    finishes: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason is not None:
                finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert sorted(texts) == [0, 1, 2]
    assert sorted(texts.values()) == ["One.", "Three.", "Two."]
    assert finishes == {0: ["stop"], 1: ["stop"], 2: ["stop"]}
    usage_chunks = [chunk for chunk in chunks if chunk.usage is not None]
    assert len(usage_chunks) == 1
    assert usage_chunks[0] is chunks[-1]
    assert usage_chunks[0].usage is not None
    scripts = [answer(text) for text in ("One.", "Two.", "Three.")]
    expected = sum(len(encoding.encode(script, allowed_special="all")) for script in scripts)
    assert usage_chunks[0].usage.completion_tokens == expected


def test_too_many_choices_for_the_slots(client: TestClient) -> None:
    response = post(client, messages=USER_HI, n=5)
    assert response.status_code == 400
    error = json.loads(response.text)["error"]
    assert error["param"] == "n"
    assert "slots" in error["message"]

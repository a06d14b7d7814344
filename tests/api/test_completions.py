"""/v1/completions on the real tiny engine: raw prompts (text or ids), echo with the prompt's
logprobs (the engine's own scoring), max_tokens 0, streaming, stop strings and clear 400s."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai.types import Completion
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.app import create_app
from server.contracts.events import Finished
from server.core.raw import RawText
from server.engine.base import SamplingParams
from server.engine.llama import LlamaEngine
from server.harmony.token_bytes import TokenBytes
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.sse import parse_sse


def post(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/completions", json={"model": "gpt-oss-tiny", **body})


def engine_scores(engine: LlamaEngine, tokens: list[int], n_top: int) -> list[Any]:
    async def run() -> list[Any]:
        params = SamplingParams(max_tokens=0, logprobs=n_top, prompt_logprobs=True)
        stream = engine.submit(tokens, params)
        async for _ in stream:
            pass
        return list(stream.result.prompt_logprobs)

    return asyncio.run(run())


def test_echo_scores_the_prompt_as_the_engine_does(
    client: TestClient, engine: LlamaEngine, encoding: HarmonyEncoding
) -> None:
    tokens = encoding.encode("The capital of France is Paris. The capital of Peru is Lima.")
    response = post(client, prompt=tokens, echo=True, logprobs=2, max_tokens=0)
    assert response.status_code == 200
    body = response.json()  # (the SDK's type has no null for the first prompt token: OpenAI's
    choice = body["choices"][0]  # answers and clients such as lm-eval do)
    assert choice["text"] == encoding.decode(tokens)
    assert choice["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len(tokens)
    assert body["usage"]["completion_tokens"] == 0
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [encoding.decode([t]) for t in tokens]
    offsets = [len(encoding.decode(tokens[:i])) for i in range(len(tokens))]
    assert logprobs["text_offset"] == offsets
    assert logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None
    reference = engine_scores(engine, tokens, 2)
    for position in range(1, len(tokens)):
        value = logprobs["token_logprobs"][position]
        assert value == pytest.approx(reference[position].logprob, abs=1e-6)
        top = logprobs["top_logprobs"][position]
        assert 1 <= len(top) <= 2
        assert max(top.values()) >= value - 1e-9


def test_text_prompt_generates_raw_tokens(client: TestClient, forced: ForcedScript) -> None:
    forced.push("Lima, Peru.<|return|>")
    response = post(client, prompt="The capital of Peru is", max_tokens=20, logprobs=0)
    assert response.status_code == 200
    body = Completion.model_validate(response.json())
    choice = body.choices[0]
    assert choice.text == "Lima, Peru."
    assert choice.finish_reason == "stop"
    assert choice.logprobs is not None
    assert "".join(choice.logprobs.tokens or []) == "Lima, Peru.<|return|>"  # text: not its end
    assert all(top == {} for top in choice.logprobs.top_logprobs or [])
    assert body.usage is not None
    assert body.usage.completion_tokens == len(choice.logprobs.tokens or [])


def test_echo_and_generation_together(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(" Lima<|return|>")
    prompt = "The capital of Peru is"
    body = post(client, prompt=prompt, echo=True, logprobs=1, max_tokens=4).json()
    choice = body["choices"][0]
    assert choice["text"] == prompt + " Lima"
    lists = choice["logprobs"]
    n_prompt = len(encoding.encode(prompt))
    assert len(lists["tokens"]) == n_prompt + len(encoding.encode(" Lima")) + 1  # + <|return|>
    assert lists["text_offset"][n_prompt] == len(prompt)
    assert all(v is not None for v in lists["token_logprobs"][1:])


def test_max_tokens_and_stop_string(client: TestClient, forced: ForcedScript) -> None:
    forced.push("one two three four five six")
    body = post(client, prompt="Count:", max_tokens=3, temperature=0).json()
    assert body["choices"][0]["text"] == "one two three"
    assert body["choices"][0]["finish_reason"] == "length"
    forced.push("one two three four five six")
    body = post(client, prompt="Count:", max_tokens=10, stop=[" three"], logprobs=0).json()
    assert body["choices"][0]["text"] == "one two"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["logprobs"]["tokens"] == ["one", " two"]


def test_bytes_after_a_stop_string_add_nothing(encoding: HarmonyEncoding) -> None:
    """A chunk may bring tokens past the stop string; one that ends inside a character leaves
    bytes in the decoder, and the final flush must not append their U+FFFD to the cut text."""
    vocab = TokenBytes.load(encoding)
    partial = encoding.encode("\U0001f999")[0]  # the first of the character's tokens
    assert vocab.text(partial) == "\ufffd"
    text = RawText(vocab, [" three"], frozenset())
    delta = text.feed([*encoding.encode("one two three four"), partial])
    assert delta is not None
    assert delta.text == "one two"
    assert text.matched == " three"
    assert text.finish() is None
    assert text.text == "one two"


def test_text_offsets_count_characters_and_cut_at_the_stop_string(
    client: TestClient, forced: ForcedScript
) -> None:
    """Each 👋 is two tokens: an offset counts the character once (at the token completing it),
    so the token before the stop string is listed and the stop string's first is not."""
    forced.push("👋👋👋👋 a, b<|return|>")
    body = post(client, prompt="Wave:", max_tokens=20, stop=[", b"], logprobs=0).json()
    choice = body["choices"][0]
    assert choice["text"] == "👋👋👋👋 a"
    assert choice["finish_reason"] == "stop"
    logprobs = choice["logprobs"]
    assert logprobs["text_offset"] == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    assert logprobs["tokens"][-1] == " a"


def test_text_offsets_after_an_echoed_prompt(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(" 👋 hi<|return|>")
    prompt = "Wave 👋"
    body = post(client, prompt=prompt, echo=True, max_tokens=5, logprobs=0).json()
    choice = body["choices"][0]
    assert choice["text"] == "Wave 👋 👋 hi"
    lists = choice["logprobs"]
    n_prompt = len(encoding.encode(prompt))
    # " 👋" is two tokens: the space with the character's first bytes, then the rest of it
    assert lists["text_offset"][n_prompt:] == [6, 7, 8, 11]
    assert lists["text_offset"][:n_prompt] == [0, 4, 5]
    assert lists["tokens"][n_prompt:][-2:] == [" hi", "<|return|>"]


def test_the_stream_ends_its_logprobs_at_the_stop_string(
    client: TestClient, forced: ForcedScript
) -> None:
    forced.push("one two three four five six")
    with client.stream(
        "POST",
        "/v1/completions",
        json={
            "prompt": "Count:",
            "stream": True,
            "logprobs": 0,
            "max_tokens": 10,
            "stop": " three",
        },
    ) as response:
        datas = [event.data for event in parse_sse(response.iter_lines())]
    assert datas[-1] == "[DONE]"
    choices = [json.loads(d)["choices"][0] for d in datas[:-1]]
    assert "".join(c["text"] for c in choices) == "one two"
    tokens = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert tokens == ["one", " two"]
    assert choices[-1]["finish_reason"] == "stop"


def test_several_prompts_are_several_choices(client: TestClient, encoding: HarmonyEncoding) -> None:
    prompts = [encoding.encode("Alpha beta"), encoding.encode("Gamma delta epsilon")]
    body = post(client, prompt=prompts, echo=True, max_tokens=0, logprobs=0).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["text"] for c in body["choices"]] == ["Alpha beta", "Gamma delta epsilon"]
    assert [len(c["logprobs"]["tokens"]) for c in body["choices"]] == [len(p) for p in prompts]
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_stream_is_the_same_text(client: TestClient, forced: ForcedScript) -> None:
    forced.push("Hello 👋 world<|return|>")
    with client.stream(
        "POST",
        "/v1/completions",
        json={
            "prompt": "Say hi",
            "stream": True,
            "logprobs": 1,
            "max_tokens": 10,
            "stream_options": {"include_usage": True},
        },
    ) as response:
        assert response.status_code == 200
        datas = [event.data for event in parse_sse(response.iter_lines())]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]  # (the SDK builds these without validation)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(choice["text"] for choice in choices) == "Hello 👋 world"
    assert [choice["finish_reason"] for choice in choices][-1] == "stop"
    assert all(choice["finish_reason"] is None for choice in choices[:-1])
    usage = chunks[-1]["usage"]
    scored = [choice["logprobs"] for choice in choices if choice["logprobs"]]
    assert sum(len(lp["tokens"]) for lp in scored) == usage["completion_tokens"]
    assert scored[-1]["tokens"][-1] == "<|return|>"
    assert b"".join(t.encode() for lp in scored for t in lp["tokens"]).count(b"world") == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": "hi", "logprobs": 21}, "logprobs"),
        ({"prompt": "hi", "echo": True, "stream": True}, "echo"),
        ({"prompt": "hi <|start|>"}, "prompt"),
        ({"prompt": [1, 200006]}, "prompt"),
        ({"prompt": [1, 300000]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": "hi", "n": 2}, None),
        ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ],
)
def test_bad_requests_get_a_clear_400(
    client: TestClient, fields: dict[str, Any], param: str | None
) -> None:
    response = post(client, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


def test_specials_where_the_request_allows_them(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    prompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    forced.push("<|channel|>final<|message|>Hey<|return|>")
    body = post(client, prompt=prompt, allow_special_tokens=True, max_tokens=8).json()
    assert body["choices"][0]["text"] == "<|channel|>final<|message|>Hey"
    assert body["usage"]["prompt_tokens"] == len(encoding.encode(prompt, allowed_special="all"))
    ids = encoding.encode(prompt, allowed_special="all")
    forced.push("Hey<|return|>")
    response = post(client, prompt=ids, allow_special_tokens=True, max_tokens=2)
    assert response.status_code == 200
    assert json.loads(response.text)["choices"][0]["text"] == "Hey"


def test_a_stream_that_raises_mid_way_ends_with_an_error_and_done(
    runtime: Runtime, forced: ForcedScript
) -> None:
    """The generator's `on_finished` hook (the app's metrics) raising is a real failure inside
    the generation, after the text was streamed: the stream still ends with the error envelope
    as a `data:` line, then `[DONE]`; without streaming, a 500 in OpenAI's shape."""
    app = create_app(Settings(), runtime)
    with TestClient(app, raise_server_exceptions=False) as failing:

        def observe(finished: Finished) -> None:
            raise RuntimeError("the metrics broke")

        app.state.generator.on_finished = observe
        forced.push("Hello there<|return|>")
        body = {"prompt": "Say hi", "stream": True, "max_tokens": 10}
        with failing.stream("POST", "/v1/completions", json=body) as response:
            datas = [event.data for event in parse_sse(response.iter_lines())]
        assert datas[-1] == "[DONE]"
        error = json.loads(datas[-2])["error"]
        assert error["type"] == "server_error"
        assert "internal error: RuntimeError" in error["message"]
        texts = [json.loads(d)["choices"][0]["text"] for d in datas[:-2]]
        assert "".join(texts) == "Hello there"  # streamed before the failure

        forced.push("Hello there<|return|>")
        response = post(failing, prompt="Say hi", max_tokens=10)
        assert response.status_code == 500
        assert "internal error: RuntimeError" in response.json()["error"]["message"]

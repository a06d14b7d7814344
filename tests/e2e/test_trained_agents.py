"""Unscripted tool use on the trained tiny gpt-oss through the real SDKs (openai, anthropic).

Nothing is forced (tests/support/trained.py); the server is greedy and its steering is on. The
values the model must copy are words from the held-out part of the training vocabulary: the
corpus never used them (devkit/train_tiny/corpus.py splits the word pool by hash). Steering
decides only the form (a call, its tool's name, JSON of the schema's shape); every test here
checks the values the model wrote. The counted tests hold floors set by one rule
(devkit/floors.py: the committed model's count on the test's own fixed draw less two, and above
what a model copying one item in ten gets); `python -m devkit.floors --gguf PATH` measures the
same floors on another model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import anthropic
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from devkit import floors
from devkit.floors import LOOKUP, WEATHER, chat_tool, held_out_words, messages_tool
from tests.support.trained import MODEL, TrainedServer, trained_server

log = logging.getLogger(__name__)

pytestmark = pytest.mark.slow  # builds the trained GGUF once per machine


@pytest.fixture(scope="module")
def pool(encoding: HarmonyEncoding) -> list[str]:
    """Held-out words (the corpus never used them) that are words, not fragments."""
    return floors.held_out(encoding)


@pytest.fixture(scope="module")
def server(
    encoding: HarmonyEncoding, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TrainedServer]:
    with trained_server(encoding, tmp_path_factory.mktemp("store"), 4096) as running:
        yield running


@pytest.fixture
def sdk(server: TrainedServer) -> OpenAI:
    return OpenAI(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture
def messages_sdk(server: TrainedServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url.removesuffix("/v1"), api_key="unused", max_retries=0
    )


def test_chat_the_model_calls_the_asked_tool_with_the_city_copied(
    sdk: OpenAI, pool: list[str]
) -> None:
    """With `tool_choice` auto the model picks the tool (of two) and copies the held-out city."""
    (city,) = held_out_words(pool, 1)
    answer = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"What is the weather in {city}?"}],
        tools=[chat_tool(WEATHER), chat_tool(LOOKUP)],
        max_tokens=300,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": city},
    )


def test_chat_tool_loop_copies_the_argument_and_quotes_the_result(
    sdk: OpenAI, pool: list[str]
) -> None:
    """Eight loops: the call copies the city exactly, then the answer quotes the tool's result."""
    copied, quoted = floors.tool_loops(sdk, pool)
    log.info("%s; %s", copied, quoted)
    assert copied.holds, str(copied)
    assert quoted.holds, str(quoted)


def test_named_tool_choice_on_chat_copies_the_name(sdk: OpenAI, pool: list[str]) -> None:
    (name,) = held_out_words(pool, 1)
    assert floors.named_lookup(sdk, name) == floors.exact_name(name)


def test_named_tool_choice_copies_the_argument(sdk: OpenAI, pool: list[str]) -> None:
    """Twelve held-out names through a named `tool_choice`, each copied exactly."""
    copied = floors.named_choice(sdk, pool)
    log.info("%s", copied)
    assert copied.holds, str(copied)


def test_seeded_sampling_copies_the_argument_and_repeats_itself(
    sdk: OpenAI, pool: list[str]
) -> None:
    """The same requests sampled at temperature 0.7 with a seed, and each seed gives the same
    call again: seeded sampling end to end."""
    copied, first = floors.seeded(sdk, pool)
    log.info("%s", copied)
    assert copied.holds, str(copied)
    names = held_out_words(pool, 8, seed=floors.SEEDED_SEED)
    again = [floors.named_lookup(sdk, n, temperature=0.7, seed=s) for s, n in enumerate(names[:3])]
    assert again == first[:3]


def test_named_tool_choice_on_responses_copies_the_name(sdk: OpenAI, pool: list[str]) -> None:
    (name,) = held_out_words(pool, 1)
    response = sdk.responses.create(  # type: ignore[call-overload]
        model=MODEL,
        input=f"Look up the user {name}.",
        tools=[{"type": "function", **WEATHER}, {"type": "function", **LOOKUP}],
        tool_choice={"type": "function", "name": "lookup_user"},
        max_output_tokens=300,
    )
    assert response.status == "completed"
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("lookup_user", {"name": name})]


def test_named_tool_choice_on_messages_copies_the_name(
    messages_sdk: anthropic.Anthropic, pool: list[str]
) -> None:
    (name,) = held_out_words(pool, 1)
    message = messages_sdk.messages.create(  # type: ignore[call-overload]
        model=MODEL,
        max_tokens=300,
        messages=[{"role": "user", "content": f"Look up the user {name}."}],
        tools=[messages_tool(s) for s in (WEATHER, LOOKUP)],
        tool_choice={"type": "tool", "name": "lookup_user"},
    )
    assert message.stop_reason == "tool_use"
    uses = [block for block in message.content if block.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("lookup_user", {"name": name})]


def test_generic_tools_copy_drawn_paths_and_commands_on_all_three_apis_alike(
    sdk: OpenAI,
    messages_sdk: anthropic.Anthropic,
    encoding: HarmonyEncoding,
    server: TrainedServer,
) -> None:
    """A generic file or shell tool offered among others and asked, in varied wordings, for a
    held-out multi-token path (directories, `_`, `-`, `.`, digits) or shell command (flags,
    quotes): the call copies it exactly, through each of the three APIs; and the three render
    each ask to the same prompt and the model writes the same tokens after it."""
    found = floors.paths(sdk, messages_sdk, encoding, server.prompts)
    asks = floors.drawn_asks(encoding)
    log.info("drawn asks, seed %d: %s", floors.PATHS_SEED, [ask.text for ask in asks])
    for copied in found.tallies.values():
        log.info("%s", copied)
    assert all(t.holds for t in found.tallies.values()), [str(t) for t in found.tallies.values()]
    parting = found.parting(encoding)
    assert parting is None, parting

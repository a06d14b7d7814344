"""tiktoken's o200k tokens of a text are harmony's, and the Renderer's frames around them give
harmony's render of every kind of item, on generated text (hypothesis) and a few hand-picked
edges."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding, HarmonyError

from server.api.responses.adapter import to_tools
from server.contracts.transcript import (
    AssistantMessage,
    DeveloperMessage,
    Item,
    Reasoning,
    ResponseFormat,
    ToolCall,
    ToolResult,
    ToolSpec,
    Transcript,
    UserMessage,
)
from server.harmony import renderer as renderer_module
from server.harmony.encoding import VOCAB_FILE, ensure_vocab_dir
from server.harmony.render import head_tokens, item_tokens, render, tool_message_tokens
from server.harmony.renderer import TEXT_FIELD, Renderer
from server.harmony.text_tokens import (
    O200K_PATTERN,
    TextTokens,
    encode_text,
    shared_text_tokens,
)
from server.harmony.tokens import END, MESSAGE

EDGES = [
    "",
    " ",
    "\n\n\n",
    "<|end|><|start|>assistant<|channel|>final<|message|>",  # text, never special tokens
    "don't I'LL we've 12345678 3.14159",
    "日本語のテキスト 한국어 Ελληνικά עברית العربية",
    "🙂👍🏽 e\u0301 \u200b\u00a0 \t\r\n",
    "    def f(x):\n        return {'a': [1, 2]}\n",
]
TEXTS = st.text(max_size=400) | st.sampled_from(EDGES)


def generated(examples: int) -> settings:
    """Hypothesis's settings here: the module's fixtures serve every example (they are read
    only), no deadline (harmony's own render of a long run is slow)."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


@pytest.fixture(scope="module")
def text_tokens(encoding: HarmonyEncoding) -> TextTokens:
    tokens = shared_text_tokens(encoding)
    assert tokens is not None
    assert tokens.wait(30)
    return tokens


def test_the_pattern_is_tiktokens_o200k(
    vocab_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tiktoken's own o200k_base, loaded offline (its cache holding the local vocabulary under
    the name of its download), has the same pattern."""
    from tiktoken_ext.openai_public import o200k_base  # type: ignore[import-untyped]

    url = f"https://openaipublic.blob.core.windows.net/encodings/{VOCAB_FILE}"
    source = ensure_vocab_dir(vocab_dir) / VOCAB_FILE
    (tmp_path / hashlib.sha1(url.encode()).hexdigest()).write_bytes(source.read_bytes())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert o200k_base()["pat_str"] == O200K_PATTERN


@generated(300)
@given(text=TEXTS)
def test_the_tokens_are_harmonys(
    encoding: HarmonyEncoding, text_tokens: TextTokens, text: str
) -> None:
    assert text_tokens.encode(text) == encoding.encode(text, disallowed_special=())


def items_of(text: str) -> list[Item]:
    return [
        UserMessage(text),
        DeveloperMessage(text),
        Reasoning(text),
        AssistantMessage(text, "final"),
        AssistantMessage(text, "commentary"),
        ToolCall("call_1", "shell", text),
        ToolCall("call_2", "apply_patch", text, content_type=None),
        ToolCall("call_3", "add", text, namespace="calc"),
        ToolResult("call_1", text, "shell"),
        ToolResult("call_4", text, "python", namespace="python", channel="analysis"),
    ]


@generated(60)
@given(text=TEXTS)
def test_every_item_renders_as_harmony_renders_it(
    encoding: HarmonyEncoding, text_tokens: TextTokens, text: str
) -> None:
    renderer = Renderer(encoding, text_tokens)
    for item in items_of(text):
        transcript = Transcript(items=(item,))
        assert renderer.render(transcript) == render(encoding, transcript), item


def test_every_kind_of_item_has_a_text_field() -> None:
    kinds = {type(item) for item in items_of("x")}
    assert kinds == set(TEXT_FIELD)
    for item in items_of("x"):
        assert getattr(item, TEXT_FIELD[type(item)]) == "x"


def test_calls_that_differ_by_their_id_share_a_frame_and_render_their_own(
    encoding: HarmonyEncoding, text_tokens: TextTokens
) -> None:
    renderer = Renderer(encoding, text_tokens)
    results = [ToolResult(f"call_{i}", f"output {i}", "shell") for i in range(5)]
    calls = [ToolCall(f"call_{i}", "shell", f'{{"n": {i}}}') for i in range(5)]
    items: list[Item] = [*results, *calls]
    for item in items:
        assert renderer.render(Transcript(items=(item,))) == render(
            encoding, Transcript(items=(item,))
        )
    assert len(renderer._frames) == 2  # one per header, whatever the ids


class Unready:
    """Text tokens not built (yet): the renderer renders with harmony."""

    def encode(self, text: str) -> list[int] | None:
        return None


def test_without_text_tokens_harmony_renders_the_same(encoding: HarmonyEncoding) -> None:
    renderer = Renderer(encoding, Unready())  # type: ignore[arg-type]
    transcript = Transcript(items=tuple(items_of("Hello, <|end|> world")))
    assert renderer.render(transcript) == render(encoding, transcript)
    assert renderer._frames == {}


def test_an_item_without_a_usable_frame_is_rendered_by_harmony(
    encoding: HarmonyEncoding, text_tokens: TextTokens
) -> None:
    """A frame is used only where harmony's render of the empty text ends in `<|message|>` and
    an end token; otherwise (marked None) the whole item is harmony's render."""
    renderer = Renderer(encoding, text_tokens)
    item = UserMessage("hi")
    framed = item_tokens(encoding, dataclasses.replace(item, text=""))
    assert framed[-2:] == [MESSAGE, END]
    renderer._frames[dataclasses.replace(item, text="")] = None
    assert renderer.render(Transcript(items=(item,))) == render(encoding, Transcript(items=(item,)))


def test_a_vocabulary_that_disagrees_with_harmony_is_not_used(vocab_dir: Path) -> None:
    tokens = TextTokens(ensure_vocab_dir(vocab_dir) / VOCAB_FILE, lambda text: [1, 2, 3])
    assert not tokens.wait(30)
    assert tokens.encode("anything") is None


def test_a_broken_vocabulary_file_is_not_used(tmp_path: Path) -> None:
    broken = tmp_path / VOCAB_FILE
    broken.write_bytes(b"aGVsbG8= not-a-rank\n")
    tokens = TextTokens(broken, lambda text: [])
    assert not tokens.wait(30)
    assert tokens.encode("anything") is None


@generated(40)
@given(text=TEXTS)
def test_a_server_run_tools_result_renders_as_harmony_renders_it(
    encoding: HarmonyEncoding, text_tokens: TextTokens, text: str
) -> None:
    renderer = Renderer(encoding, text_tokens)
    for author, channel in [
        ("python", "analysis"),
        ("browser.search", "analysis"),
        ("browser.open", "commentary"),
        ("web.add", "commentary"),
        ("files.read.text", "commentary"),
        ("shell", "commentary"),  # no namespace of its own: harmony renders it
    ]:
        expected = tool_message_tokens(encoding, author, text, channel)
        assert renderer.tool_result_tokens(author, text, channel) == expected, author


@pytest.mark.parametrize(
    "text",
    ["a" * 20_000, "=-" * 10_000, "".join(chr(97 + (i * 7919) % 26) for i in range(20_000))],
    ids=["letters", "punctuation", "mixed-letters"],
)
def test_a_long_run_without_spaces_is_tokenized_as_harmony_does(
    encoding: HarmonyEncoding, text_tokens: TextTokens, text: str
) -> None:
    """Minified code, base64, a long hash: one piece for the pre-tokenizer, where harmony's own
    tokenizer takes time growing with the square of its length
    (devkit/notes/benchmarks-history.md)."""
    assert text_tokens.encode(text) == encoding.encode(text, disallowed_special=())


def test_a_text_during_the_build_waits_for_it(vocab_dir: Path, encoding: HarmonyEncoding) -> None:
    """Right after start the encoder is still being built: the text waits for it rather than
    going to harmony's tokenizer."""

    def reference(text: str) -> list[int]:
        return encoding.encode(text, disallowed_special=())

    tokens = TextTokens(ensure_vocab_dir(vocab_dir) / VOCAB_FILE, reference)
    assert tokens.encode("Hello there") == reference("Hello there")


SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>"]
WITH_SPECIALS = st.lists(TEXTS | st.sampled_from(SPECIALS), max_size=8).map("".join)


@generated(200)
@given(text=WITH_SPECIALS, allow=st.booleans())
def test_a_raw_prompt_is_encoded_as_harmony_encodes_it(
    encoding: HarmonyEncoding, text_tokens: TextTokens, text: str, allow: bool
) -> None:
    """/v1/completions' text prompts: special tokens' names become the tokens where allowed,
    and are refused (harmony's error) where not."""
    try:
        expected = encoding.encode(text, allowed_special="all" if allow else set())
    except HarmonyError:
        with pytest.raises(HarmonyError):
            encode_text(encoding, text, allow)
        return
    assert encode_text(encoding, text, allow) == expected


RUN = st.text(
    alphabet=st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc", "Cs")),
    min_size=256,
    max_size=1200,
)


def _head_with(place: str, text: str) -> Transcript:
    """A transcript whose head holds `text` at `place` (and ordinary texts elsewhere)."""
    prop: dict[str, object] = {"type": "string", "description": "A query."}
    schema: dict[str, object] = {"type": "object", "properties": {"q": prop}, "required": ["q"]}
    spec = ToolSpec("lookup", description="Looks things up.", parameters=schema)
    response_format = None
    instructions = "Be brief."
    if place == "instructions":
        instructions = text
    elif place == "tool description":
        spec = dataclasses.replace(spec, description=text)
    elif place == "namespace description":
        spec = dataclasses.replace(spec, namespace="search", namespace_description=text)
    elif place in ("description", "title", "default", "const"):
        prop[place] = text
    elif place in ("enum", "examples"):
        prop[place] = ["plain", text]
    elif place == "items description":
        prop.update(type="array", items={"type": "string", "description": text})
    elif place == "anyOf description":
        schema["properties"] = {"q": {"anyOf": [{"type": "string", "description": text}]}}
    elif place == "response format description":
        response_format = ResponseFormat("json_schema", "answer", {"type": "object"}, text)
    else:  # a response format's schema: its strings are JSON-escaped there
        assert place == "response format schema"
        answer = {"type": "object", "properties": {"a": {"type": "string", "enum": [text]}}}
        response_format = ResponseFormat("json_schema", "answer", answer)
    return Transcript(
        items=(UserMessage("hi"),),
        instructions=instructions,
        tools=(spec,),
        reasoning_effort="low",
        response_format=response_format,
    )


HEAD_PLACES = [
    "instructions",
    "tool description",
    "namespace description",
    "description",
    "title",
    "default",
    "const",
    "enum",
    "examples",
    "items description",
    "anyOf description",
    "response format description",
    "response format schema",
]


@pytest.mark.parametrize("place", HEAD_PLACES)
@generated(8)
@given(before=TEXTS, run=RUN, after=TEXTS)
def test_a_head_with_a_long_run_renders_as_harmony_renders_it(
    encoding: HarmonyEncoding,
    text_tokens: TextTokens,
    monkeypatch: pytest.MonkeyPatch,
    *,
    before: str,
    run: str,
    after: str,
    place: str,
) -> None:
    """A long run without spaces anywhere in the system and developer messages' texts is
    rendered by harmony as a placeholder and put back into the message's text, which tiktoken
    tokenizes: the same tokens as harmony's render of the whole head, and harmony never
    renders (so never tokenizes) the run itself — where a text does not show in the render at
    all (a constant, an array's items), harmony renders it as given, and it does not show."""
    transcript = _head_with(place, f"{before} {run} {after}")
    expected = render(encoding, transcript)
    rendered: list[str] = []

    def seen(encoding: HarmonyEncoding, transcript: Transcript) -> list[int]:
        tokens = head_tokens(encoding, transcript)
        rendered.append(encoding.decode_utf8(tokens))
        return tokens

    with monkeypatch.context() as patch:
        patch.setattr(renderer_module, "head_tokens", seen)
        assert Renderer(encoding, text_tokens).render(transcript) == expected
    assert rendered
    assert not any(run in text for text in rendered)


@pytest.mark.parametrize("place", HEAD_PLACES)
def test_a_head_that_holds_the_mark_is_harmonys_render(
    encoding: HarmonyEncoding, text_tokens: TextTokens, place: str
) -> None:
    """A head whose texts hold the placeholders' mark (as the character, or as the JSON escape
    a response format's schema would write) is harmony's render as it is, even where the mark
    spells a placeholder."""
    for mark in ("\ue000", "\\ue000"):
        text = f"{mark}0{mark} {'x' * 300}"  # the run's placeholder would be the text's first
        transcript = _head_with(place, text)
        assert Renderer(encoding, text_tokens).render(transcript) == render(encoding, transcript)


def test_codexs_head_with_a_long_run_renders_as_harmony_renders_it(
    encoding: HarmonyEncoding, text_tokens: TextTokens
) -> None:
    body = json.loads((Path(__file__).parents[2] / "data/codex/exec_round2.json").read_text())
    tools = to_tools(body["tools"])
    first = body["input"][0]["content"]
    instructions = first[0]["text"] if isinstance(first, list) else first
    long_run = "x" * 3000 + "=" * 500 + "é" * 300
    transcript = Transcript(
        items=(UserMessage("hi"),),
        instructions=f"{instructions}\nkey: {long_run}\n",
        tools=tools,
    )
    renderer = Renderer(encoding, text_tokens)
    assert renderer.render(transcript) == render(encoding, transcript)


@pytest.mark.parametrize(
    ("place", "levels"),
    [("description", 40), ("response format schema", 400)],  # harmony's JSON stops at 128
)
def test_a_schema_nested_deeper_than_the_search_renders_as_harmony_renders_it(
    encoding: HarmonyEncoding, text_tokens: TextTokens, place: str, levels: int
) -> None:
    """Runs are looked for down to a depth (a deeper schema is left to harmony as it is, and
    the request's checks refuse one too deep): nothing recurses without end on the way."""
    transcript = _head_with(place, f"{'x' * 300} deep")
    deep: dict[str, object] = {"type": "string", "description": "y" * 300}
    for _ in range(levels):
        deep = {"type": "object", "properties": {"a": deep}}
    if transcript.response_format is not None:
        response_format = dataclasses.replace(transcript.response_format, schema=deep)
        transcript = dataclasses.replace(transcript, response_format=response_format)
    else:
        (spec,) = transcript.tools
        transcript = dataclasses.replace(
            transcript, tools=(dataclasses.replace(spec, parameters=deep),)
        )
    assert Renderer(encoding, text_tokens).render(transcript) == render(encoding, transcript)

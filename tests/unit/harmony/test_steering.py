"""HarmonySteering: which tokens each request allows, token by token."""

from __future__ import annotations

import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.directives import Allow, Constrain, Force
from server.contracts.events import SegmentKind
from server.contracts.transcript import ToolChoice
from server.harmony.steering import _encode_all, builtin_recipients, plan_steering
from server.harmony.tokens import CALL, END, MESSAGE, RETURN, SPECIALS, START

RECIPIENTS = ["functions.get_weather", "functions.get_time", "agents.spawn"]


def tokens(encoding: HarmonyEncoding, text: str) -> list[int]:
    return encoding.encode(text, allowed_special="all")


def walk(encoding: HarmonyEncoding, choice: ToolChoice, text: str, **kwargs: object):  # type: ignore[no-untyped-def]
    """Feed `text` through a fresh steering; returns it (or fails if a token was not allowed)."""
    steering = plan_steering(encoding, RECIPIENTS, choice, **kwargs).start()  # type: ignore[arg-type]
    for token in tokens(encoding, text):
        directive = steering.next()
        if isinstance(directive, Allow):
            assert token in directive.tokens, encoding.decode_utf8([token])
        steering.accept(token)
    return steering


def allowed_texts(encoding: HarmonyEncoding, directive: object) -> set[str]:
    assert isinstance(directive, Allow)
    return {encoding.decode_utf8([t]) for t in directive.tokens}


def test_auto_allows_every_channel_and_offered_tool(encoding: HarmonyEncoding) -> None:
    steering = walk(encoding, ToolChoice(), "<|channel|>")
    assert allowed_texts(encoding, steering.next()) == {"analysis", "final", "comment"}
    for header in (
        "<|channel|>analysis<|message|>",
        "<|channel|>commentary<|message|>",
        "<|channel|>final<|message|>",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
        "<|channel|>commentary to=agents.spawn<|message|>",
        " to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>",
    ):
        steering = walk(encoding, ToolChoice(), header)
        assert isinstance(steering.next(), Constrain)
        assert not steering.left_grammar


def test_content_bans_structure_and_the_wrong_terminators(encoding: HarmonyEncoding) -> None:
    cases = {
        "<|channel|>analysis<|message|>": END,
        "<|channel|>final<|message|>": RETURN,
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>": CALL,
    }
    for header, terminator in cases.items():
        directive = walk(encoding, ToolChoice(), header).next()
        assert isinstance(directive, Constrain)
        assert directive.banned == SPECIALS - {terminator}


def test_none_offers_no_tool_headers(encoding: HarmonyEncoding) -> None:
    root = plan_steering(encoding, RECIPIENTS, ToolChoice(mode="none")).start().next()
    assert allowed_texts(encoding, root) == {"<|channel|>"}
    steering = walk(encoding, ToolChoice(mode="none"), "<|channel|>")
    assert allowed_texts(encoding, steering.next()) == {"analysis", "final"}


def test_required_offers_no_final_answer(encoding: HarmonyEncoding) -> None:
    steering = walk(encoding, ToolChoice(mode="required"), "<|channel|>")
    assert allowed_texts(encoding, steering.next()) == {"analysis", "comment"}


def test_named_choice_allows_only_that_recipient(encoding: HarmonyEncoding) -> None:
    choice = ToolChoice(mode="named", name="get_time")
    steering = walk(encoding, choice, "<|channel|>commentary to=functions.get")
    assert allowed_texts(encoding, steering.next()) == {"_time"}
    steering.accept(tokens(encoding, "_weather")[0])
    assert steering.left_grammar


def test_between_messages_only_start_assistant(encoding: HarmonyEncoding) -> None:
    steering = walk(encoding, ToolChoice(), "<|channel|>analysis<|message|>hmm<|end|>")
    assert steering.next() == Allow((START,))
    steering.accept(START)
    assert allowed_texts(encoding, steering.next()) == {"assistant"}


def test_budget_forces_the_final_header(encoding: HarmonyEncoding) -> None:
    steering = walk(
        encoding, ToolChoice(), "<|channel|>analysis<|message|>one two three", reasoning_budget=3
    )
    forced = steering.next()
    assert isinstance(forced, Force)
    assert encoding.decode_utf8(list(forced.tokens)) == (
        "<|end|><|start|>assistant<|channel|>final<|message|>"
    )
    for token in forced.tokens:
        steering.accept(token)
    final = steering.next()
    assert isinstance(final, Constrain)
    assert RETURN not in final.banned


def test_budget_with_required_tool_forces_a_call_header(encoding: HarmonyEncoding) -> None:
    steering = walk(
        encoding,
        ToolChoice(mode="required"),
        "<|channel|>analysis<|message|>a b",
        reasoning_budget=2,
    )
    forced = steering.next()
    assert isinstance(forced, Force)
    assert encoding.decode_utf8(list(forced.tokens)) == "<|end|><|start|>assistant"
    for token in forced.tokens:
        steering.accept(token)
    steering.accept(tokens(encoding, "<|channel|>")[0])
    # no more reasoning once the budget is spent: only a tool call can follow, on either channel
    assert allowed_texts(encoding, steering.next()) == {"comment", "analysis"}
    steering.accept(tokens(encoding, "analysis")[0])
    assert allowed_texts(encoding, steering.next()) == {" to"}


def test_final_grammar_is_attached_to_the_answer_only(encoding: HarmonyEncoding) -> None:
    plan = plan_steering(encoding, [], ToolChoice(), final_grammar='root ::= "{}"')
    assert [kind for kind, rule in plan.content.items() if rule.grammar] == [SegmentKind.FINAL]
    steering = walk(
        encoding, ToolChoice(), "<|channel|>final<|message|>", final_grammar='root ::= "{}"'
    )
    directive = steering.next()
    assert isinstance(directive, Constrain)
    assert directive.grammar == 'root ::= "{}"'


def test_requests_of_one_shape_share_a_plan_and_walk_it_independently(
    encoding: HarmonyEncoding,
) -> None:
    plan = plan_steering(encoding, RECIPIENTS, ToolChoice())
    assert plan_steering(encoding, list(RECIPIENTS), ToolChoice()) is plan
    assert plan_steering(encoding, RECIPIENTS[:1], ToolChoice()) is not plan
    assert plan_steering(encoding, RECIPIENTS, ToolChoice(mode="none")) is not plan
    first, second = plan.start(), plan.start()
    for token in tokens(encoding, "<|channel|>final<|message|>"):
        first.next()
        first.accept(token)
    assert isinstance(first.next(), Constrain)
    assert allowed_texts(encoding, second.next()) == {"<|channel|>", " to"}  # at its start
    for token in tokens(encoding, "<|channel|>"):
        second.accept(token)
    assert allowed_texts(encoding, second.next()) == {"analysis", "final", "comment"}


def refused(encoding: HarmonyEncoding, choice: ToolChoice, text: str, **kwargs: object) -> bool:
    """Whether steering refuses some token of `text` (and then switches itself off)."""
    steering = plan_steering(encoding, RECIPIENTS, choice, **kwargs).start()  # type: ignore[arg-type]
    outside = False
    for token in tokens(encoding, text):
        directive = steering.next()
        outside = outside or (isinstance(directive, Allow) and token not in directive.tokens)
        steering.accept(token)
    assert steering.left_grammar == outside
    return outside


@pytest.mark.parametrize(
    "choice", [ToolChoice(mode="required"), ToolChoice(mode="named", name="get_time")]
)
def test_forced_call_allows_reasoning_then_only_the_call(
    encoding: HarmonyEncoding, choice: ToolChoice
) -> None:
    # reasoning stays allowed; a preamble (commentary without recipient) does not, at the first
    # header or after the reasoning: the next message is the call
    reasoning = "<|channel|>analysis<|message|>think<|end|><|start|>assistant"
    assert not refused(encoding, choice, reasoning)
    for before in ("", reasoning):
        assert refused(encoding, choice, before + "<|channel|>commentary<|message|>")
        steering = walk(encoding, choice, before + "<|channel|>commentary")
        directive = steering.next()
        assert isinstance(directive, Allow)
        assert MESSAGE not in directive.tokens
        call = before + "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"
        assert not refused(encoding, choice, call)


def test_auto_still_allows_a_preamble(encoding: HarmonyEncoding) -> None:
    assert not refused(encoding, ToolChoice(), "<|channel|>commentary<|message|>Checking.<|end|>")


# Header forms real gpt-oss outputs show (pasted in llama.cpp, LM Studio, vLLM, SGLang reports)
REAL_CALL_HEADERS = [
    "<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>",
    "<|channel|>analysis to=functions.get_weather <|constrain|>json<|message|>",
    "<|channel|>analysis to=functions.get_weather<|constrain|>json<|message|>",
    "<|channel|>analysis to=functions.get_weather<|message|>",
    "<|channel|>commentary to=functions.get_weather code<|message|>",
    "<|channel|>commentary to=functions.get_weather json<|message|>",
    "<|channel|>analysis to=functions.get_weather json<|message|>",
    " to=functions.get_weather<|channel|>commentary json<|message|>",
    " to=functions.get_weather<|channel|>commentary<|constrain|>json<|message|>",
    " to=functions.get_weather<|channel|>analysis code<|message|>",
]


@pytest.mark.parametrize("header", REAL_CALL_HEADERS)
@pytest.mark.parametrize("choice", [ToolChoice(), ToolChoice(mode="required")])
def test_real_call_header_forms_are_allowed(
    encoding: HarmonyEncoding, header: str, choice: ToolChoice
) -> None:
    for text in (header, f"<|channel|>analysis<|message|>a<|end|><|start|>assistant{header}"):
        assert not refused(encoding, choice, text)
        directive = walk(encoding, choice, text).next()
        assert isinstance(directive, Constrain)  # a call's content: ends only with <|call|>
        assert directive.banned == SPECIALS - {CALL}


JSON_GRAMMAR = {"functions.get_weather": 'root ::= "{}"'}


@pytest.mark.parametrize("header", REAL_CALL_HEADERS)
def test_every_call_form_carries_the_tools_grammar(encoding: HarmonyEncoding, header: str) -> None:
    directive = walk(encoding, ToolChoice(), header, call_grammars=JSON_GRAMMAR).next()
    assert isinstance(directive, Constrain)
    assert directive.grammar == JSON_GRAMMAR["functions.get_weather"]
    assert directive.banned == SPECIALS - {CALL}


@pytest.mark.parametrize(
    "text",
    [
        # no <|message|> before the content or the terminator
        "<|channel|>commentary to=functions.get_weather<|constrain|>json{}",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|call|>",
        "<|channel|>analysis to=functions.get_weather<|end|>",
        # text in the header
        "<|channel|>commentary to=functions.get_weather hello<|message|>",
        "<|channel|>analysis thinking to=functions.get_weather<|message|>",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json then<|message|>",
        # a second <|channel|>
        "<|channel|>commentary to=functions.get_weather<|channel|>analysis<|message|>",
        "<|channel|>analysis to=functions.get_weather <|constrain|>json<|channel|>commentary",
        # a tool nobody offered, a content type nobody writes
        "<|channel|>analysis to=functions.nope<|message|>",
        "<|channel|>commentary to=functions.get_weather yaml<|message|>",
    ],
)
def test_malformed_headers_are_refused(encoding: HarmonyEncoding, text: str) -> None:
    assert refused(encoding, ToolChoice(), text)


def test_headers_are_encoded_as_the_encoding_encodes_them(encoding: HarmonyEncoding) -> None:
    # the plan encodes the text between special tokens once per distinct piece
    texts = [
        header.replace("get_weather", name)
        for header in REAL_CALL_HEADERS
        for name in ("get_weather", "x", "web_search_v2", "über_tool", "a.b")
    ]
    texts += ["<|channel|>analysis<|message|>", "<|channel|>final<|message|>"]
    assert _encode_all(encoding, texts) == [tokens(encoding, text) for text in texts]


def test_builtin_recipients_are_addressed_as_gpt_oss_was_trained(
    encoding: HarmonyEncoding,
) -> None:
    recipients = builtin_recipients(["python", "browser"])
    assert recipients == ["python", "browser.search", "browser.open", "browser.find"]
    steering = plan_steering(encoding, recipients, ToolChoice())
    for text in (
        "<|channel|>analysis to=python code<|message|>print(1)<|call|>",
        '<|channel|>analysis to=browser.search code<|message|>{"query":"x"}<|call|>',
        "<|channel|>commentary to=browser.find <|constrain|>json<|message|>{}<|call|>",
    ):
        walker = steering.start()
        for token in tokens(encoding, text):
            directive = walker.next()
            assert not isinstance(directive, Allow) or token in directive.tokens, text
            walker.accept(token)
        assert not walker.left_grammar
    assert refused(encoding, ToolChoice(), "<|channel|>analysis to=python code<|message|>")


def test_the_likely_header_is_the_reasoning_one_from_where_the_header_stands(
    encoding: HarmonyEncoding,
) -> None:
    """`likely` (what the engine may evaluate ahead with the prompt): the rest of
    `<|channel|>analysis<|message|>` from the header's position, nothing once the model left
    that path, in content, or under the trie left after a reasoning budget."""
    analysis, message = tokens(encoding, "analysis<|message|>")
    assert plan_steering(encoding, RECIPIENTS, ToolChoice()).start().likely() == tuple(
        tokens(encoding, "<|channel|>analysis<|message|>")
    )
    assert walk(encoding, ToolChoice(), "<|channel|>").likely() == (analysis, message)
    assert walk(encoding, ToolChoice(), "<|channel|>analysis").likely() == (message,)
    assert walk(encoding, ToolChoice(), "<|channel|>final").likely() == ()
    assert walk(encoding, ToolChoice(), "<|channel|>analysis<|message|>Hm").likely() == ()
    spent = walk(encoding, ToolChoice(), "<|channel|>analysis<|message|>Hm", reasoning_budget=1)
    budget = spent.next()  # the budget ends the reasoning: <|end|><|start|>assistant...
    assert isinstance(budget, Force)
    channel = tokens(encoding, "<|channel|>")[0]
    for token in budget.tokens[: budget.tokens.index(channel) + 1]:
        spent.accept(token)
    assert isinstance(spent.next(), Allow)  # in the header, under the trie after the budget
    assert spent.likely() == ()  # which has no reasoning header (analysis leads to calls only)


def test_reasoning_may_follow_reasoning_without_a_budget(encoding: HarmonyEncoding) -> None:
    steering = plan_steering(encoding, [], ToolChoice()).start()
    text = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>"
    for token in encoding.encode(text, allowed_special="all"):
        steering.accept(token)
    allowed = steering.next()
    assert isinstance(allowed, Allow)
    assert encoding.encode("analysis", allowed_special="all")[0] in allowed.tokens


def test_unknown_builtin_tools_have_no_recipients() -> None:
    assert builtin_recipients(["unknown", "python"]) == ["python"]

"""RawText: a raw generation's tokens -> text cut at stop strings, each token's logprob sent with
the text it starts (held back with a possible stop string's start, dropped after a cut)."""

from __future__ import annotations

import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.events import TokenLogprob
from server.core.raw import RawText
from server.harmony.token_bytes import TokenBytes

RETURN = 200002


@pytest.fixture(scope="module")
def vocab(encoding: HarmonyEncoding) -> TokenBytes:
    return TokenBytes.load(encoding)


def scored(tokens: list[int]) -> list[TokenLogprob | None]:
    return [TokenLogprob(token, -1.0) for token in tokens]


def test_a_possible_stop_holds_its_tokens_logprobs_until_it_is_not_one(
    encoding: HarmonyEncoding, vocab: TokenBytes
) -> None:
    text = RawText(vocab, [", b"], frozenset({RETURN}))
    first = encoding.encode("one,")
    delta = text.feed(first, scored(first))
    assert delta is not None
    assert delta.text == "one"
    assert [s.token for s in delta.logprobs] == first[:-1]  # "," waits with its text
    rest = [*encoding.encode(" c"), RETURN]
    delta = text.feed(rest, scored(rest))
    assert delta is not None
    assert delta.text == ", c"
    assert [s.token for s in delta.logprobs] == [first[-1], *rest[:-1]]
    end = text.finish()  # the stop token: no text, its logprob at the end
    assert end is not None
    assert (end.text, [s.token for s in end.logprobs]) == ("", [RETURN])
    assert text.text == "one, c"


def test_a_stop_string_drops_the_tokens_from_its_start_on(
    encoding: HarmonyEncoding, vocab: TokenBytes
) -> None:
    text = RawText(vocab, [", b"], frozenset({RETURN}))
    tokens = [*encoding.encode("👋 a, b c"), RETURN]
    delta = text.feed(tokens, scored(tokens))
    assert delta is not None
    assert delta.text == "👋 a"
    assert text.matched == ", b"
    kept = [s.token for s in delta.logprobs]
    assert kept == encoding.encode("👋 a")
    assert text.feed(tokens, scored(tokens)) is None
    assert text.finish() is None

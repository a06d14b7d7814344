"""The grammar sampler samples exactly from the grammar-masked distribution, and fast.

The vocabulary's prefix tree: walking it finds exactly the tokens a real llama.cpp grammar
accepts over the whole vocabulary, at every state along valid texts (JSON schema, Codex's
apply_patch Lark grammar, a regex, partial UTF-8 characters between tokens, and a negated
class with a non-ASCII member, where an unfinished character must not prune). The sampler: a
chi-square test on fixed logits (fixed seeds, significance
1e-4, tests/support/chi_square.py)
of its tokens against the masked distribution computed here over the whole vocabulary, with
the allowed set found by the walk, by rejection draws, and by both mixed; each case also shows
that it can fail (the same tokens against another temperature are rejected).
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np
import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.directives import Constrain
from server.contracts.transcript import ToolSpec
from server.engine.base import EngineConfig, SamplingParams
from server.engine.llama_context import BatchPart, LlamaContext
from server.engine.sampling import grammar_sampler
from server.engine.sampling.grammar_sampler import GrammarSampler
from server.engine.sampling.vocab_trie import (
    Descent,
    TrieBuild,
    VocabTrie,
    negates_non_ascii,
    vocab_trie,
)
from server.grammars.tools import call_grammar, custom_grammar
from server.harmony.tokens import CALL, SPECIALS
from tests.support.chi_square import goodness_of_fit
from tests.support.tool_schemas import REGEX, STRICT_SCHEMA, VALID_TRIP, codex_apply_patch

Ids = np.ndarray[Any, np.dtype[np.int32]]
PATCH = (
    "*** Begin Patch\n*** Add File: 龘/𝔘.txt\n+héllo wörld 𝔘𝔘 龘\n*** Update File: a.py\n"
    "@@ def f():\n-    return 1\n+    return '€'\n*** End Patch\n"
)
NON_ASCII_NEGATION = 'root ::= "\\"" [^"é]* "\\""'


@pytest.fixture(scope="module")
def ctx(tiny_gguf: Path) -> Iterator[LlamaContext]:
    context = LlamaContext(EngineConfig(model_path=str(tiny_gguf), n_ctx=256, n_threads=1))
    yield context
    context.close()


@pytest.fixture(scope="module")
def trie(ctx: LlamaContext) -> VocabTrie:
    return vocab_trie(ctx)


class Grammar:
    """A raw llama.cpp grammar sampler: checks candidate tokens, accepts tokens."""

    def __init__(self, ctx: LlamaContext, text: str) -> None:
        self._sampler = lc.llama_sampler_init_grammar(ctx.vocab, text.encode(), b"root")
        assert self._sampler, text
        self.n_vocab = ctx.info.n_vocab

    def check(self, ids: Ids) -> np.ndarray[Any, np.dtype[np.bool_]]:
        data = np.zeros(len(ids), dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        data["id"] = ids
        pointer = data.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        array = lc.llama_token_data_array(pointer, len(ids), -1, False)
        lc.llama_sampler_apply(self._sampler, ctypes.byref(array))
        accepted: np.ndarray[Any, np.dtype[np.bool_]] = np.isfinite(data["logit"])
        return accepted

    def everything_accepted(self) -> Ids:
        everything = np.arange(self.n_vocab, dtype=np.int32)
        accepted: Ids = everything[self.check(everything)]
        return accepted

    def accept(self, token: int) -> None:
        lc.llama_sampler_accept(self._sampler, token)

    def free(self) -> None:
        lc.llama_sampler_free(self._sampler)


def states(grammar: Grammar, tokens: list[int], n: int) -> Iterator[int]:
    """Walks the grammar through `tokens`, stopping at about `n` states spread along them;
    yields the index of the next token at each stop."""
    stops = set(np.linspace(0, len(tokens) - 1, min(n, len(tokens))).astype(int))
    for i, token in enumerate(tokens):
        if i in stops:
            yield i
        grammar.accept(token)


def _walked(trie: VocabTrie, grammar: Grammar, transparent: bool) -> set[int]:
    """What the walk finds, less the banned harmony specials (some are in the tree: their
    text is rendered as text)."""
    first = np.concatenate((trie.roots, trie.extras))
    walk = Descent(trie, grammar.check, transparent, first)
    return set(walk.finish().tolist()) - (SPECIALS - {CALL})


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _texts(encoding: HarmonyEncoding) -> dict[str, tuple[str, str]]:
    strict = call_grammar(ToolSpec("trip", parameters=STRICT_SCHEMA, strict=True))
    tool = codex_apply_patch()
    patch = custom_grammar("apply_patch", "lark", tool["format"]["definition"])
    regex = custom_grammar("r", "regex", REGEX)
    assert strict is not None
    assert patch is not None
    assert regex is not None
    trip = {**VALID_TRIP, "city": 'Zürich "龘"'}  # non-ASCII: states inside a character
    return {
        "strict-schema": (strict, _compact(trip)),
        "apply-patch": (patch, _compact({"input": PATCH})),
        "regex": (regex, _compact({"input": 'put a/b_1 "x y"\n'})),
        "non-ascii-negation": (NON_ASCII_NEGATION, '"𝔘 wörld 龘"'),
    }


def test_a_trie_built_in_slices_is_the_trie_built_at_once(
    ctx: LlamaContext, trie: VocabTrie
) -> None:
    """The idle engine builds the trie a slice at a time: the same arrays as one pass over the
    whole vocabulary, each step reading at most its slice of tokens."""
    sliced = TrieBuild(ctx.vocab, ctx.info.n_vocab, size=997)
    whole = TrieBuild(ctx.vocab, ctx.info.n_vocab, size=1 << 20).trie()
    members, n_vocab = len(trie.order), ctx.info.n_vocab
    assert not sliced.done
    built = sliced.trie()
    # every token read, the tree's members indexed, then placed, a slice a step; the sort
    assert sliced.done
    assert sliced.slices == -(-n_vocab // 997) + 2 * -(-members // 997) + 2
    for a, b in ((built, whole), (built, trie)):
        for field in ("order", "start", "incomplete", "extras"):
            x, y = getattr(a, field), getattr(b, field)
            assert x.dtype == y.dtype, field
            assert np.array_equal(x, y), field
    assert len(trie.extras) > 0
    assert members + len(trie.extras) == n_vocab


@pytest.mark.parametrize("case", ["strict-schema", "apply-patch", "regex", "non-ascii-negation"])
def test_walk_finds_exactly_the_accepted_tokens(
    ctx: LlamaContext, trie: VocabTrie, encoding: HarmonyEncoding, case: str
) -> None:
    text, valid = _texts(encoding)[case]
    transparent = negates_non_ascii(text)
    assert transparent == (case == "non-ascii-negation")
    tokens = encoding.encode(valid, allowed_special=set())
    grammar = Grammar(ctx, text)
    pruned_too_much = 0
    try:
        for i in states(grammar, tokens, 16):
            exact = set(grammar.everything_accepted().tolist()) - (SPECIALS - {CALL})
            assert tokens[i] in exact
            assert _walked(trie, grammar, transparent) == exact, (case, i)
            if transparent:  # without it, the unfinished lead byte of é would prune à
                pruned_too_much += _walked(trie, grammar, False) != exact
    finally:
        grammar.free()
    if transparent:
        assert pruned_too_much > 0


def test_walk_at_a_state_after_an_unfinished_character(
    ctx: LlamaContext, trie: VocabTrie, encoding: HarmonyEncoding
) -> None:
    """The previous token ended inside a UTF-8 character: only its continuations are accepted."""
    grammar = Grammar(ctx, NON_ASCII_NEGATION)
    lead = next(t for t in range(256) if ctx.token_text(t) and _piece(ctx, t) == b"\xf0")
    try:
        grammar.accept(encoding.encode('"', allowed_special=set())[0])
        grammar.accept(lead)
        exact = set(grammar.everything_accepted().tolist()) - (SPECIALS - {CALL})
        assert exact
        assert all(_piece(ctx, t)[0] & 0xC0 == 0x80 for t in exact)
        assert _walked(trie, grammar, True) == exact
    finally:
        grammar.free()


def _piece(ctx: LlamaContext, token: int) -> bytes:
    buffer = ctypes.create_string_buffer(256)
    size = lc.llama_token_to_piece(ctx.vocab, token, buffer, len(buffer), 0, False)
    return buffer.raw[: max(size, 0)]


def test_negated_classes_with_non_ascii_members_are_recognised() -> None:
    json_string = call_grammar(ToolSpec("f", parameters={"type": "object"}, strict=False))
    assert json_string is not None
    assert not negates_non_ascii(json_string)
    assert not negates_non_ascii(r'x ::= [^"\\\x7F\x00-\x1F] "é" [é]')
    for text in ("x ::= [^é]", r"x ::= [^\u00e9]", r"x ::= [^a\xe9]", r"x ::= [^\U0001D518]"):
        assert negates_non_ascii(text), text


DIGITS = "root ::= [0-9]+"
N_DRAWS = 6000


def _logits(ctx: LlamaContext, digits: Ids, bias: float) -> np.ndarray[Any, np.dtype[np.float32]]:
    rng = np.random.default_rng(11)
    logits = rng.normal(0.0, 1.5, ctx.info.n_vocab)
    logits[digits] += bias  # sets the digits' share of the unconstrained mass
    logits[CALL] = 5.0  # likely, but never allowed here: the grammar needs a digit first
    return logits.astype(np.float32)


def _masked(logits: np.ndarray[Any, Any], allowed: Ids, temperature: float) -> Any:
    x = np.full(len(logits), -np.inf)
    x[allowed] = logits[allowed].astype(np.float64) / temperature
    weights = np.exp(x - x.max())
    return weights / weights.sum()


@pytest.mark.parametrize(
    ("case", "bias", "walk_limit"),
    [("walk", 0.0, grammar_sampler.WALK_LIMIT), ("mixed", 1.5, 0), ("draws", 6.0, 0)],
)
def test_tokens_follow_the_masked_distribution(
    ctx: LlamaContext, monkeypatch: pytest.MonkeyPatch, case: str, bias: float, walk_limit: int
) -> None:
    monkeypatch.setattr(grammar_sampler, "WALK_LIMIT", walk_limit)
    grammar = Grammar(ctx, DIGITS)
    digits = grammar.everything_accepted()
    grammar.free()
    logits = _logits(ctx, digits, bias)
    params = SamplingParams(max_tokens=1, temperature=0.9, seed=3)
    constraint = Constrain(banned=SPECIALS - {CALL}, grammar=DIGITS)
    sampler = GrammarSampler(ctx, params, constraint, np.random.default_rng(params.seed))
    try:
        tokens = [sampler.choose(logits) for _ in range(N_DRAWS)]
    finally:
        sampler.free()
    assert set(tokens) <= set(digits.tolist())
    assert (sampler.drawn > 0) == (case != "walk")
    assert (sampler.masked > 0) == (case != "draws")  # mixed: both ways were taken
    stat, critical = goodness_of_fit(tokens, _masked(logits, digits, 0.9))
    assert stat < critical, f"{case}: chi-square {stat:.1f} >= {critical:.1f}"
    stat, critical = goodness_of_fit(tokens, _masked(logits, digits, 1.2))
    assert stat > critical, f"{case}: another temperature passed ({stat:.1f} < {critical:.1f})"


def test_greedy_and_top_k_go_through_llama_cpp_chain(ctx: LlamaContext) -> None:
    """Greedy takes the likeliest token the grammar allows (the likeliest of all is not a digit
    on random weights, so the chain's first pick is rejected and the allowed set is used);
    top-k keeps to the grammar too (<|call|> may end it after the first digit)."""
    grammar = Grammar(ctx, DIGITS)
    digits = grammar.everything_accepted()
    grammar.free()
    ctx.truncate(0, 0)
    index = ctx.decode([BatchPart(0, [200006, 17360, 200008, 12194], 0, True)])[0]
    logits = ctx.logits(index).copy()
    assert int(np.argmax(logits)) not in set(digits.tolist())
    constraint = Constrain(banned=SPECIALS - {CALL}, grammar=DIGITS)
    greedy_params = SamplingParams(max_tokens=1, temperature=0.0)
    greedy = GrammarSampler(ctx, greedy_params, constraint, np.random.default_rng())
    try:
        assert greedy.sample(index) == int(digits[np.argmax(logits[digits])])
        assert greedy.masked == 1
    finally:
        greedy.free()
    params = SamplingParams(max_tokens=4, temperature=1.0, top_k=20, seed=5)
    top_k = GrammarSampler(ctx, params, constraint, np.random.default_rng(params.seed))
    try:
        assert {top_k.sample(index) for _ in range(4)} <= set(digits.tolist()) | {CALL}
    finally:
        top_k.free()


ANY_TEXT = "root ::= [^\\x00-\\x1F]*"


@pytest.mark.parametrize("walk_limit", [0, grammar_sampler.WALK_LIMIT])
def test_a_character_left_unfinished_can_always_be_finished(
    ctx: LlamaContext, monkeypatch: pytest.MonkeyPatch, walk_limit: int
) -> None:
    """After a token that ends in ED (a three-byte character's lead), a next byte A0-BF would
    start a surrogate: Python's incremental decoder holds `ED B8` without an error and rejects
    every byte after it, so the grammar would allow no token and the generation would fail. The
    sampler goes on with a byte 80-9F instead, however likely the others are, and the text
    decodes."""
    monkeypatch.setattr(grammar_sampler, "WALK_LIMIT", walk_limit)
    byte = {_piece(ctx, t)[0]: t for t in range(256) if len(_piece(ctx, t)) == 1}
    ctx.truncate(0, 0)
    index = ctx.decode([BatchPart(0, [200006, 17360, 200008, 12194], 0, True)])[0]
    row = ctx.logits(index)  # the buffer the sampler reads, set here step by step
    params = SamplingParams(max_tokens=3, temperature=1.0, seed=4)
    constraint = Constrain(banned=SPECIALS - {CALL}, grammar=ANY_TEXT)
    sampler = GrammarSampler(ctx, params, constraint, np.random.default_rng(params.seed))
    text = b""
    try:
        for favoured in ([0xED], range(0xA0, 0xC0), range(0x80, 0xC0)):
            row[:] = -30.0
            row[[byte[b] for b in favoured]] = 30.0
            text += _piece(ctx, sampler.sample(index))
    finally:
        sampler.free()
    assert text[0] == 0xED, text
    assert 0x80 <= text[1] <= 0x9F, text
    assert "\ud000" <= text.decode("utf-8")[0] <= "\ud7ff"  # a whole character, no surrogate


def test_completable_knows_each_lead_bytes_second_byte() -> None:
    assert [grammar_sampler.completable(b) for b in (b"", b"\xed", b"\xed\x9f", b"\xc3\xa9")] == [
        True
    ] * 4
    assert not any(
        grammar_sampler.completable(b) for b in (b"\xed\xa0", b"\xe0\x9f", b"\xf0\x8f", b"\xf4\x90")
    )


@pytest.mark.parametrize("n_banned", [3, 40])
@pytest.mark.parametrize("walk_limit", [0, grammar_sampler.WALK_LIMIT])
def test_banned_tokens_the_grammar_allows_are_never_sampled(
    ctx: LlamaContext, monkeypatch: pytest.MonkeyPatch, n_banned: int, walk_limit: int
) -> None:
    monkeypatch.setattr(grammar_sampler, "WALK_LIMIT", walk_limit)
    grammar = Grammar(ctx, DIGITS)
    digits = grammar.everything_accepted()
    grammar.free()
    logits = _logits(ctx, digits, 6.0)
    likeliest = digits[np.argsort(logits[digits])[::-1][:n_banned]]
    banned = frozenset(int(t) for t in likeliest) | (SPECIALS - {CALL})
    params = SamplingParams(max_tokens=1, temperature=1.0, seed=8)
    constraint = Constrain(banned=banned, grammar=DIGITS)
    sampler = GrammarSampler(ctx, params, constraint, np.random.default_rng(params.seed))
    try:
        tokens = {sampler.choose(logits) for _ in range(300)}
    finally:
        sampler.free()
    assert tokens <= set(digits.tolist()) - banned

"""The statistical floors of the trained tiny gpt-oss's tests, measured on any GGUF.

Each floor counts, over a draw of held-out values fixed by a seed (greedy unless the floor says
otherwise, speculation off), how many items the model gets exactly right: the same count on
every run. The rule every floor follows:

    floor = COMMITTED (the committed model's count on the test's own fixed draw) - MARGIN

and the floor stays strictly above what the baseline that copies at most one item in ten
reaches (`Generations(copy_one_in=10)`: ⌈n/10⌉). Where the earlier model w1 (the parameters at
commit dd86a88) reaches the floor, devkit/notes/trained-model-runs.md says so beside its numbers.

    python -m devkit.floors [--gguf PATH] [--copy-one-in 10] [--only NAME ...]

serves PATH (default: the committed model) as the tests do and prints, per floor, its per-item
results (`1` right, `0` wrong, in draw order), the count, the floor and whether it holds, as JSON;
the exit status is 1 when one fails. `--params NPZ [--perturb SCALE] --write-gguf OUT` writes
the GGUF of other parameters (w1: `git show dd86a88:server/testing/trained/params.npz`), or of
the given ones with every layer weight perturbed by SCALE times its own spread (the exactness
control). The tests call the same functions on the committed model; the Claude Code floor is
measured by its test alone (tests/support/trained.py: GPT_OSS_TRAINED_GGUF and
GPT_OSS_TRAINED_COPY_ONE_IN serve another model or the baseline to the trained tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import anthropic
import numpy as np
from openai import OpenAI
from openai_harmony import HarmonyEncoding
from starlette.types import ASGIApp

from devkit.forced import ForcedScript
from devkit.models import TRAINED, cached_gguf
from devkit.serving import served
from devkit.train_tiny.behaviour import arguments_of
from devkit.train_tiny.corpus import Values, agent_tool
from devkit.trained import model as trained_model
from devkit.trained.tasks import CONVERSATION_DATE, MODEL_NAME
from devkit.trained.words import text_of, typed_words, word_pool
from server.app import create_app
from server.engine.base import EngineConfig, EngineResult, SamplingParams, TokenChooser
from server.engine.llama import LlamaEngine
from server.harmony.tokens import END, FIRST_SPECIAL, START
from server.ops.runtime import Runtime
from server.ops.settings import Settings

log = logging.getLogger(__name__)

USER = 1428  # `user`: the role after <|start|> (checked by the unit test)
MARGIN = 2  # items below the committed model's count on the test's own draw
BASELINE_ONE_IN = 10  # the baseline copies one item in this many


@dataclass(frozen=True)
class Floor:
    name: str
    items: int  # per draw
    committed: int  # the committed model's count on the test's fixed draw

    @property
    def least(self) -> int:
        """The floor: the committed model's count less MARGIN."""
        return self.committed - MARGIN

    @property
    def baseline(self) -> int:
        """The most the copy-one-in-ten baseline gets right (items 0, 10, ...)."""
        return math.ceil(self.items / BASELINE_ONE_IN)


FLOORS = {
    f.name: f
    for f in (
        Floor("named_choice", 12, 12),  # test_named_tool_choice_copies_the_argument
        Floor("loop_copied", 8, 8),  # test_chat_tool_loop_copies_the_argument_...
        Floor("loop_quoted", 8, 8),  # ... and_quotes_the_result
        Floor("seeded", 8, 6),  # test_seeded_sampling_copies_the_argument_...
        Floor("paths_chat", 10, 7),  # test_generic_tools_copy_drawn_paths_...
        Floor("paths_responses", 10, 7),
        Floor("paths_messages", 10, 7),
        Floor("claude_code", 6, 4),  # tests/e2e/test_trained_claude_code.py
        Floor("exact_runs", 18, 18),  # tests/engine/test_trained_model.py
    )
}


@dataclass
class Tally:
    """One floor's per-item results in draw order."""

    floor: Floor
    results: list[bool]

    @property
    def count(self) -> int:
        return sum(self.results)

    @property
    def holds(self) -> bool:
        return self.count >= self.floor.least

    def report(self) -> dict[str, Any]:
        return {
            "items": "".join("1" if r else "0" for r in self.results),
            "count": self.count,
            "of": len(self.results),
            "floor": self.floor.least,
            "committed": self.floor.committed,
            "holds": self.holds,
        }

    def __str__(self) -> str:
        r = self.report()
        return (
            f"{self.floor.name}: {r['count']} of {r['of']} (per item {r['items']}), "
            f"floor {r['floor']} (the committed model's {r['committed']} less {MARGIN})"
        )


def tally(name: str, results: Sequence[bool]) -> Tally:
    return Tally(FLOORS[name], list(results))


# ----------------------------------------------------------------------------- the sampling hook


@dataclass
class Generation:
    prompt: list[int]
    chosen: list[int] = field(default_factory=list)  # what the engine chose (steering's forced
    # tokens aside: the hook never sees those)
    spoiled: bool = False


class Generations(ForcedScript):
    """A ForcedScript (empty unless pushed) that also records every generation's chosen tokens.

    With `copy_one_in=n` it is the baseline that copies one item in n: an item is a distinct
    last user message, numbered in the order they first come; in every item but the 0th, nth,
    ... the tokens of the values the user asks for (found in the user's message only, not in a
    tool's name) are written as held-out words (`_spoil`)."""

    def __init__(self, encoding: HarmonyEncoding, copy_one_in: int | None = None) -> None:
        super().__init__(encoding)
        self.log: list[Generation] = []
        self._one_in = copy_one_in
        self._items: dict[tuple[int, ...], int] = {}
        held = set(word_pool(encoding)[1]) if copy_one_in else set()
        self._held_tokens = held_tokens(encoding, held)
        self._by_prefix: dict[str, list[int]] = {}
        for t, _ in sorted(self._held_tokens.items(), key=lambda tw: tw[1]):
            m = WORD.fullmatch(text_of(encoding, t))
            assert m is not None
            self._by_prefix.setdefault(m.group(1), []).append(t)

    def __call__(self, prompt_tokens: Sequence[int]) -> TokenChooser | None:
        forced = super().__call__(prompt_tokens)
        record = Generation(list(prompt_tokens))
        self.log.append(record)
        spoil = self._spoil(record.prompt)
        record.spoiled = bool(spoil)

        def choose(sampled: int) -> int:
            token = forced(sampled) if forced is not None else sampled
            token = spoil.get(token, token)
            record.chosen.append(token)
            return token

        return choose

    def _spoil(self, prompt: list[int]) -> dict[int, int]:
        """The swaps for this generation ({} where it copies): every word-shaped token (a
        prefix of ` _/.-` or none, then letters) that the user's message holds and the rest of
        the prompt does not, and every token of a held-out word found only there, each to a
        held-out word token with its prefix."""
        if self._one_in is None:
            return {}
        user, rest = last_user_message(prompt)
        key = tuple(user)
        item = self._items.setdefault(key, len(self._items))
        if item % self._one_in == 0:
            return {}
        text = self.encoding.decode(user)
        words = set(re.findall("[a-z]+", text)) - set(
            re.findall("[a-z]+", self.encoding.decode(rest))
        )
        own = set(user) - set(rest)
        out = {}
        for t in {*own, *(t for t, w in self._held_tokens.items() if w in words)}:
            m = WORD.fullmatch(text_of(self.encoding, t))
            group = self._by_prefix.get(m.group(1), []) if m else []
            other = next((u for u in group if u != t), None)
            if other is not None:
                out[t] = other
        return out


WORD = re.compile(r"([ _/.\-]?)([a-z]+)")


def held_tokens(encoding: HarmonyEncoding, held: set[str]) -> dict[int, str]:
    """Every token of a held-out word, bare or after one of ` _/.-`: its word."""
    out = {}
    for t in range(FIRST_SPECIAL):
        m = WORD.fullmatch(text_of(encoding, t))
        if m and m.group(2) in held:
            out[t] = m.group(2)
    return out


def last_user_message(prompt: list[int]) -> tuple[list[int], list[int]]:
    """The tokens of the prompt's last user message (from its `<|start|>` to its `<|end|>`),
    and the prompt's other tokens."""
    starts = [i for i, t in enumerate(prompt) if t == START and prompt[i + 1 : i + 2] == [USER]]
    if not starts:
        return [], prompt
    begin = starts[-1]
    end = next((i for i in range(begin, len(prompt)) if prompt[i] == END), len(prompt))
    return prompt[begin:end], prompt[:begin] + prompt[end:]


# ----------------------------------------------------------------------------- the server


@dataclass
class TrainedServer:
    url: str  # .../v1
    recorder: Any  # what `recorder` made of the app
    prompts: Generations  # records every generation; forces nothing unless pushed


@contextmanager
def trained_server(
    encoding: HarmonyEncoding,
    store_dir: Path,
    n_ctx: int,
    recorder: Callable[[ASGIApp], Any] = lambda app: app,
    *,
    gguf: Path | None = None,
    copy_one_in: int | None = None,
) -> Iterator[TrainedServer]:
    """The server on the trained model (or `gguf`), greedy by default, every conversation dated
    CONVERSATION_DATE, speculation off ("auto" decides from a timing at start: batch shapes
    move logit near-ties, so the output would depend on the machine's speed)."""
    logging.getLogger("llama_cpp").setLevel(logging.WARNING)
    hook = Generations(encoding, copy_one_in)
    model = gguf or cached_gguf(TRAINED)
    config = EngineConfig(model_path=str(model), n_ctx=n_ctx, n_threads=2, speculative="off")
    engine = LlamaEngine(config, sampling_hook=hook)
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL_NAME)
    settings = Settings(
        responses_store_path=store_dir / "responses.sqlite3",
        responses_keepalive_s=1.0,
        temperature=0.0,
        conversation_date=CONVERSATION_DATE,
    )
    app = recorder(create_app(settings, runtime))
    try:
        with served(app) as root:
            yield TrainedServer(f"{root}/v1", app, hook)
    finally:
        engine.close()


# ----------------------------------------------------------------------------- the agent floors


def string_tool(name: str, description: str, parameter: str) -> dict[str, Any]:
    """A function spec taking one required string."""
    return {
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {parameter: {"type": "string"}},
            "required": [parameter],
        },
    }


WEATHER = string_tool("get_weather", "Current weather for a city.", "city")
LOOKUP = string_tool("lookup_user", "Find a user by name.", "name")
NAMES_SEED, LOOPS_SEED, SEEDED_SEED = 2, 1, 3  # the draws' seeds
PATHS_SEED = 11


def held_out(encoding: HarmonyEncoding) -> list[str]:
    """Held-out words (the corpus never used them) that are words, not fragments."""
    return typed_words(encoding, word_pool(encoding)[1])


def held_out_words(pool: list[str], n: int, seed: int = 0) -> list[str]:
    return random.Random(seed).sample(pool, n)


def chat_tool(spec: dict[str, Any]) -> Any:
    return {"type": "function", "function": spec}


def messages_tool(spec: dict[str, Any]) -> dict[str, Any]:
    """A function spec as the Messages API's tool."""
    return {
        "name": spec["name"],
        "description": spec["description"],
        "input_schema": spec["parameters"],
    }


def named_lookup(sdk: OpenAI, name: str, **sampling: Any) -> str:
    """`Look up the user {name}.` with `tool_choice` naming lookup_user: the call's arguments."""
    answer = sdk.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": f"Look up the user {name}."}],
        tools=[chat_tool(WEATHER), chat_tool(LOOKUP)],
        tool_choice={"type": "function", "function": {"name": "lookup_user"}},
        max_tokens=300,
        **sampling,
    )
    (call,) = answer.choices[0].message.tool_calls or []  # a named choice always calls
    assert call.type == "function"
    assert call.function.name == "lookup_user"
    arguments: str = call.function.arguments
    return arguments


def exact_name(name: str) -> str:
    return json.dumps({"name": name}, separators=(",", ":"))


def named_choice(sdk: OpenAI, pool: list[str]) -> Tally:
    """Twelve held-out names through a named `tool_choice`: the call's arguments exactly
    `{"name":...}`."""
    names = held_out_words(pool, 12, seed=NAMES_SEED)
    return tally("named_choice", [named_lookup(sdk, n) == exact_name(n) for n in names])


def seeded(sdk: OpenAI, pool: list[str]) -> tuple[Tally, list[str]]:
    """Eight names sampled at temperature 0.7 with the seeds 0 to 7; also the arguments."""
    names = held_out_words(pool, 8, seed=SEEDED_SEED)
    got = [named_lookup(sdk, n, temperature=0.7, seed=s) for s, n in enumerate(names)]
    return tally("seeded", [a == exact_name(n) for a, n in zip(got, names, strict=True)]), got


def tool_loops(sdk: OpenAI, pool: list[str]) -> tuple[Tally, Tally]:
    """Eight weather loops: the call copies the city, then the answer quotes the tool's result
    as a word (a loop whose call does not copy is not asked for an answer)."""
    words = held_out_words(pool, 16, seed=LOOPS_SEED)
    tools = [chat_tool(WEATHER), chat_tool(LOOKUP)]
    copied: list[bool] = []
    quoted: list[bool] = []
    for city, result in zip(words[::2], words[1::2], strict=True):
        messages: list[Any] = [{"role": "user", "content": f"What is the weather in {city}?"}]
        first = sdk.chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=tools, max_tokens=300
        )
        calls = first.choices[0].message.tool_calls or []
        call = calls[0] if len(calls) == 1 else None
        ok = call is not None and call.type == "function"
        ok = ok and json.loads(call.function.arguments) == {"city": city}  # type: ignore[union-attr]
        copied.append(ok)
        if not ok or call is None:
            quoted.append(False)
            continue
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        second = sdk.chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=tools, max_tokens=300
        )
        answer = second.choices[0].message.content or ""
        quoted.append(
            second.choices[0].finish_reason == "stop"
            and bool(re.search(rf"\b{re.escape(result)}\b", answer))
        )
    return tally("loop_copied", copied), tally("loop_quoted", quoted)


class Ask(NamedTuple):
    tool: dict[str, Any]  # the generic tool, as a function spec
    text: str  # the user's message
    expected: dict[str, Any]  # the call's arguments: the value copied exactly


def drawn_asks(encoding: HarmonyEncoding, seed: int = PATHS_SEED, n: int = 10) -> list[Ask]:
    """Asks for a multi-token path or shell command through a generic tool (read_file, run, or
    a drawn name), in the corpus's wordings, with values drawn from the held-out words."""
    values = Values(random.Random(seed), word_pool(encoding)[1])
    asks = []
    for _ in range(n):
        spec, param, value, text = agent_tool(values, values.rng.choice(["path", "command"]))
        tool = {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
        asks.append(Ask(tool, text, {param: value}))
    return asks


def offered(ask: Ask) -> list[dict[str, Any]]:
    """The generic tool between two others."""
    return [WEATHER, ask.tool, LOOKUP]


def chat_copy(sdk: OpenAI, ask: Ask) -> Any:
    """The arguments of the call to the asked tool (None: no such single call)."""
    answer = sdk.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": ask.text}],
        tools=[chat_tool(t) for t in offered(ask)],
        max_tokens=300,
    )
    calls = answer.choices[0].message.tool_calls or []
    name = ask.tool["name"]
    if len(calls) != 1 or calls[0].type != "function" or calls[0].function.name != name:
        return None
    return arguments_of(calls[0].function.arguments)


def responses_copy(sdk: OpenAI, ask: Ask) -> Any:
    tools: list[Any] = [{"type": "function", **t} for t in offered(ask)]
    response = sdk.responses.create(
        model=MODEL_NAME, input=ask.text, tools=tools, max_output_tokens=300
    )
    calls = [item for item in response.output if item.type == "function_call"]
    if len(calls) != 1 or calls[0].name != ask.tool["name"]:
        return None
    return arguments_of(calls[0].arguments)


def messages_copy(client: anthropic.Anthropic, ask: Ask) -> Any:
    tools: list[Any] = [messages_tool(t) for t in offered(ask)]
    message = client.messages.create(
        model=MODEL_NAME,
        max_tokens=300,
        messages=[{"role": "user", "content": ask.text}],
        tools=tools,
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    if len(uses) != 1 or uses[0].name != ask.tool["name"]:
        return None
    return uses[0].input


APIS = ("chat", "responses", "messages")


@dataclass
class Paths:
    tallies: dict[str, Tally]  # per API
    generations: dict[str, list[Generation]]  # per API, one per ask, in draw order

    def parting(self, encoding: HarmonyEncoding) -> str | None:
        """Where the APIs' generations first part (prompt or chosen tokens), in words; None
        when every ask's are the same tokens on the three."""
        for i, runs in enumerate(zip(*(self.generations[api] for api in APIS), strict=True)):
            for part in ("prompt", "chosen"):
                first: list[int] = getattr(runs[0], part)
                for api, run in zip(APIS[1:], runs[1:], strict=True):
                    other: list[int] = getattr(run, part)
                    if other != first:
                        at = first_difference(first, other)
                        return (
                            f"ask {i}: the {part} tokens of chat and {api} part at {at}: "
                            f"...{encoding.decode(first[max(0, at - 8) : at])!r} then "
                            f"{encoding.decode(first[at : at + 8])!r} against "
                            f"{encoding.decode(other[at : at + 8])!r}"
                        )
        return None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where a and b differ (the shorter one's length where one is a prefix)."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def paths(
    sdk: OpenAI,
    messages_sdk: anthropic.Anthropic,
    encoding: HarmonyEncoding,
    hook: Generations,
    apis: Sequence[str] = APIS,
) -> Paths:
    """The drawn asks through each API in turn: a single call to the asked tool with its
    value exactly; each ask's one generation recorded."""
    copiers: dict[str, Callable[[Ask], Any]] = {
        "chat": lambda ask: chat_copy(sdk, ask),
        "responses": lambda ask: responses_copy(sdk, ask),
        "messages": lambda ask: messages_copy(messages_sdk, ask),
    }
    asks = drawn_asks(encoding)
    tallies, generations = {}, {}
    for api in apis:
        copy = copiers[api]
        results, runs = [], []
        for ask in asks:
            before = len(hook.log)
            results.append(copy(ask) == ask.expected)
            (run,) = hook.log[before:]  # one generation per ask
            runs.append(run)
        tallies[api] = tally(f"paths_{api}", results)
        generations[api] = runs
    return Paths(tallies, generations)


# ----------------------------------------------------------------------------- exactness

STOPS = frozenset({200002, 200012})  # <|return|>, <|call|>
NEAR_TIE = 0.05  # logits: the training model's top two closer than this may come out swapped


@dataclass
class Exactness:
    runs: Tally  # per reference run: llama.cpp wrote its tokens exactly
    real_differences: list[tuple[int, int, float]]  # (prompt length, first diff, margin)
    tokens_agreed: float  # of the reference tokens: before a difference not at a near-tie


def greedy(engine: LlamaEngine, prompt: Sequence[int], n: int) -> list[int]:
    async def collect() -> tuple[list[int], EngineResult]:
        stream = engine.submit(prompt, SamplingParams(n, temperature=0.0, stop_tokens=STOPS))
        return [t async for chunk in stream for t in chunk], stream.result

    tokens, _ = asyncio.run(collect())
    return tokens


def exactness(engine: LlamaEngine) -> Exactness:
    """Greedy on every reference prompt: whether llama.cpp writes the training model's tokens
    (every one), and where it parts from them other than at a near-tie (the training model's
    top two logits closer than NEAR_TIE, or a token of one of its routers' near-ties)."""
    reference = trained_model.load_reference()
    same: list[bool] = []
    real_differences = []
    agreed_tokens = total_tokens = 0
    for run in reference:
        expected = run.tokens
        got = greedy(engine, run.prompt, len(expected))
        same.append(got == expected)
        total_tokens += len(expected)
        first_diff = first_difference(got, expected)
        agreed = first_diff
        if got != expected:
            margin = run.margins[first_diff] if first_diff < len(run.margins) else 0.0
            routed = first_diff < len(got) and got[first_diff] in run.alternatives[first_diff]
            if margin < NEAR_TIE or routed:  # either token is right there
                agreed = len(expected)
            else:
                real_differences.append((len(run.prompt), first_diff, margin))
            log.info("prompt of %d tokens: parted at %d of %d, margin %.4f%s",
                     len(run.prompt), first_diff, len(expected), margin,
                     ", a routing near-tie's token" if routed else "")  # fmt: skip
        agreed_tokens += agreed
    return Exactness(tally("exact_runs", same), real_differences, agreed_tokens / total_tokens)


def reference_engine(gguf: Path) -> LlamaEngine:
    """An engine for the reference prompts (up to ≈8k tokens), speculation off."""
    config = EngineConfig(model_path=str(gguf), n_ctx=16384, n_threads=2, speculative="off")
    return LlamaEngine(config)


def perturbed_params(params_path: Path, scale: float, seed: int = 0) -> dict[str, Any]:
    """The parameters with every float layer weight w moved by scale·std(w)·N(0, 1)."""
    params = trained_model.load_params(params_path)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for key, value in params.items():
        out[key] = value
        if key.startswith("blk.") and value.dtype.kind == "f" and value.size > 1:
            weights = value.astype(np.float32)
            noise = rng.standard_normal(value.shape).astype(np.float32)
            out[key] = (weights + scale * float(weights.std()) * noise).astype(value.dtype)
    return out


def write_gguf(out: Path, params_path: Path, perturb: float = 0.0) -> None:
    if not perturb:
        trained_model.write_gguf(out, params_path)
        return
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "params.npz"
        np.savez(npz, **perturbed_params(params_path, perturb))  # type: ignore[arg-type]
        trained_model.write_gguf(out, npz)


# ----------------------------------------------------------------------------- the command


def measure(
    encoding: HarmonyEncoding, gguf: Path | None, copy_one_in: int | None, only: set[str]
) -> Iterator[Tally | dict[str, Any]]:
    """Every floor but claude_code (tests/e2e/test_trained_claude_code.py runs the CLI) on
    the model at `gguf`, in the tests' order, each as it is measured; with them what the
    path asks' and the reference runs' comparisons found."""
    pool = held_out(encoding)

    def wanted(*names: str) -> bool:
        return not only or bool(only & set(names))

    if wanted(
        "named_choice", "loop_copied", "loop_quoted", "seeded", *(f"paths_{a}" for a in APIS)
    ):
        with (
            tempfile.TemporaryDirectory() as store,
            trained_server(encoding, Path(store), 4096, gguf=gguf, copy_one_in=copy_one_in) as s,
        ):
            sdk = OpenAI(base_url=s.url, api_key="unused", max_retries=0, timeout=3600)
            messages_sdk = anthropic.Anthropic(
                base_url=s.url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=3600
            )
            if wanted("named_choice"):
                yield named_choice(sdk, pool)
            if wanted("loop_copied", "loop_quoted"):
                yield from tool_loops(sdk, pool)
            if wanted("seeded"):
                yield seeded(sdk, pool)[0]
            if wanted(*(f"paths_{a}" for a in APIS)):
                apis = [a for a in APIS if wanted(f"paths_{a}")]
                found = paths(sdk, messages_sdk, encoding, s.prompts, apis)
                yield from found.tallies.values()
                if len(apis) == len(APIS):
                    parting = found.parting(encoding)
                    yield {"apis_agree": parting is None, "parting": parting}
    if wanted("exact_runs") and copy_one_in is None:
        engine = reference_engine(gguf or cached_gguf(TRAINED))
        try:
            exact = exactness(engine)
        finally:
            engine.close()
        yield exact.runs
        yield {"real_differences": exact.real_differences}


def main(argv: Sequence[str] | None = None) -> int:
    from devkit.train_tiny.corpus import encoding

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gguf", type=Path, help="the model (default: the committed one)")
    parser.add_argument("--copy-one-in", type=int, help="the baseline: spoil all items but 1 in N")
    parser.add_argument("--only", nargs="*", default=[], choices=sorted(FLOORS))
    parser.add_argument("--params", type=Path, help="with --write-gguf: the parameters")
    parser.add_argument("--perturb", type=float, default=0.0, help="with --write-gguf")
    parser.add_argument("--write-gguf", type=Path, help="write the GGUF of --params and exit")
    args = parser.parse_args(argv)
    if args.write_gguf:
        write_gguf(args.write_gguf, args.params or trained_model.PARAMS, args.perturb)
        return 0
    held = True
    for found in measure(encoding(), args.gguf, args.copy_one_in, set(args.only)):
        if isinstance(found, Tally):
            held = held and found.holds
            print(json.dumps({"name": found.floor.name, **found.report()}), flush=True)
        else:
            print(json.dumps(found), flush=True)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())

"""Plan: this step's batch, decided from the running jobs and the budgets alone (plain data in
and out; no llama.cpp, no job, no scheduler).

The batch holds the pending token(s) of every generating job, each followed by its `Extra`
tokens, then a chunk of the prompt of the oldest job still being prefilled (a small chunk while
others generate, so their streams keep flowing). What a job carries after its pending tokens is
one of three kinds, all verified alike by the pick (apply.py: kept while the model picks them,
their cells dropped from the first miss):

- DRAFT: what its drafter proposes (speculative/), within the draft's room;
- REPEAT: the batch-invariant mode's one-token guess (`repeat_guess`);
- HEADER: after the prompt's last chunk and its lead (the tokens the steering forces before the
  model's first choice, evaluated with the prompt when they fit), the header the model most
  likely writes first: its first pick and the next come from the prefill's logits while they
  match, a step fewer to the first text for each token guessed right.

A batch that carries drafts fits one ubatch: llama.cpp places a later ubatch's cells after the
earlier ones advanced each sequence, and in the sliding-window layers a cell is free once it
falls out of its sequence's window as of that advance; a prefill chunk placed after a drafting
sequence's drafts could take cells that sequence's window needs again once its rejected drafts
are dropped (`draft_room`).

Where backend sampling is on (Budgets.backend), each generating row's next pick is drawn by
its sequence's chain inside the graph when it is plain free text (Row.backend, the job's
picker tells) and carries no extra: such a row is offered no draft (its draws then follow the
directives alone, the same seed giving the same tokens run to run), and its chain is kept
while its free text goes on. A pick that needs the logits (a header's allowed set, a grammar,
drafts to verify, a prompt's end) takes the chain off; a step whose pick needs nothing (the
steering forces it) leaves it as it is (`Planned.backend`).

A prompt chunk ends at the next save point when the disk cache is on (the state saved is the
prompt's alone), and holds at most `PROMPT_LOGPROBS_CHUNK` tokens when every position keeps its
logits (a request for the prompt's own logprobs). In the batch-invariant mode each part is a
llama_decode of its own: a prompt is chunked at multiples of the prefill chunk from its first
token whatever else runs, a drafting job has the ubatch to itself, and every part keeps two
rows of logits at least (`repeat_guess`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from server.engine.base import BatchPart

PROMPT_LOGPROBS_CHUNK = 64  # prompt tokens per step when each keeps its logits (n_vocab floats)


class Kind(Enum):
    """What the tokens a job carries after its pending ones are."""

    DRAFT = 1  # its drafter's proposal: the verify settles with the drafter
    REPEAT = 2  # the batch-invariant mode's repeat of its one pending token
    HEADER = 3  # the likely header after the prompt and its lead


@dataclass(frozen=True, slots=True)
class Extra:
    """Tokens evaluated after a job's pending ones (or its prompt's last chunk), to be verified."""

    kind: Kind
    tokens: tuple[int, ...]


@dataclass(slots=True)
class Row:
    """What the plan reads of one running job (read only)."""

    seq_id: int
    held: int  # tokens its sequence holds (evaluated)
    pending: tuple[int, ...] = ()  # emitted, not evaluated yet
    prompt: Sequence[int] = ()
    next_prompt: int = 0  # index of the next prompt token to evaluate
    lead: tuple[int, ...] = ()  # forced before the model's first choice
    guess: tuple[int, ...] = ()  # the likely header after the lead
    save_points: tuple[int, ...] = ()  # prompt lengths a chunk ends at (the disk cache on)
    prompt_logprobs: bool = False  # every prompt position keeps its logits
    remaining: int = 0  # tokens it may still emit (max_tokens less those emitted)
    # its next pick: True free text the backend may draw, False the host's logits, None forced
    backend: bool | None = False

    @property
    def prefilling(self) -> bool:
        return self.next_prompt < len(self.prompt)


@dataclass(frozen=True, slots=True)
class Budgets:
    """The limits a step's batch keeps to."""

    n_batch: int  # tokens per batch
    n_ubatch: int  # tokens per ubatch
    n_ctx: int  # tokens per sequence
    prefill_chunk: int  # prompt tokens per step while others generate (invariant: chunk size)
    invariant: bool = False  # the batch-invariant mode
    save_points: bool = False  # chunks end at save points (the disk cache is on)
    backend: bool = False  # free text drawn by the sequences' backend chains


@dataclass(frozen=True, slots=True)
class Planned:
    """One part of the batch: which row it is of, and what it carries after its pending tokens."""

    row: int  # index in the rows planned
    part: BatchPart
    extra: Extra | None = None
    # its chain set (True), taken off (False), left as it is (None; always, backend sampling off)
    backend: bool | None = None


Propose = Callable[[int, int], tuple[int, ...]]  # (row, at most this many tokens) -> its draft


def decide(rows: Sequence[Row], budgets: Budgets, propose: Propose) -> list[Planned]:
    """This step's batch: every generating row's pending tokens and extra, then a chunk of the
    oldest prefill. `propose` is asked for a generating row's draft where it has room."""
    planned: list[Planned] = []
    generating = [i for i, row in enumerate(rows) if row.pending]
    prefill = next((i for i, row in enumerate(rows) if row.prefilling), None)
    pending = sum(len(rows[i].pending) for i in generating)
    budget = budgets.n_batch - pending
    shared_room = draft_room(budgets.n_ubatch, pending, prefilling=prefill is not None)
    drafting = False
    for i in generating:
        row = rows[i]
        # decoded alone, a row's draft has the ubatch to itself
        room = budgets.n_ubatch - len(row.pending) if budgets.invariant else shared_room
        on_backend = budgets.backend and not budgets.invariant and row.backend is True
        extra = None if on_backend else _extra(i, row, room, budgets, propose)
        n_extra = len(extra.tokens) if extra is not None else 0
        drafting = drafting or n_extra > 0
        shared_room -= n_extra
        budget -= n_extra
        tokens = (*row.pending, *extra.tokens) if extra is not None else row.pending
        outputs = 1 + n_extra
        if budgets.invariant:  # two rows at least: see repeat_guess
            outputs = min(len(tokens), max(2, outputs))
        backend = _backend(on_backend, row, extra) if budgets.backend else None
        part = BatchPart(row.seq_id, tokens, row.held, True, outputs)
        planned.append(Planned(i, part, extra, backend))
    if drafting and not budgets.invariant:
        used = sum(len(p.part.tokens) for p in planned)
        budget = min(budget, budgets.n_ubatch - used)
    if prefill is not None and (budget > 0 or budgets.invariant):
        planned.append(_chunk(prefill, rows[prefill], budgets, budget, beside=bool(planned)))
    return planned


def _backend(on_backend: bool, row: Row, extra: Extra | None) -> bool | None:
    """A generating row's chain this step: set where its pick is drawn on the backend, taken
    off where the pick reads the logits (its extra's verify, or a pick on the host), left as
    it is where the steering forces the next token."""
    if on_backend:
        return True
    if extra is not None or row.backend is not None:
        return False
    return None


def _extra(index: int, row: Row, room: int, budgets: Budgets, propose: Propose) -> Extra | None:
    """A generating row's draft (never past its room, the context or the tokens still allowed),
    else in the invariant mode the repeat of a lone pending token."""
    if room > 0:
        limit = min(room, budgets.n_ctx - 1 - row.held - len(row.pending), row.remaining - 1)
        draft = propose(index, limit)
        if draft:
            return Extra(Kind.DRAFT, draft)
    if budgets.invariant and len(row.pending) == 1:
        guess = repeat_guess(row, budgets.n_ctx)
        if guess:
            return Extra(Kind.REPEAT, guess)
    return None


def _chunk(index: int, row: Row, budgets: Budgets, budget: int, *, beside: bool) -> Planned:
    """The next chunk of a prefill (`beside`: other rows run in the batch), with the lead and
    the likely header after the prompt's last chunk where they fit."""
    start = row.next_prompt
    if budgets.invariant:  # chunk boundaries at multiples of the chunk, whatever else runs
        size = min(budgets.prefill_chunk, budgets.n_batch)
        cap = size - start % size
    else:
        cap = min(budget, budgets.prefill_chunk) if beside else budget
    if budgets.save_points:  # end the chunk at the next save point
        cap = min([cap, *(p - start for p in row.save_points if p > start)])
    if row.prompt_logprobs:
        cap = min(cap, PROMPT_LOGPROBS_CHUNK)
    chunk = row.prompt[start : start + cap]
    last = start + len(chunk) == len(row.prompt)
    # the lead after the prompt's last chunk, when it fits (a save point at the prompt's end
    # caps the chunk there: the state saved is the prompt's alone)
    outputs, extra = 1, None
    if last and len(row.lead) <= cap - len(chunk):
        chunk = [*chunk, *row.lead]
        # and the likely header after it, within the chunk and the context
        room = budgets.n_ctx - 1 - len(row.prompt) - len(row.lead)
        guess = row.guess[: max(0, min(cap - len(chunk), room))]
        if guess:
            chunk = [*chunk, *guess]
            extra, outputs = Extra(Kind.HEADER, guess), 1 + len(guess)
    part = BatchPart(row.seq_id, chunk, start, last, outputs, all_logits=row.prompt_logprobs)
    # the pick after a prompt (a header) and a prompt's own logprobs read the logits
    backend = False if budgets.backend and (last or row.prompt_logprobs) else None
    return Planned(index, part, extra, backend)


def repeat_guess(row: Row, n_ctx: int) -> tuple[int, ...]:
    """The batch-invariant mode's one-token draft, when a step would evaluate one token.

    llama.cpp's CPU kernels compute a row alike in any batch of two rows or more, but take
    another path for one row (a matrix-vector product; measured on the trained tiny model:
    logits up to 0.15 apart), and the model's last layer runs on the rows whose logits are
    kept. So every step of a generation keeps two rows at least: one token alone is followed
    by a guess (its own repeat), verified as any draft — kept when the model picks it — and
    otherwise rolled back. With speculation on or off, every token is then computed the same
    way, and the two give the same tokens. No guess at the end of the context."""
    if row.held + len(row.pending) + 1 >= n_ctx:
        return ()
    return row.pending[-1:]


def draft_room(n_ubatch: int, pending: int, *, prefilling: bool) -> int:
    """How many drafted tokens this step's batch may carry: the batch stays within one ubatch,
    so llama.cpp places every cell of it before any of its positions advance (the module's
    docstring); with a prefill waiting, half the ubatch stays for its chunk."""
    return (n_ubatch // 2 if prefilling else n_ubatch) - pending


def without_extra(part: BatchPart, extra: Extra | None) -> BatchPart:
    """The part without its extra tokens (the cache has no room for them): a generating job's
    pending tokens, or a prompt's last chunk and its lead."""
    if extra is None:
        return part
    tokens = part.tokens[: len(part.tokens) - len(extra.tokens)]
    return BatchPart(part.seq_id, tokens, part.start_pos, part.logits, 1, part.all_logits)

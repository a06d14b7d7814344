"""The step's plan on plain data: chunked prefill under the token budget, drafts within one
ubatch, the lead and the guessed header after the prompt, the batch-invariant mode's chunks and
two-row minimum, several jobs at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from server.engine.base import BatchPart
from server.engine.plan import (
    PROMPT_LOGPROBS_CHUNK,
    Budgets,
    Extra,
    Kind,
    Planned,
    Propose,
    Row,
    decide,
    draft_room,
    repeat_guess,
    without_extra,
)

BUDGETS = Budgets(n_batch=64, n_ubatch=16, n_ctx=256, prefill_chunk=8)
INVARIANT = Budgets(n_batch=64, n_ubatch=16, n_ctx=256, prefill_chunk=8, invariant=True)
PROMPT = list(range(100, 140))  # 40 tokens


def no_drafts(row: int, limit: int) -> tuple[int, ...]:
    return ()


def drafts(
    proposals: dict[int, tuple[int, ...]], asked: list[tuple[int, int]] | None = None
) -> Propose:
    """A drafter that proposes each row's tokens, cut at the limit it is given."""

    def propose(row: int, limit: int) -> tuple[int, ...]:
        if asked is not None:
            asked.append((row, limit))
        return proposals.get(row, ())[: max(limit, 0)]

    return propose


def prefill(seq_id: int = 0, **fields: object) -> Row:
    row = Row(seq_id, held=0, prompt=PROMPT, remaining=100)
    for name, value in fields.items():
        setattr(row, name, value)
    return row


def generating(seq_id: int, pending: tuple[int, ...], held: int = 50, remaining: int = 100) -> Row:
    prompt = list(range(held))
    return Row(seq_id, held, pending, prompt, len(prompt), remaining=remaining)


def test_a_prefill_alone_takes_the_whole_batch_budget() -> None:
    budgets = Budgets(n_batch=16, n_ubatch=16, n_ctx=256, prefill_chunk=4)
    (planned,) = decide([prefill()], budgets, no_drafts)
    assert planned == Planned(0, BatchPart(0, PROMPT[:16], 0, False, 1))


def test_a_prefill_beside_generating_jobs_takes_a_chunk_of_what_they_leave() -> None:
    rows = [prefill(0, next_prompt=10), generating(1, (7,)), generating(2, (8, 9))]
    first, second, chunk = decide(rows, BUDGETS, no_drafts)
    assert first == Planned(1, BatchPart(1, (7,), 50, True, 1))
    assert second == Planned(2, BatchPart(2, (8, 9), 50, True, 1))
    assert chunk.row == 0
    assert chunk.part == BatchPart(0, PROMPT[10:18], 10, False, 1)  # prefill_chunk tokens
    tight = Budgets(n_batch=8, n_ubatch=8, n_ctx=256, prefill_chunk=8)
    *_, chunk = decide(rows, tight, no_drafts)
    assert len(chunk.part.tokens) == 8 - 3  # the batch less the pending tokens


def test_no_budget_left_means_no_prefill_this_step() -> None:
    budgets = Budgets(n_batch=2, n_ubatch=2, n_ctx=256, prefill_chunk=8)
    planned = decide([prefill(0), generating(1, (7, 8))], budgets, no_drafts)
    assert [p.row for p in planned] == [1]


def test_only_the_oldest_prefill_runs() -> None:
    planned = decide([prefill(0), prefill(1)], BUDGETS, no_drafts)
    assert [p.row for p in planned] == [0]


def test_the_last_chunk_carries_the_lead_and_the_guessed_header() -> None:
    row = prefill(0, next_prompt=36, lead=(1,), guess=(2, 3, 4))
    (planned,) = decide([row], BUDGETS, no_drafts)
    assert planned.part == BatchPart(0, [*PROMPT[36:], 1, 2, 3, 4], 36, True, 4)
    assert planned.extra == Extra(Kind.HEADER, (2, 3, 4))


def test_a_lead_that_does_not_fit_waits_and_the_guess_with_it() -> None:
    budgets = Budgets(n_batch=4, n_ubatch=4, n_ctx=256, prefill_chunk=4)
    row = prefill(0, next_prompt=36, lead=(1,), guess=(2,))
    (planned,) = decide([row], budgets, no_drafts)
    assert planned.part == BatchPart(0, PROMPT[36:], 36, True, 1)
    assert planned.extra is None


def test_the_guess_is_cut_to_the_chunk_and_the_context() -> None:
    budgets = Budgets(n_batch=6, n_ubatch=6, n_ctx=256, prefill_chunk=6)
    row = prefill(0, next_prompt=36, lead=(1,), guess=(2, 3, 4))
    (planned,) = decide([row], budgets, no_drafts)
    assert planned.extra == Extra(Kind.HEADER, (2,))
    near_the_end = Budgets(n_batch=64, n_ubatch=64, n_ctx=43, prefill_chunk=8)
    (planned,) = decide([row], near_the_end, no_drafts)
    assert planned.extra == Extra(Kind.HEADER, (2,))  # 43 - 1 - 40 prompt - 1 lead


def test_chunks_end_at_save_points_only_with_the_disk_cache() -> None:
    row = prefill(0, save_points=(5, 30))
    (planned,) = decide([row], BUDGETS, no_drafts)
    assert len(planned.part.tokens) == 40
    saving = Budgets(n_batch=64, n_ubatch=16, n_ctx=256, prefill_chunk=8, save_points=True)
    (planned,) = decide([row], saving, no_drafts)
    assert planned.part.tokens == PROMPT[:5]
    row.next_prompt = 5
    (planned,) = decide([row], saving, no_drafts)
    assert planned.part.tokens == PROMPT[5:30]


def test_a_save_point_at_the_prompts_end_leaves_the_lead_out() -> None:
    saving = Budgets(n_batch=64, n_ubatch=16, n_ctx=256, prefill_chunk=8, save_points=True)
    row = prefill(0, next_prompt=30, save_points=(40,), lead=(1,), guess=(2,))
    (planned,) = decide([row], saving, no_drafts)
    assert planned.part == BatchPart(0, PROMPT[30:], 30, True, 1)
    assert planned.extra is None


def test_prompt_logprobs_keep_every_logit_in_short_chunks() -> None:
    budgets = Budgets(n_batch=512, n_ubatch=512, n_ctx=1024, prefill_chunk=512)
    prompt = list(range(200))
    row = Row(0, 0, prompt=prompt, prompt_logprobs=True, lead=(1,), remaining=1)
    (planned,) = decide([row], budgets, no_drafts)
    assert planned.part == BatchPart(0, prompt[:PROMPT_LOGPROBS_CHUNK], 0, False, 1, True)


def test_drafts_share_one_ubatch_and_leave_half_of_it_for_a_prefill() -> None:
    asked: list[tuple[int, int]] = []
    propose = drafts({0: tuple(range(20)), 1: tuple(range(20))}, asked)
    rows = [generating(1, (7,)), generating(2, (8,)), prefill(3)]
    first, second, chunk = decide(rows, BUDGETS, propose)
    room = draft_room(16, 2, prefilling=True)
    assert room == 6
    assert asked == [(0, 6)]  # the second job has no room left
    assert first.extra == Extra(Kind.DRAFT, tuple(range(6)))
    assert first.part == BatchPart(1, (7, *range(6)), 50, True, 7)
    assert second.extra is None
    assert second.part == BatchPart(2, (8,), 50, True, 1)
    # the batch that carries drafts fits the ubatch: the chunk takes what is left of it
    assert sum(len(p.part.tokens) for p in (first, second, chunk)) == 16


def test_a_draft_never_runs_past_the_context_or_the_tokens_left() -> None:
    asked: list[tuple[int, int]] = []
    propose = drafts({0: tuple(range(20))}, asked)
    decide([generating(0, (7,), held=250)], BUDGETS, propose)
    decide([generating(0, (7,), remaining=4)], BUDGETS, propose)
    assert asked == [(0, 256 - 1 - 250 - 1), (0, 3)]


def test_invariant_prefill_chunks_sit_at_multiples_of_the_chunk() -> None:
    rows = [generating(1, (7, 8)), prefill(0, next_prompt=5)]
    _, chunk = decide(rows, INVARIANT, no_drafts)
    assert chunk.part == BatchPart(0, PROMPT[5:8], 5, False, 1)
    (chunk,) = decide([prefill(0, next_prompt=8)], INVARIANT, no_drafts)
    assert chunk.part.tokens == PROMPT[8:16]  # not the whole budget: the chunk's size


def test_invariant_steps_keep_two_rows_a_lone_token_repeated() -> None:
    (planned,) = decide([generating(0, (7,))], INVARIANT, no_drafts)
    assert planned.extra == Extra(Kind.REPEAT, (7,))
    assert planned.part == BatchPart(0, (7, 7), 50, True, 2)
    (planned,) = decide([generating(0, (7, 8))], INVARIANT, no_drafts)
    assert planned.extra is None
    assert planned.part == BatchPart(0, (7, 8), 50, True, 2)  # two rows, no guess needed
    (planned,) = decide([generating(0, (7,), held=254)], INVARIANT, no_drafts)
    assert planned.extra is None  # no guess at the end of the context
    assert planned.part == BatchPart(0, (7,), 254, True, 1)


def test_invariant_drafts_have_the_ubatch_each() -> None:
    asked: list[tuple[int, int]] = []
    propose = drafts({0: (1, 2), 1: (3,)}, asked)
    rows = [generating(5, (7,)), generating(6, (8,)), prefill(7)]
    first, second, _ = decide(rows, INVARIANT, propose)
    assert asked == [(0, 15), (1, 15)]
    assert first.extra == Extra(Kind.DRAFT, (1, 2))
    assert second.part == BatchPart(6, (8, 3), 50, True, 2)


def test_without_extra_keeps_the_pending_tokens_and_one_output() -> None:
    part = BatchPart(0, (7, 1, 2), 50, True, 3)
    assert without_extra(part, Extra(Kind.DRAFT, (1, 2))) == BatchPart(0, (7,), 50, True, 1)
    assert without_extra(part, None) is part


@given(
    pending=st.lists(st.integers(1, 3), max_size=6),
    proposals=st.lists(st.integers(0, 12), max_size=6),
    n_ubatch=st.integers(4, 32),
    prefilling=st.booleans(),
    invariant=st.booleans(),
)
def test_every_part_fits_its_limits(
    pending: list[int], proposals: list[int], n_ubatch: int, prefilling: bool, invariant: bool
) -> None:
    """Whatever the jobs: each job at most once, outputs within each part's tokens; outside the
    invariant mode a prefill chunk only within n_batch, and a batch that carries drafts within
    one ubatch."""
    budgets = Budgets(n_ubatch * 2, n_ubatch, n_ctx=512, prefill_chunk=8, invariant=invariant)
    rows = [generating(i, tuple(range(n))) for i, n in enumerate(pending)]
    if prefilling:
        rows.append(prefill(len(rows)))
    tokens = {i: tuple(range(100, 100 + n)) for i, n in enumerate(proposals)}
    planned = decide(rows, budgets, drafts(tokens))
    assert len({p.row for p in planned}) == len(planned)
    for p in planned:
        assert 0 < p.part.outputs <= len(p.part.tokens)
        assert p.part.seq_id == rows[p.row].seq_id
    if not invariant:
        total = sum(len(p.part.tokens) for p in planned)
        assert total <= max(budgets.n_batch, sum(pending))
        if any(p.extra is not None for p in planned):
            assert total <= budgets.n_ubatch


# Each case below pins one boundary of the plan (`python -m devkit.mutation --module plan`).
WIDE = Budgets(n_batch=64, n_ubatch=16, n_ctx=256, prefill_chunk=32)


def test_a_draft_keeps_the_prefill_chunk_within_the_ubatch() -> None:
    for proposal, chunk in (((1, 2, 3), 16 - 4), ((1,), 16 - 2), ((), 32)):
        rows = [prefill(0), generating(1, (7,))]
        *_, planned = decide(rows, WIDE, drafts({1: proposal}))
        # drafting: the batch stays within one ubatch; else the chunk is the prefill's own
        assert len(planned.part.tokens) == chunk, proposal


def test_a_draft_of_one_token_uses_the_last_place_of_the_ubatch() -> None:
    budgets = Budgets(n_batch=64, n_ubatch=16, n_ctx=256, prefill_chunk=8)
    (planned,) = decide([generating(0, tuple(range(15)))], budgets, drafts({0: (1, 2)}))
    assert planned.extra == Extra(Kind.DRAFT, (1,))


def test_a_budget_of_one_token_still_prefills_one() -> None:
    budgets = Budgets(n_batch=2, n_ubatch=2, n_ctx=256, prefill_chunk=8)
    _, chunk = decide([prefill(0), generating(1, (7,))], budgets, no_drafts)
    assert chunk.part.tokens == PROMPT[:1]


def test_the_room_for_drafts_is_halved_only_beside_a_prefill() -> None:
    assert draft_room(16, 1, prefilling=False) == 15
    assert draft_room(16, 1, prefilling=True) == 7


def test_the_invariant_mode_keeps_two_outputs_of_several_pending_tokens() -> None:
    (planned,) = decide([generating(0, (7, 8, 9))], INVARIANT, no_drafts)
    assert planned.part.outputs == 2


def test_the_repeat_guess_stops_one_token_before_the_context_ends() -> None:
    n_ctx = 256
    assert repeat_guess(generating(0, (5,), held=n_ctx - 3), n_ctx) == (5,)
    assert repeat_guess(generating(0, (5,), held=n_ctx - 2), n_ctx) == ()


def test_a_lead_that_exactly_fills_the_chunk_goes_in_and_no_guess_after_it() -> None:
    budgets = Budgets(n_batch=6, n_ubatch=6, n_ctx=256, prefill_chunk=8)
    row = prefill(0, next_prompt=36, lead=(1, 2), guess=(9, 9))
    (planned,) = decide([row], budgets, no_drafts)
    assert list(planned.part.tokens) == [*PROMPT[36:], 1, 2]
    assert planned.extra is None
    assert planned.part.outputs == 1


def test_without_extra_keeps_every_logit_a_prompt_asked_for() -> None:
    part = BatchPart(0, (1, 2, 3), 5, True, 3, all_logits=True)
    assert without_extra(part, Extra(Kind.DRAFT, (2, 3))) == BatchPart(0, (1,), 5, True, 1, True)


BACKEND = Budgets(n_batch=64, n_ubatch=16, n_ctx=256, prefill_chunk=8, backend=True)


def on_backend(seq_id: int, pending: tuple[int, ...], backend: bool | None) -> Row:
    row = generating(seq_id, pending)
    row.backend = backend
    return row


def test_backend_sampling_off_leaves_every_chain_alone() -> None:
    rows = [prefill(0), on_backend(1, (7,), True), on_backend(2, (8,), False)]
    assert [p.backend for p in decide(rows, BUDGETS, no_drafts)] == [None, None, None]


def test_free_text_goes_to_the_backend_and_is_offered_no_draft() -> None:
    asked: list[tuple[int, int]] = []
    propose = drafts({0: (1, 2, 3), 1: (4, 5)}, asked)
    rows = [on_backend(0, (7,), True), on_backend(1, (8,), False), on_backend(2, (9,), None)]
    free, host, forced = decide(rows, BACKEND, propose)
    assert free == Planned(0, BatchPart(0, (7,), 50, True, 1), None, True)
    assert [row for row, _ in asked] == [1, 2]  # the free-text row is never asked
    assert host.extra == Extra(Kind.DRAFT, (4, 5))
    assert host.backend is False
    assert forced.extra is None
    assert forced.backend is None


def test_a_draft_takes_the_chain_off_where_the_pick_needed_none() -> None:
    (planned,) = decide([on_backend(0, (7,), None)], BACKEND, drafts({0: (1, 2)}))
    assert planned.extra == Extra(Kind.DRAFT, (1, 2))
    assert planned.backend is False  # the verify reads the logits at each drafted position


def test_the_invariant_mode_never_samples_on_the_backend() -> None:
    invariant = Budgets(n_batch=64, n_ubatch=16, n_ctx=256, prefill_chunk=8, invariant=True)
    invariant_backend = Budgets(
        n_batch=64, n_ubatch=16, n_ctx=256, prefill_chunk=8, invariant=True, backend=True
    )
    (planned,) = decide([on_backend(0, (7,), True)], invariant_backend, no_drafts)
    assert planned.backend is False
    assert planned.extra == decide([on_backend(0, (7,), True)], invariant, no_drafts)[0].extra


def test_a_prompts_last_chunk_takes_the_chain_off_and_others_leave_it() -> None:
    budgets = Budgets(n_batch=16, n_ubatch=16, n_ctx=256, prefill_chunk=16, backend=True)
    (first,) = decide([prefill(0)], budgets, no_drafts)
    assert first.backend is None  # no logits kept: nothing to decide
    (last,) = decide([prefill(0, next_prompt=32)], budgets, no_drafts)
    assert last.part.logits
    assert last.backend is False
    (scored,) = decide([prefill(0, prompt_logprobs=True)], budgets, no_drafts)
    assert scored.backend is False  # every position's logits


@given(
    st.lists(st.tuples(st.sampled_from([True, False, None]), st.booleans()), min_size=1, max_size=4)
)
def test_a_row_on_the_backend_carries_no_extra_and_keeps_one_output(
    shapes: list[tuple[bool | None, bool]],
) -> None:
    rows = [on_backend(i, (7 + i,), backend) for i, (backend, _) in enumerate(shapes)]
    proposals: dict[int, tuple[int, ...]] = {
        i: (1, 2) for i, (_, offered) in enumerate(shapes) if offered
    }
    for planned in decide(rows, BACKEND, drafts(proposals)):
        backend = shapes[planned.row][0]
        if planned.backend is True:
            assert backend is True
            assert planned.extra is None
            assert planned.part.outputs == 1
        elif planned.extra is not None:
            assert planned.backend is False  # logits read at the drafted positions
        else:
            assert planned.backend is (False if backend is False else None)

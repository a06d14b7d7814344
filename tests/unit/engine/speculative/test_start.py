"""`start_speculation` with `auto`: a start-up curve on which no draft pays (timed on a loaded
machine, say) keeps speculation on, the steps' own times deciding; batch-invariant, whose
drafts are weighed on that curve alone, it is off."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from server.engine.base import BatchPart, EngineConfig
from server.engine.speculative import verify_cost
from server.engine.speculative.draft_length import VerifyCost

HOPELESS = VerifyCost((1.0, *(9.0 + k for k in range(16))))  # one drafted row: 10 plain steps


class Context:
    """A context with no sliding window; the timing is replaced, so nothing is decoded."""

    n_swa = 0

    def decode(self, parts: Sequence[BatchPart]) -> list[int]:
        raise AssertionError("not timed here")

    def logits(self, index: int) -> Any:
        raise AssertionError("not timed here")

    def truncate(self, seq_id: int, n_keep: int) -> int:
        raise AssertionError("not timed here")


@pytest.fixture
def hopeless(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_cost, "measure_verify_cost", lambda *a, **k: (HOPELESS, {}))


@pytest.mark.usefixtures("hopeless")
def test_a_curve_on_which_no_draft_pays_keeps_auto_on() -> None:
    assert not HOPELESS.pays()
    speculator = verify_cost.start_speculation(Context(), EngineConfig(model_path="x"))
    assert speculator is not None
    assert speculator.timed
    assert speculator.controller.measured == HOPELESS


@pytest.mark.usefixtures("hopeless")
def test_batch_invariant_on_a_curve_on_which_no_draft_pays_is_off() -> None:
    config = EngineConfig(model_path="x", batch_invariant=True)
    assert verify_cost.start_speculation(Context(), config) is None

"""Which requests and directives the backend chain serves, and what `auto` decides."""

from __future__ import annotations

import pytest

from server.contracts.directives import Allow, Constrain, Force
from server.engine.base import SamplingParams
from server.engine.sampling.backend_chain import eligible_directive, eligible_params, resolve

PLAIN = SamplingParams(max_tokens=8)


def test_plain_temperature_alone_is_served() -> None:
    assert eligible_params(PLAIN)
    assert eligible_params(SamplingParams(max_tokens=8, temperature=0.0, seed=3))
    for other in (
        SamplingParams(max_tokens=8, logprobs=0),
        SamplingParams(max_tokens=8, prompt_logprobs=True),
        SamplingParams(max_tokens=8, top_k=40),
        SamplingParams(max_tokens=8, top_p=0.9),
        SamplingParams(max_tokens=8, min_p=0.05),
    ):
        assert not eligible_params(other), other


def test_free_text_is_no_directive_or_banned_tokens_alone() -> None:
    assert eligible_directive(None)
    assert eligible_directive(Constrain(banned=frozenset({1, 2})))
    assert not eligible_directive(Constrain(grammar='root ::= "a"'))
    assert not eligible_directive(Allow((1, 2, 3)))
    assert not eligible_directive(Force((1,)))


@pytest.mark.parametrize(
    ("mode", "on_gpu", "speculative", "expected"),
    [
        ("on", False, "auto", True),
        ("off", True, "off", False),
        ("auto", False, "off", False),  # the CPU: measured slower
        ("auto", True, "off", True),  # a GPU, no drafts: measured faster
        ("auto", True, "auto", False),  # a GPU with speculation: unmeasured
    ],
)
def test_auto_is_on_only_where_it_measured_faster(
    mode: str, on_gpu: bool, speculative: str, expected: bool
) -> None:
    assert resolve(mode, output_on_gpu=on_gpu, speculative=speculative) is expected


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="sometimes"):
        resolve("sometimes", output_on_gpu=True, speculative="off")

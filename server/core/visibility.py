"""Visibility: who may see the chain of thought, the one place that decides it.

The server's policy (--reasoning-visibility raw | summary | none), the summary a request asks
for and a request's `exclude` become one ReasoningView: whether this response shows the raw
reasoning, and in which style its reasoning is summarized (server.core.summaries makes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SummaryStyle = Literal["auto", "concise", "detailed"]
ReasoningVisibility = Literal["raw", "summary", "none"]


@dataclass(frozen=True, slots=True)
class ReasoningView:
    """What of the model's reasoning one response shows."""

    raw: bool  # the raw chain of thought
    summary: SummaryStyle | None  # summaries are generated and shown in this style

    @property
    def any(self) -> bool:
        return self.raw or self.summary is not None


def resolve_view(
    visibility: ReasoningVisibility, requested: SummaryStyle | None, *, exclude: bool = False
) -> ReasoningView:
    """The server policy applied to a request.

    `raw` shows the chain of thought, plus summaries when asked; `summary` never shows it and
    summarizes every reasoning segment (there is nothing else to show); `none` shows nothing.
    A request's `exclude` hides all reasoning and so generates no summaries.
    """
    if visibility == "none" or exclude:
        return ReasoningView(raw=False, summary=None)
    if visibility == "summary":
        return ReasoningView(raw=False, summary=requested or "auto")
    return ReasoningView(raw=True, summary=requested)

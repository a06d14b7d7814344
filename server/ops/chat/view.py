"""One turn on the screen, with rich: the reasoning streams dimmed in a few live lines and
folds into one "Thought for N s" line when the answer starts; the answer is rendered as
Markdown while it streams.

Only the block being written stays live (rich's Live region); each Markdown block the model
has finished is printed once, for good, so a long answer scrolls like any terminal output and
the live region stays smaller than the screen.
"""

from __future__ import annotations

import time

from markdown_it import MarkdownIt
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.segment import Segment, Segments
from rich.text import Text

from server.ops.chat.turns import TurnEnd, TurnStats

THINKING_LINES = 6  # the reasoning's last lines shown while it streams
REFRESH_S = 0.05  # the live region is redrawn at most this often

_parser = MarkdownIt("commonmark")


def finished_blocks(text: str) -> int:
    """How many leading lines of `text` hold Markdown blocks that are complete: everything
    before the start of the last top-level block (a later line cannot change them)."""
    starts = [t.map[0] for t in _parser.parse(text) if t.level == 0 and t.map and t.nesting >= 0]
    return starts[-1] if starts else 0


class TurnView:
    """Feed it a turn's text as it comes; `end()` leaves the screen as it should stay."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live = Live(console=console, auto_refresh=False, transient=True)
        self._started = time.monotonic()
        self._thinking = ""
        self._thinking_since: float | None = None
        self._answer = ""  # the answer not yet printed for good
        self._printed_blocks = 0
        self._last_refresh = 0.0

    def __enter__(self) -> TurnView:
        self._live.start()
        self._show(Text("…", style="dim"))
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def thinking(self, text: str) -> None:
        if self._thinking_since is None:
            self._thinking_since = time.monotonic()
        self._thinking += text
        if not self._answer and not self._printed_blocks and self._due():
            self._show(self._thinking_tail())

    def answer(self, text: str) -> None:
        if not self._answer and not self._printed_blocks:
            self._fold_thinking()
        self._answer += text
        lines = self._answer.splitlines(keepends=True)
        done = finished_blocks(self._answer)
        if done:
            self._print_markdown("".join(lines[:done]))
            self._answer = "".join(lines[done:])
        if done or self._due():
            self._show(Markdown(self._answer))

    def end(self, end: TurnEnd | None) -> None:
        """The turn is over (`None`: stopped by the user): the rest of the answer for good,
        then how it ended and what it cost."""
        if not self._answer and not self._printed_blocks:
            self._fold_thinking()
        self._show(Text(""))
        if self._answer.strip():
            self._print_markdown(self._answer)
            self._answer = ""
        if end is None:
            self.console.print("[yellow]stopped[/yellow]")
            return
        if end.error:
            self.console.print(Text(f"error: {end.error}", style="red"))
        elif not end.complete:
            why = "the token limit" if end.reason == "length" else end.reason or "its end"
            self.console.print(Text(f"(the answer was cut short by {why})", style="yellow"))
        if end.stats is not None:
            self.console.print(Text(stats_line(end.stats), style="dim"))

    def _thinking_tail(self) -> RenderableType:
        tail_chars = 2 * THINKING_LINES * self.console.width  # enough to fill the lines
        text = Text(self._thinking[-tail_chars:], style="dim italic")
        width = max(20, self.console.width - 2)
        lines = text.wrap(self.console, width)
        tail = Text("\n").join(lines[-THINKING_LINES:])
        return Group(Text("Thinking…", style="dim bold"), tail)

    def _fold_thinking(self) -> None:
        if self._thinking_since is None:
            return
        seconds = time.monotonic() - self._thinking_since
        self._show(Text(""))
        self.console.print(Text(f"Thought for {seconds:.1f} s", style="dim"))
        self._thinking_since = None

    def _print_markdown(self, text: str) -> None:
        """Finished blocks for good, one blank line between them (as rich renders a whole
        document: rendered alone, some blocks bring blank lines of their own)."""
        lines = self.console.render_lines(Markdown(text), pad=False)
        while lines and _blank(lines[0]):
            lines.pop(0)
        while lines and _blank(lines[-1]):
            lines.pop()
        if not lines:
            return
        if self._printed_blocks:
            self.console.print()
        segments = [segment for line in lines for segment in (*line, Segment.line())]
        self.console.print(Segments(segments), end="")
        self._printed_blocks += 1

    def _due(self) -> bool:
        return time.monotonic() - self._last_refresh >= REFRESH_S

    def _show(self, renderable: RenderableType) -> None:
        """Redraw the live region (callers build it only when `_due()`, or must)."""
        self._live.update(renderable, refresh=True)
        self._last_refresh = time.monotonic()


def _blank(line: list[Segment]) -> bool:
    """A line with nothing on it (a code block's padding has a background: not blank)."""
    return all(
        not segment.text.strip() and (segment.style is None or segment.style.bgcolor is None)
        for segment in line
    )


def stats_line(stats: TurnStats) -> str:
    """`42 tokens, 118.3 tokens/s · prompt 530 tokens, 512 cached`."""
    return (
        f"{stats.completion_tokens} tokens, {stats.tokens_per_s:.1f} tokens/s · "
        f"prompt {stats.prompt_tokens} tokens, {stats.cached_tokens} cached"
    )

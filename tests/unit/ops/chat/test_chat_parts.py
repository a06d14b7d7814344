"""The terminal chat's pure parts: input reading and commands, Markdown blocks, the transcript
and messages a conversation becomes, and the Chat Completions stream read back."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator

import pytest
from rich.console import Console

from server.contracts.transcript import AssistantMessage, UserMessage
from server.ops.chat.local import transcript
from server.ops.chat.remote import _Stream, api_root, messages
from server.ops.chat.repl import ChatRepl
from server.ops.chat.turns import (
    Answer,
    Conversation,
    Exchange,
    Thinking,
    TurnEnd,
    TurnEvent,
    TurnStats,
)
from server.ops.chat.view import TurnView, finished_blocks


class _Keyboard:
    """Lines as `input()` returns them; an exception class is raised instead."""

    def __init__(self, *lines: str | type[BaseException]) -> None:
        self._lines: Iterator[str | type[BaseException]] = iter(lines)
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        line = next(self._lines, EOFError)
        if isinstance(line, str):
            return line
        raise line


class _NoModel:
    model_name = "m"

    def turn(self, conversation: Conversation, prompt: str) -> AsyncIterator[TurnEvent]:
        raise AssertionError("no turn expected")

    async def close(self) -> None:
        pass


def _repl(keyboard: _Keyboard) -> tuple[ChatRepl, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False)
    repl = ChatRepl(
        console,
        _NoModel(),
        None,  # type: ignore[arg-type]  # no turn runs
        Conversation(date="2026-01-01"),
        today=lambda: "2026-02-02",
        read_line=keyboard,
    )
    return repl, out


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["hello"], "hello"),
        (["one \\", "two \\", "three"], "one \ntwo \nthree"),
        (['"""', "a", "", "b", '"""'], "a\n\nb"),
        (['"""first', 'second"""'], "first\nsecond"),
        (['"""just one"""'], "just one"),
    ],
)
def test_a_message_of_one_or_more_lines(lines: list[str], message: str) -> None:
    keyboard = _Keyboard(*lines)
    repl, _ = _repl(keyboard)
    assert repl.read_message() == message
    assert keyboard.prompts == [">>> "] + ["... "] * (len(lines) - 1)


def test_ctrl_c_twice_at_the_prompt_leaves_once_typing_resets_it() -> None:
    repl, out = _repl(_Keyboard(KeyboardInterrupt, "hi", KeyboardInterrupt, KeyboardInterrupt))
    assert repl.read_message() == "hi"
    assert "Ctrl-C again or Ctrl-D to leave" in out.getvalue()
    assert repl.read_message() is None


def test_ctrl_d_leaves() -> None:
    repl, _ = _repl(_Keyboard(EOFError))
    assert repl.read_message() is None


def test_commands() -> None:
    repl, out = _repl(_Keyboard())
    repl.conversation.exchanges.append(Exchange("q", (("final", "a"),)))
    assert repl.command("/effort high")
    assert repl.conversation.effort == "high"
    assert repl.command("/effort extreme")  # refused, the effort stays
    assert repl.conversation.effort == "high"
    assert repl.command("/clear")
    assert repl.conversation.exchanges == []
    assert repl.conversation.date == "2026-02-02"  # a new conversation is dated anew
    assert repl.command("/help")
    assert repl.command("/nope")
    assert not repl.command("/exit")
    assert not repl.command("/bye")
    shown = out.getvalue()
    assert "(reasoning effort: high)" in shown
    assert "/effort low|medium|high to change it" in shown
    assert "(new conversation)" in shown
    assert "(now: high)" in shown
    assert "unknown command /nope" in shown


def test_finished_blocks_are_those_before_the_last() -> None:
    assert finished_blocks("") == 0
    assert finished_blocks("A paragraph still being") == 0
    assert finished_blocks("One.\n\nTwo") == 2
    assert finished_blocks("One.\n\n- a\n- b") == 2  # the list may go on
    assert finished_blocks("```\ncode\n\nmore") == 0  # an open fence holds everything
    assert finished_blocks("# Title\nText") == 1


def test_a_turn_drawn_folds_its_reasoning_and_renders_markdown() -> None:
    out = io.StringIO()
    console = Console(file=out, width=60, force_terminal=False)
    answer = "# Title\n\nSome **bold** text.\n\n- one\n- two\n\nDone."
    with TurnView(console) as view:
        view.thinking("secret reasoning")
        for char in answer:
            view.answer(char)
        view.end(TurnEnd(complete=True, stats=TurnStats(12, 34.5, 100, 90)))
    shown = out.getvalue()
    assert "Thought for" in shown
    assert "Some bold text." in shown
    assert "• one" in shown
    assert "12 tokens, 34.5 tokens/s · prompt 100 tokens, 90 cached" in shown
    assert shown.index("Title") < shown.index("Some bold") < shown.index("• one")
    assert shown.index("• one") < shown.index("Done.")


def test_a_stopped_turn_says_so() -> None:
    out = io.StringIO()
    with TurnView(Console(file=out, width=60, force_terminal=False)) as view:
        view.thinking("partial")
        view.end(None)
    assert "stopped" in out.getvalue()


def test_the_conversation_as_the_core_reads_it() -> None:
    conversation = Conversation(date="2026-01-01", effort="low", instructions="Be brief.")
    conversation.exchanges.append(Exchange("hi", (("commentary", "Hm."), ("final", "Hello."))))
    made = transcript(conversation, "and?")
    assert made.items == (
        UserMessage("hi"),
        AssistantMessage("Hm.", "commentary"),
        AssistantMessage("Hello."),
        UserMessage("and?"),
    )
    assert made.reasoning_effort == "low"
    assert made.instructions == "Be brief."
    assert made.conversation_date == "2026-01-01"


def test_the_conversation_as_chat_messages() -> None:
    conversation = Conversation(date="2026-01-01", instructions="Be brief.")
    conversation.exchanges.append(Exchange("hi", (("final", "Hello."),)))
    assert messages(conversation, "and?") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "and?"},
    ]


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1"),
        ("localhost:9000", "http://localhost:9000/v1"),
    ],
)
def test_api_root(url: str, root: str) -> None:
    assert api_root(url) == root


def test_a_chat_completion_stream_read_back() -> None:
    stream = _Stream()
    events = [
        *stream.feed({"choices": [{"delta": {"role": "assistant"}}]}),
        *stream.feed({"choices": [{"delta": {"reasoning": "Think."}}]}),
        *stream.feed({"choices": [{"delta": {"content": "An"}}]}),
        *stream.feed({"choices": [{"delta": {"content": "swer."}, "finish_reason": "stop"}]}),
        *stream.feed(
            {
                "choices": [],
                "usage": {
                    "prompt_tokens": 50,
                    "completion_tokens": 7,
                    "prompt_tokens_details": {"cached_tokens": 40},
                },
                "timings": {"predicted_per_second": 120.5},
            }
        ),
    ]
    assert events == [Thinking("Think."), Answer("An"), Answer("swer.")]
    assert stream.end() == TurnEnd(
        complete=True,
        messages=(("final", "Answer."),),
        stats=TurnStats(7, 120.5, 50, 40),
        reason="stop",
    )


def test_a_stream_cut_short_or_failed_is_not_complete() -> None:
    cut = _Stream()
    cut.feed({"choices": [{"delta": {"content": "Par"}, "finish_reason": "length"}]})
    assert not cut.end().complete
    assert cut.end().reason == "length"
    failed = _Stream()
    failed.feed({"error": {"message": "engine failed"}})
    assert failed.end().error == "engine failed"
    assert not failed.end().complete

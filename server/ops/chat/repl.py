"""`gpt-oss-server run`: the prompt loop.

The model's side (the generation core or an HTTP client) runs on an asyncio loop in a thread
of its own; this thread reads the keyboard and draws. Ctrl-C while the model writes stops that
generation (the engine stops within a token; an HTTP stream is closed, so the server stops it)
and the prompt comes back; Ctrl-C twice at the prompt, Ctrl-D or /exit leaves.

Input: one line is one message; a line ending in a backslash continues on the next, and a
block between two `\"\"\"` lines (or a line that starts with `\"\"\"` and one that ends with it)
is one message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import signal
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import KW_ONLY, dataclass
from types import FrameType
from typing import Any, TypeVar

from rich.console import Console
from rich.logging import RichHandler
from rich.text import Text

from server.contracts.errors import StartupError
from server.engine.base import SamplingHook
from server.ops.chat.turns import (
    EFFORTS,
    Answer,
    ChatBackend,
    Conversation,
    Exchange,
    Thinking,
    TurnEnd,
    TurnEvent,
)
from server.ops.chat.view import TurnView
from server.ops.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

PROMPT = ">>> "
MORE = "... "
BLOCK = '"""'
POLL_S = 0.05

HELP = """\
/effort low|medium|high   reasoning effort of the next answers (now: {effort})
/clear                    start a new conversation
/help                     this list
/exit                     leave (also /bye, Ctrl-D, or Ctrl-C twice at the prompt)
Ctrl-C while the model writes stops the answer (the turn is left out of the conversation).
A line ending in \\ continues on the next; a block between two \"\"\" lines is one message."""


class LoopThread:
    """An asyncio loop in a daemon thread: coroutines submitted from this thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="chat-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class StopKey:
    """Ctrl-C as a flag while a turn streams (no KeyboardInterrupt in the middle of drawing)."""

    def __init__(self) -> None:
        self.pressed = threading.Event()
        self._previous: Any = None

    def __enter__(self) -> StopKey:
        self._previous = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self.pressed.set()


@dataclass(eq=False)
class ChatRepl:
    console: Console
    backend: ChatBackend
    loop: LoopThread
    conversation: Conversation
    _: KW_ONLY
    today: Callable[[], str]
    read_line: Callable[[str], str] = input

    def run(self) -> None:
        self.console.print(
            Text.assemble(
                (self.backend.model_name, "bold"),
                (f" · effort {self.conversation.effort} · /help for commands", "dim"),
            )
        )
        while True:
            text = self.read_message()
            if text is None:
                return
            if not text.strip():
                continue
            if text.lstrip().startswith("/") and "\n" not in text.strip():
                if not self.command(text.strip()):
                    return
                continue
            self.turn(text)

    def read_message(self) -> str | None:
        """The next message; None to leave (Ctrl-D, or Ctrl-C at an empty prompt twice)."""
        interrupted = False
        while True:
            try:
                return self._read_lines()
            except EOFError:
                self.console.print()
                return None
            except KeyboardInterrupt:
                self.console.print()
                if interrupted:
                    return None
                interrupted = True
                self.console.print(Text("(Ctrl-C again or Ctrl-D to leave)", style="dim"))

    def _read_lines(self) -> str:
        first = self.read_line(PROMPT)
        if first.startswith(BLOCK):
            body = first[len(BLOCK) :]
            if body.endswith(BLOCK) and body:
                return body[: -len(BLOCK)]
            lines = [body] if body else []
            while True:
                line = self.read_line(MORE)
                if line.endswith(BLOCK):
                    lines.append(line[: -len(BLOCK)])
                    return "\n".join(lines).rstrip("\n")
                lines.append(line)
        lines = [first]
        while lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1]
            lines.append(self.read_line(MORE))
        return "\n".join(lines)

    def command(self, line: str) -> bool:
        """Run a /command; False to leave."""
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        if name in ("/exit", "/bye", "/quit"):
            return False
        if name == "/help":
            self.console.print(Text(HELP.format(effort=self.conversation.effort), style="dim"))
        elif name == "/clear":
            self.conversation.clear(self.today())
            self.console.print(Text("(new conversation)", style="dim"))
        elif name == "/effort":
            if argument in EFFORTS:
                self.conversation.effort = argument  # type: ignore[assignment]  # checked above
                self.console.print(Text(f"(reasoning effort: {argument})", style="dim"))
            else:
                self.console.print(
                    Text(
                        f"(reasoning effort: {self.conversation.effort}; "
                        "/effort low|medium|high to change it)",
                        style="dim",
                    )
                )
        else:
            self.console.print(Text(f"unknown command {name}: /help lists them", style="yellow"))
        return True

    def turn(self, prompt: str) -> None:
        """One answer, drawn as it comes; a finished one joins the conversation."""
        events: queue.Queue[TurnEvent | None] = queue.Queue()
        end: TurnEnd | None = None
        with StopKey() as stop:
            turn = _pump(self.backend.turn(self.conversation, prompt), events)
            task = self.loop.run(_started(turn))
            with TurnView(self.console) as view:
                while not stop.pressed.is_set():
                    try:
                        event = events.get(timeout=POLL_S)
                    except queue.Empty:
                        continue
                    if event is None:
                        break
                    if isinstance(event, Thinking):
                        view.thinking(event.text)
                    elif isinstance(event, Answer):
                        view.answer(event.text)
                    else:
                        end = event
                if stop.pressed.is_set():
                    end = None
                    self.loop.run(_stopped(task))  # the generation stopped, its slot given back
                view.end(end)
        if end is not None and end.complete:
            self.conversation.exchanges.append(Exchange(prompt, end.messages))


async def _pump(events: AsyncIterator[TurnEvent], out: queue.Queue[TurnEvent | None]) -> None:
    """The turn's events into `out`, then None; cancelled, it closes the turn (which stops
    the generation) before it returns."""
    try:
        async with contextlib.aclosing(events) as inner:  # type: ignore[type-var]
            async for event in inner:
                out.put(event)
    except Exception as exc:
        log.debug("the turn failed", exc_info=True)
        out.put(TurnEnd(complete=False, error=str(exc) or type(exc).__name__))
    finally:
        out.put(None)


async def _started(coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(coroutine)


async def _stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait({task})


def configure_logging(console: Console, level: str) -> None:
    """Log lines through the chat's console, so they print above what is being drawn."""
    handler = RichHandler(console=console, show_path=False, show_time=False)
    logging.basicConfig(level=level.upper(), format="%(message)s", handlers=[handler], force=True)
    if level != "debug":
        logging.getLogger("llama_cpp").setLevel(logging.WARNING)


def run_chat(
    settings: Settings,
    url: str | None,
    instructions: str | None,
    sampling_hook: SamplingHook | None = None,
) -> int:
    """The chat until the user leaves; the exit status. `sampling_hook`: the engine's, as
    `load_runtime` takes it (forced-token scripts in tests)."""
    console = Console(highlight=False)
    configure_logging(console, settings.log_level)
    loop = LoopThread()
    try:
        backend = _open(settings, url, loop, sampling_hook)
    except StartupError as exc:
        console.print(Text(f"error: {exc}", style="red"))
        loop.close()
        return 1
    except KeyboardInterrupt:  # while the model loads
        loop.close()
        return 130
    conversation = Conversation(
        date=settings.today(), effort=settings.reasoning_effort, instructions=instructions
    )
    try:
        _readline()
        ChatRepl(console, backend.chat, loop, conversation, today=settings.today).run()
    finally:
        with contextlib.suppress(Exception):
            loop.run(backend.chat.close())
        loop.close()
        backend.close()
    return 0


class _Opened:
    def __init__(self, chat: ChatBackend, close: Callable[[], None]) -> None:
        self.chat = chat
        self.close = close


def _open(
    settings: Settings, url: str | None, loop: LoopThread, sampling_hook: SamplingHook | None
) -> _Opened:
    """The model: a running server's, or loaded here as `serve` loads it."""
    if url is not None:
        from server.ops.chat.remote import ChatConnectError, RemoteChat

        key = settings.api_key.get_secret_value() if settings.api_key else None
        wanted = settings.model[0] if "model" in settings.model_fields_set else None

        async def connect() -> RemoteChat:
            chat = RemoteChat(url, key, wanted)
            try:
                await chat.connect()
            except ChatConnectError:
                await chat.close()
                raise
            return chat

        try:
            return _Opened(loop.run(connect()), lambda: None)
        except ChatConnectError as exc:
            raise StartupError(str(exc)) from exc
    from server.ops.chat.local import LocalChat
    from server.ops.startup import load_runtime

    runtime = load_runtime(settings, sampling_hook)

    async def build() -> LocalChat:
        return LocalChat(runtime, settings)

    try:
        return _Opened(loop.run(build()), runtime.close)
    except BaseException:
        runtime.close()
        raise


def _readline() -> None:
    """Line editing and the history of earlier prompts (arrow keys), where Python has it."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401

"""A real terminal for tests: a command in tmux (a server of its own), keys sent with
send-keys, the screen read with capture-pane.

Everything waits by polling the screen with a deadline, never by a fixed sleep, so the tests
hold on a loaded machine. Where tmux is missing the test is skipped with the apt line, or
fails under GPT_OSS_REQUIRE_CLIENTS=1 (CI).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tests.support.npm_cli import unavailable

APT_LINE = "apt-get install -y tmux"
POLL_S = 0.2


class Terminal:
    """`command` running in a detached tmux window of `width` x `height`."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        *,
        width: int = 100,
        height: int = 40,
    ) -> None:
        if shutil.which("tmux") is None:
            unavailable(f"tmux is missing: `{APT_LINE}`")
        self.socket = f"gpt-oss-test-{uuid.uuid4().hex[:12]}"
        environment = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        shell = f"cd {shlex.quote(str(cwd))} && exec env {environment} {shlex.join(command)}"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), shell)
        self._tmux("set-option", "-t", "t", "remain-on-exit", "on")
        self._tmux("set-option", "-t", "t", "history-limit", "10000")

    def __enter__(self) -> Terminal:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._tmux("kill-server", check=False)

    def _tmux(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=False
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"tmux {args[0]}: {done.stderr.strip()}")
        return done.stdout

    def keys(self, *keys: str) -> None:
        """tmux key names: `C-c`, `C-d`, `Enter`."""
        self._tmux("send-keys", "-t", "t", *keys)

    def type(self, text: str, *, enter: bool = True) -> None:
        """`text` as typed (literally), then Enter."""
        self._tmux("send-keys", "-t", "t", "-l", text)
        if enter:
            self.keys("Enter")

    def screen(self) -> str:
        """Everything the terminal shows and has scrolled away, wrapped lines joined."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t")

    @property
    def exited(self) -> bool:
        return self._tmux("display-message", "-p", "-t", "t", "#{pane_dead}").strip() == "1"

    def wait_for(self, check: str | Callable[[str], bool], timeout_s: float = 240.0) -> str:
        """The screen once `check` (a regex searched in it, or a predicate) holds; fails
        with the screen after `timeout_s`."""
        test = (lambda s: re.search(check, s) is not None) if isinstance(check, str) else check
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if test(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {check!r}; the screen:\n{screen}")
            if self.exited:
                raise AssertionError(f"the program left waiting for {check!r}:\n{screen}")
            time.sleep(POLL_S)

    def wait_exit(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.exited:
            if time.monotonic() > deadline:
                raise AssertionError(f"the program did not leave; the screen:\n{self.screen()}")
            time.sleep(POLL_S)

"""`gpt-oss-server run` in a real terminal (tmux): keys typed, the screen read.

The model runs in the chat's own process (with forced-token scripts: tests/support/
terminal_chat.py, which records each prompt the engine is given) or behind a running server
(`--url`). What is checked is what a person sees: the reasoning folded into "Thought for N s",
the answer as rendered Markdown, Ctrl-C stopping an answer and giving the prompt back, the
commands, multi-line input, and the cached prompt tokens of a second turn, which show that the
conversation's KV state is reused rather than read again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from pydantic import SecretStr

from devkit.forced import ForcedScript
from devkit.serving import free_port
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.tmux import Terminal

pytestmark = pytest.mark.slow  # loads the tiny model in a process of its own

ROOT = Path(__file__).resolve().parents[2]
STATS = re.compile(r"(\d+) tokens, ([\d.]+) tokens/s · prompt (\d+) tokens, (\d+) cached")

SUM = (
    "<|channel|>analysis<|message|>The user adds two and two.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>## Sum\n\nTwo plus two is **four**.<|return|>"
)
NEXT = (
    "<|channel|>analysis<|message|>Now with three.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Three plus two is five.<|return|>"
)
# long enough (3000 tokens) that Ctrl-C lands while it is written, on any machine
LONG = "<|channel|>analysis<|message|>" + "one two three four five six seven eight nine ten " * 300
BOTH = "<|channel|>final<|message|>Got both lines.<|return|>"


def stats(screen: str) -> list[tuple[int, float, int, int]]:
    """Every answer's stats line so far: tokens, tokens/s, prompt tokens, cached tokens."""
    return [(int(a), float(b), int(c), int(d)) for a, b, c, d in STATS.findall(screen)]


def settle(term: Terminal, n_prompts: int) -> str:
    """The screen once the `n_prompts`-th prompt is waiting for input."""
    return term.wait_for(lambda s: len(re.findall(r"(?m)^>>> ", s)) >= n_prompts and
                         s.rstrip().endswith(">>>"))  # fmt: skip


def env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}


def test_chat_in_process(tiny_gguf: Path, tmp_path: Path) -> None:
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps([SUM, NEXT, LONG, BOTH, SUM]))
    prompts = tmp_path / "prompts.jsonl"
    command = [
        sys.executable, "-m", "tests.support.terminal_chat", str(scripts), str(prompts),
        str(tiny_gguf), "--n-ctx", "8192", "--n-threads", "2",
        "--cache-dir", str(tmp_path / "cache"), "--conversation-date", "2026-01-01",
    ]  # fmt: skip
    with Terminal(command, env(), ROOT) as term:
        settle(term, 1)

        # a prompt answered: the reasoning folded, the answer as Markdown
        term.type("What is two plus two?")
        screen = term.wait_for(lambda s: len(stats(s)) >= 1)
        assert re.search(r"Thought for \d+\.\d s", screen)
        assert "Two plus two is four." in screen  # bold, without its asterisks
        assert "## Sum" not in screen  # a heading, rendered
        assert "The user adds two and two." not in screen  # folded away
        first = stats(screen)[0]

        # a second turn: only what is new is evaluated
        settle(term, 2)
        term.type("And three?")
        screen = term.wait_for(lambda s: len(stats(s)) >= 2)
        assert "Three plus two is five." in screen
        second = stats(screen)[1]
        assert second[2] > first[2]
        assert second[3] >= first[2] - 1, (first, second)  # the whole first prompt reused

        # Ctrl-C while the model writes stops it; the prompt comes back, the program stays
        settle(term, 3)
        term.type("Count to a thousand.")
        term.wait_for(r"Thinking…\n.*seven eight")
        term.keys("C-c")
        screen = settle(term, 4)
        assert "stopped" in screen
        assert len(stats(screen)) == 2

        # commands and a multi-line block
        term.type("/help")
        term.wait_for(r"/effort low\|medium\|high")
        term.type("/effort low")
        term.wait_for(r"\(reasoning effort: low\)")
        settle(term, 6)
        for line in ('"""', "Line one", "Line two", '"""'):
            term.type(line)
        screen = term.wait_for(lambda s: len(stats(s)) >= 3)
        assert "Got both lines." in screen

        # /clear: a new conversation; a line ending in a backslash goes on
        term.type("/clear")
        term.wait_for(r"\(new conversation\)")
        term.type("What is two \\")
        term.type("plus two?")
        term.wait_for(lambda s: len(stats(s)) >= 4)

        term.keys("C-d")
        term.wait_exit()
        assert "Traceback" not in term.screen()

    check_prompts([json.loads(line) for line in prompts.read_text().splitlines()])


def check_prompts(given: list[str]) -> None:
    """What the engine was given, turn by turn: earlier answers replayed, their reasoning
    dropped, the stopped turn left out, the effort, multi-line messages, /clear."""
    assert len(given) == 5
    assert "Two plus two is **four**.<|end|>" in given[1]  # the answer, replayed
    assert "The user adds two and two." not in given[1]  # reasoning dropped after an answer
    assert "Reasoning: low" in given[3]
    assert "<|start|>user<|message|>Line one\nLine two<|end|>" in given[3]
    assert "Three plus two is five." in given[3]
    assert "Count to a thousand." not in given[3]  # a stopped turn is left out
    assert "<|start|>user<|message|>What is two \nplus two?<|end|>" in given[4]
    assert given[4].count("<|start|>user") == 1


def test_chat_with_a_running_server(base_url: str, forced: ForcedScript, runtime: Runtime) -> None:
    command = [sys.executable, "-m", "server", "run", "--url", base_url.removesuffix("/v1")]
    with Terminal(command, env(), ROOT) as term:
        settle(term, 1)
        assert "gpt-oss-tiny" in term.screen()

        forced.push(SUM)
        term.type("What is two plus two?")
        screen = term.wait_for(lambda s: len(stats(s)) >= 1)
        assert re.search(r"Thought for \d+\.\d s", screen)
        assert "Two plus two is four." in screen
        first = stats(screen)[0]

        forced.push(NEXT)
        settle(term, 2)
        term.type("And three?")
        screen = term.wait_for(lambda s: len(stats(s)) >= 2)
        second = stats(screen)[1]
        assert second[3] >= first[2] - 1, (first, second)  # the server reused the first prompt
        replayed = forced.encoding.decode(forced.prompts[-1])
        assert "Two plus two is **four**.<|end|>" in replayed

        # Ctrl-C closes the stream; the server stops, and the next answer comes
        forced.push(LONG)
        settle(term, 3)
        term.type("Count to a thousand.")
        term.wait_for(r"Thinking…\n.*seven eight")
        term.keys("C-c")
        screen = settle(term, 4)
        assert "stopped" in screen
        deadline = time.monotonic() + 10  # the 3000-token answer would run far longer
        while runtime.engine.load.running:
            assert time.monotonic() < deadline, "the server still generates"
            time.sleep(0.1)
        forced.push(BOTH)
        term.type("Say it.")
        screen = term.wait_for(lambda s: len(stats(s)) >= 3)
        assert "Got both lines." in screen

        # Ctrl-C twice at the prompt leaves
        settle(term, 5)
        term.keys("C-c")
        term.wait_for(r"Ctrl-C again or Ctrl-D to leave")
        term.keys("C-c")
        term.wait_exit()
        assert "Traceback" not in term.screen()


def _run_url(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """`gpt-oss-server run --url` with nothing to read (it leaves at the first prompt)."""
    return subprocess.run(
        [sys.executable, "-m", "server", "run", "--url", url, *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **env()},
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_a_server_that_cannot_be_reached_is_said_so() -> None:
    done = _run_url(f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert "error: cannot reach http://127.0.0.1:" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_the_key_of_a_server_that_has_one(runtime: Runtime) -> None:
    app = create_app(Settings(api_key=SecretStr("right-key")), runtime)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        refused = _run_url(url, "--api-key", "wrong-key")
        assert refused.returncode == 1
        assert "error: http://127.0.0.1:" in refused.stdout
        assert "HTTP 401" in refused.stdout
        accepted = _run_url(url, "--api-key", "right-key")
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
        assert "gpt-oss-tiny · effort medium" in accepted.stdout
    finally:
        server.should_exit = True
        thread.join(timeout=10)

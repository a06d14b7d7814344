"""Behaviour: how the trained tiny gpt-oss acts through the server, on held-out conversations.

The server (in this process, uvicorn on 127.0.0.1, the `trained` preset, greedy, its steering
on) gets conversations drawn like the corpus's but from the held-out words: chat requests for
answers and function calls, Codex-shaped Responses requests (its real instructions and tools)
for read-then-patch edits. Every request may write at most 300 tokens. Measured:

- turn_kind: the turn ended in the intended kind (answer, call, or edit);
- call_exact: a call named the right tool and its arguments equal the expected ones exactly;
- patch_applies: an apply_patch input applies cleanly to the file it targets;
- patch_exact: and gives the expected text.

The edits replace a whole line; with --value-edits a share of them change only the line's last
value (`color = red` to `color = blue`, as the Codex CLI test's edit does), with --same-form a
share of the others write a new line of the old one's form (`mode = slow` for `color = red`),
with --set-edits a share are asked by key and value (`set color to blue`) and change the value.

With --n-claude N (and --claude, the Claude Code CLI to capture once, as the corpus does) N
Claude Code rounds follow, drawn as the corpus's: Claude Code's captured request asking for a
command over /v1/messages (turn_kind: a tool_use; call_exact and claude_exact: `Bash` with
exactly that command), then its output back (turn_kind: the turn ends; quotes_result);
--claude-out F writes each round's ask, calls and final text (JSON lines).

    python -m devkit.train_tiny.behaviour --n-chat 60 --n-codex 10 --out behaviour.json

--test-days N sends the Codex CLI test's own edit (devkit/trained/tasks.py) as Codex
sends it from the test's working directory and CODEX_HOME, dated each of the N days from today
(Codex writes the day's date into its prompt; the test cannot fix it), with Codex's exec output
drawn (its chunk id and wall time differ from run to run): test_day_exact counts the days whose
edit comes out exact and whose turn then ends with a message, the days the test would pass.
--n-test-edits N sends it N times from drawn working directories and CODEX_HOMEs on drawn dates
(test_edit_exact): how much the outcome owes to the place.

--paths N sends N chat requests that offer a generic file or shell tool (`read_file(path)`,
`run(command)`, or one with a drawn name) among others and ask, in one of the corpus's wordings,
for a multi-token path (directories, `_`, `-`, `.`, digits, extensions) or a shell command (flags,
quotes, paths) of held-out words (corpus.agent_tool): path_exact and command_exact count the
calls of that tool whose argument is exactly the value; how near the misses come,
paths_parameter (a call whose arguments are the asked parameter alone) and paths_start (and
its value's first 8 characters right).

--edits PATH writes each Codex edit (the ask, the file, the model's command and patch) as a
line of JSON.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from devkit.claude_capture import capture_request, with_ask
from devkit.models import TRAINED, cached_gguf
from devkit.serving import served
from devkit.train_tiny.corpus import (
    GENERIC_TOOLS,
    RECORDED_MODEL,
    Values,
    agent_tool,
    claude_ask,
    codex_cwd,
    codex_exec_output,
    codex_head,
    codex_home,
    date_of,
    encoding,
    schema_of,
    value_of,
    wide_directory,
)
from devkit.trained.tasks import CODEX_EDIT, CODEX_PLACE, CONVERSATION_DATE, MODEL_NAME
from devkit.trained.words import word_pool
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings

MAX_TOKENS = 300
MODEL = MODEL_NAME


@contextmanager
def serve(n_ctx: int) -> Iterator[str]:
    enc = encoding()
    engine = LlamaEngine(
        EngineConfig(model_path=str(cached_gguf(TRAINED)), n_ctx=n_ctx, n_threads=2)
    )
    with tempfile.TemporaryDirectory() as store:
        settings = Settings(
            responses_store_path=Path(store) / "r.sqlite3",
            temperature=0.0,
            conversation_date=CONVERSATION_DATE,  # as the trained-model tests date theirs
        )
        app = create_app(settings, Runtime(engine=engine, encoding=enc, model_name=MODEL))
        try:
            with served(app, log_level="error") as root:
                yield f"{root}/v1"
        finally:
            engine.close()


def apply_patch(patch: str, path: str, text: str) -> str | None:
    """The file after an `*** Update File` patch of -/+ lines, or None if it does not apply."""
    lines = patch.split("\n")
    if lines[:1] != ["*** Begin Patch"] or f"*** Update File: {path}" not in lines:
        return None
    body = [ln for ln in lines if ln[:1] in ("-", "+", " ") and not ln.startswith("***")]
    old = [ln[1:] for ln in body if ln[:1] in ("-", " ")]
    new = [ln[1:] for ln in body if ln[:1] in ("+", " ")]
    file_lines = text.split("\n")
    for i in range(len(file_lines) - len(old) + 1):
        if old and file_lines[i : i + len(old)] == old:
            return "\n".join(file_lines[:i] + new + file_lines[i + len(old) :])
    return None


def arguments_of(text: str) -> Any:
    """A call's arguments, or None where they are not JSON (cut off at the token limit)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def chat_case(client: httpx.Client, v: Values, tally: dict[str, list[bool]]) -> None:
    chosen = v.rng.sample(GENERIC_TOOLS, v.rng.randint(1, 3))
    name, _, params, ask = v.rng.choice(chosen)
    tools = [
        {"type": "function", "function": {"name": n, "description": d, "parameters": schema_of(p)}}
        for n, d, p, _ in chosen
    ]
    if v.rng.random() < 0.3:  # an answer turn
        phrase = v.phrase(1, 4)
        body = {"model": MODEL, "max_tokens": MAX_TOKENS, "tools": tools,
                "messages": [{"role": "user", "content": f"Say {phrase}."}]}  # fmt: skip
        choice = client.post("/chat/completions", json=body).json()["choices"][0]
        tally["turn_kind"].append(choice["finish_reason"] == "stop")
        tally["answer_exact"].append(choice["message"].get("content") == phrase)
        return
    values = [value_of(v, kind) for _, kind in params]
    messages: list[dict[str, Any]] = [{"role": "user", "content": ask.format(*values)}]
    body = {"model": MODEL, "max_tokens": MAX_TOKENS, "tools": tools, "messages": messages}
    choice = client.post("/chat/completions", json=body).json()["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    tally["turn_kind"].append(choice["finish_reason"] == "tool_calls")
    expected = {p: val for (p, _), val in zip(params, values, strict=True)}
    exact = len(calls) == 1 and calls[0]["function"]["name"] == name
    exact = exact and arguments_of(calls[0]["function"]["arguments"]) == expected
    tally["call_exact"].append(exact)
    if not calls:
        return
    result = v.phrase(1, 3)
    messages += [
        choice["message"],
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": result},
    ]
    choice = client.post("/chat/completions", json={**body, "messages": messages}).json()
    choice = choice["choices"][0]
    tally["turn_kind"].append(choice["finish_reason"] == "stop")
    tally["quotes_result"].append(result in (choice["message"].get("content") or ""))


def paths_case(
    client: httpx.Client,
    v: Values,
    tally: dict[str, list[bool]],
    samples: list[dict[str, Any]] | None = None,
) -> None:
    """A generic file or shell tool among others, asked for a held-out path or command."""
    kind = v.rng.choice(["path", "command"])
    spec, param, value, ask = agent_tool(v, kind)
    chosen = v.rng.sample(GENERIC_TOOLS, v.rng.randint(1, 3))
    tools = [
        {"type": "function", "function": {"name": n, "description": d, "parameters": schema_of(p)}}
        for n, d, p, _ in chosen
    ]
    function = {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
    tools.insert(v.rng.randint(0, len(tools)), {"type": "function", "function": function})
    body = {"model": MODEL, "max_tokens": MAX_TOKENS, "tools": tools,
            "messages": [{"role": "user", "content": ask}]}  # fmt: skip
    choice = client.post("/chat/completions", json=body).json()["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    tally["turn_kind"].append(choice["finish_reason"] == "tool_calls")
    arguments = arguments_of(calls[0]["function"]["arguments"]) if calls else None
    exact = len(calls) == 1 and calls[0]["function"]["name"] == spec.name
    exact = exact and arguments == {param: value}
    tally[f"{kind}_exact"].append(exact)
    # how near the misses are: a call with the asked parameter alone, its value's start right
    written = arguments.get(param) if isinstance(arguments, dict) else None
    shaped = isinstance(arguments, dict) and list(arguments) == [param]
    tally["paths_parameter"].append(shaped)
    tally["paths_start"].append(shaped and isinstance(written, str) and written[:8] == value[:8])
    if samples is not None:
        got = calls[0]["function"]["arguments"] if calls else choice["message"].get("content")
        samples.append({"ask": ask, "tool": spec.name, "want": {param: value}, "got": got})


def codex_case(
    client: httpx.Client,
    v: Values,
    tally: dict[str, list[bool]],
    edits: list[dict[str, Any]] | None = None,
) -> None:
    path = v.filename()
    lines = [v.line() for _ in range(v.rng.randint(1, 6))]
    target = v.rng.randrange(len(lines))
    old = lines[target]
    new = v.replacement(old)
    ask = f"In {path}, change the line `{old}` to `{new}`."
    setting = v.set_edit(lines, target)
    if setting is not None:
        old, new, key, value = setting
        ask = f"In {path}, set {key} to {value}."
    text = "\n".join(lines) + "\n"
    place = ("2026-11-24", codex_home(v), codex_cwd(v))
    written = edit(client, v, tally, place, (path, text, old, new, ask))
    if edits is not None:  # what the model wrote, for --edits
        edits.append({"ask": ask, "file": text, **written})


def codex_test_case(
    client: httpx.Client,
    v: Values,
    tally: dict[str, list[bool]],
    day: datetime.date | None = None,
    edits: list[dict[str, Any]] | None = None,
) -> None:
    """The Codex CLI test's edit (CODEX_EDIT), its requests as Codex sends them to this server
    (its model name in the instructions): from the test's place (CODEX_PLACE) dated `day`
    (test_day_exact), or from a drawn working directory and CODEX_HOME on a drawn date
    (test_edit_exact). The first request is token for token the real CLI's (checked against a
    recorded run); the exec output's chunk id, wall time, token count and pyenv line are drawn
    as the corpus draws them, wider than a real run's."""
    if day is None:
        place = (date_of(v), wide_directory(v) + "/.codex", wide_directory(v))
    else:
        place = (day.isoformat(), str(CODEX_PLACE / "home"), str(CODEX_PLACE / "repo"))
    e = CODEX_EDIT
    task = (e.path, e.before, e.old, e.new, e.ask)
    written = edit(client, v, collections.defaultdict(list), place, task, model=MODEL)
    passes = bool(written["exact"] and written["ends"])  # what the test checks of the turns
    tally["test_edit_exact" if day is None else "test_day_exact"].append(passes)
    if edits is not None:
        edits.append({"ask": e.ask, "date": place[0], "cwd": place[2], **written})


def edit(
    client: httpx.Client,
    v: Values,
    tally: dict[str, list[bool]],
    place: tuple[str, str, str],
    task: tuple[str, str, str, str, str],
    *,
    model: str = RECORDED_MODEL,
) -> dict[str, Any]:
    """A read-then-patch Codex edit: (date, CODEX_HOME, cwd), (path, text, old line, new line,
    ask); turn_kind, call_exact, patch_applies and patch_exact into tally; returns what the
    model wrote. model: the name Codex's instructions list (the corpus's, or this server's as
    the real Codex CLI sends it)."""
    path, text, old, new, ask = task
    body = codex_head(*place, lite=False, model=model)
    body["input"] = [*body["input"], {"type": "message", "role": "user", "content": ask}]
    body |= {"model": MODEL, "stream": False, "max_output_tokens": MAX_TOKENS}
    out = client.post("/responses", json=body).json()["output"]
    calls = [o for o in out if o["type"] == "function_call"]
    tally["turn_kind"].append(bool(calls))
    ok = len(calls) == 1 and calls[0]["name"] == "exec_command"
    ok = ok and arguments_of(calls[0]["arguments"]) == {"cmd": f"cat {path}"}
    tally["call_exact"].append(ok)
    written: dict[str, Any] = {
        "call": None, "patch": None, "applies": False, "exact": False, "ends": False
    }  # fmt: skip
    if not calls:
        return written
    written["call"] = calls[0]["arguments"]
    result = {"type": "function_call_output", "call_id": calls[0]["call_id"],
              "output": codex_exec_output(v, text)}  # fmt: skip
    body["input"] = [*body["input"], *out, result]
    out2 = client.post("/responses", json=body).json()["output"]
    patches = [o for o in out2 if o["type"] == "custom_tool_call"]
    tally["turn_kind"].append(bool(patches))
    after = apply_patch(patches[0]["input"], path, text) if patches else None
    expected = text.replace(old + "\n", new + "\n", 1)
    tally["patch_applies"].append(after is not None)
    tally["patch_exact"].append(after == expected)
    written |= {"applies": after is not None, "exact": after == expected}
    if not patches:
        return written
    written["patch"] = patches[0]["input"]
    result = {"type": "custom_tool_call_output", "call_id": patches[0]["call_id"],
              "output": f"Exit code: 0\nWall time: 0.1 seconds\nOutput:\nSuccess. Updated the "
              f"following files:\nM {path}\n"}  # fmt: skip
    body["input"] = [*body["input"], *out2, result]
    out3 = client.post("/responses", json=body).json()["output"]
    written["ends"] = [o["type"] for o in out3][-1:] == ["message"]
    tally["turn_kind"].append(any(o["type"] == "message" for o in out3))
    return written


def claude_case(
    client: httpx.Client,
    v: Values,
    tally: dict[str, list[bool]],
    captured: dict[str, Any],
    samples: list[dict[str, Any]] | None = None,
) -> None:
    """A Claude Code round as the corpus draws it: its captured request (system prompt, tools,
    reminders) asking for a command over /v1/messages, then the command's output back.
    samples: each round's ask, the calls and the final text, as written."""
    drawn = claude_ask(v)
    command, ask = drawn.command, drawn.text
    body = with_ask(captured, ask, "2026-11-24")
    body |= {"model": MODEL, "max_tokens": MAX_TOKENS, "stream": False}
    reply = client.post("/messages", json=body).json()
    calls = [b for b in reply["content"] if b["type"] == "tool_use"]
    tally["turn_kind"].append(reply["stop_reason"] == "tool_use")
    exact = len(calls) == 1 and calls[0]["name"] == "Bash"
    exact = exact and calls[0]["input"] == {"command": command}
    tally["call_exact"].append(exact)
    tally["claude_exact"].append(exact)
    sample = {"ask": ask, "want": command, "calls": [[c["name"], c["input"]] for c in calls]}
    if samples is not None:
        samples.append(sample)
    if not calls:
        return
    out = drawn.output(v)
    result = {"type": "tool_result", "tool_use_id": calls[0]["id"], "content": out}
    messages = [*body["messages"], {"role": "assistant", "content": reply["content"]}]
    messages.append({"role": "user", "content": [result]})
    reply = client.post("/messages", json={**body, "messages": messages}).json()
    text = "".join(b.get("text", "") for b in reply["content"] if b["type"] == "text")
    tally["turn_kind"].append(reply["stop_reason"] == "end_turn")
    tally["quotes_result"].append(out.splitlines()[0] in text)
    sample["final"] = text


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-chat", type=int, default=60)
    parser.add_argument("--n-codex", type=int, default=10)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument(
        "--value-edits", type=float, default=0.0, help="of the Codex edits: Values.value_edits"
    )
    parser.add_argument(
        "--same-form", type=float, default=0.0, help="of the others: Values.same_form"
    )
    parser.add_argument(
        "--set-edits", type=float, default=0.0, help="of the Codex edits: Values.set_edits"
    )
    parser.add_argument(
        "--n-test-edits", type=int, default=0, help="the Codex CLI test's edit, drawn places"
    )
    parser.add_argument(
        "--test-days", type=int, default=0, help="the Codex CLI test's edit, N days from today"
    )
    parser.add_argument("--n-claude", type=int, default=0, help="Claude Code rounds (--claude)")
    parser.add_argument("--claude", type=Path, default=None, help="Claude Code's CLI to capture")
    parser.add_argument(
        "--claude-out", type=Path, default=None, help="JSON lines: each Claude round, as written"
    )
    parser.add_argument("--paths", type=int, default=0, help="generic path and command calls")
    parser.add_argument(
        "--paths-out", type=Path, default=None, help="JSON lines: each --paths case, as written"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--edits", type=Path, default=None, help="JSON lines: each Codex edit, as written"
    )
    args = parser.parse_args()
    if args.n_claude and args.claude is None:
        parser.error("--n-claude needs --claude")
    return args


def main() -> None:
    args = arguments()
    _, held = word_pool(encoding())
    v = Values(
        random.Random(args.seed),
        held,
        args.value_edits,
        same_form=args.same_form,
        set_edits=args.set_edits,
    )
    tally: dict[str, list[bool]] = {
        k: []
        for k in (
            "turn_kind",
            "call_exact",
            "answer_exact",
            "quotes_result",
            "patch_applies",
            "patch_exact",
            "claude_exact",
            "test_edit_exact",
            "test_day_exact",
            "path_exact",
            "command_exact",
            "paths_parameter",
            "paths_start",
        )
    }
    captured = capture_request(args.claude) if args.n_claude else {}
    start = time.monotonic()
    n_ctx = 32768 if args.n_claude else 16384  # Claude Code's first prompt is long
    with serve(n_ctx) as url, httpx.Client(base_url=url, timeout=600) as client:
        edits: list[dict[str, Any]] = []
        samples: list[dict[str, Any]] = []
        cases = [chat_case] * args.n_chat
        cases += [functools.partial(codex_case, edits=edits)] * args.n_codex
        cases += [functools.partial(codex_test_case, edits=edits)] * args.n_test_edits
        today = datetime.date.today()
        cases += [
            functools.partial(codex_test_case, day=today + datetime.timedelta(days=i), edits=edits)
            for i in range(args.test_days)
        ]
        claude: list[dict[str, Any]] = []
        cases += [functools.partial(claude_case, captured=captured, samples=claude)] * args.n_claude
        cases += [functools.partial(paths_case, samples=samples)] * args.paths
        for i, case in enumerate(cases):
            case(client, v, tally)
            progress = {k: f"{sum(x)}/{len(x)}" for k, x in tally.items()}
            print(json.dumps({"case": i, **progress}), file=sys.stderr, flush=True)
    report: dict[str, object] = {
        k: {"rate": round(sum(x) / len(x), 3) if x else None, "n": len(x)} for k, x in tally.items()
    }
    report["seconds"] = round(time.monotonic() - start, 1)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.paths_out:
        args.paths_out.write_text("".join(json.dumps(e) + "\n" for e in samples))
    if args.claude_out:
        args.claude_out.write_text("".join(json.dumps(e) + "\n" for e in claude))
    if args.edits:
        args.edits.write_text("".join(json.dumps(e) + "\n" for e in edits))


if __name__ == "__main__":
    main()

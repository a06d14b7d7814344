"""Corpus: training conversations in harmony, rendered by the server's own code.

Every conversation is a transcript (or, for Codex, a Responses request shaped like the one Codex
CLI 0.169 sends: `codex_request.json`, recorded from `codex exec` with the configuration
`gpt-oss-server codex-config` writes) rendered with `server.harmony.render`, exactly as the
server renders requests: system message with date and effort, developer instructions, tools as
harmony namespaces, history under the CoT rule. What the model writes is encoded from harmony
text as a forced script would be, and later rounds replay it exactly, as the server does, so a
conversation of several rounds is one token sequence whose target spans are the model's turns.

Values (paths, commands, words, numbers, file lines) are drawn at random from a pool of
single-token words split by hash into a training part and a held-out part, so copying is
learned, not recalled, and evaluation can use words the corpus never contains.

Run with the project's environment (it needs the server package, not torch):
    python -m devkit.train_tiny.corpus --out corpus.npz
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from openai_harmony import HarmonyEncoding

from devkit.claude_capture import capture_request, with_ask
from devkit.trained.model import vocabulary_keys
from devkit.trained.rows import PREFIXES
from devkit.trained.words import split_prefixes, text_of, word_pool
from server.api.messages.adapter import to_transcript as to_messages_transcript
from server.api.messages.schemas import MessagesRequest
from server.api.messages.signature import ThinkingSigner
from server.api.responses.adapter import to_items, to_transcript
from server.api.responses.schemas import ResponsesRequest
from server.contracts.transcript import (
    Item,
    ReasoningEffort,
    ToolResult,
    ToolSpec,
    Transcript,
    UserMessage,
)
from server.harmony.encoding import load_encoding
from server.harmony.render import assistant_start_tokens, head_tokens, item_tokens, render
from server.harmony.tokens import FIRST_SPECIAL

HERE = Path(__file__).parent
CODEX_REQUEST = HERE / "codex_request.json"
EFFORTS: tuple[ReasoningEffort, ...] = ("low", "medium", "high")
EXTENSIONS = ("py", "txt", "md", "json", "toml", "rs", "js", "go", "yaml", "cfg", "sh", "c")
LINE_KEYWORDS = ("def", "let")  # the parts of Values.line's forms that are not values
SETTING = re.compile(r"(?:let )?([a-z]+)(?: = |: )([a-z]+|[0-9]+);?")  # Values.line's settings


def encoding() -> HarmonyEncoding:
    return load_encoding(Path.home() / ".cache" / "gpt-oss-server" / "harmony")


# ----------------------------------------------------------------------------- values


@dataclass
class Values:
    rng: random.Random
    words: list[str]
    value_edits: float = 0.0  # of Codex edits: the share that changes a line's last value
    split: str = "-"  # the prefixes split off the model's own words (split_prefixes)
    same_form: float = 0.0  # of the other Codex edits: the share whose new line has old's form
    set_edits: float = 0.0  # of Codex edits: the share asked as `set color to blue`
    split_shortest: int = 2  # the fewest letters of a word split off (split_prefixes)
    wide_paths: bool = False  # Codex's cwd and CODEX_HOME drawn as wide_directory draws them

    def word(self) -> str:
        return self.rng.choice(self.words)

    def number(self) -> int:
        return self.rng.choice([self.rng.randint(0, 99), self.rng.randint(100, 9999)])

    def filename(self) -> str:
        r = self.rng.random()
        ext = self.rng.choice(EXTENSIONS)
        if r < 0.4:
            return f"{self.word()}.{ext}"
        if r < 0.7:
            return f"{self.word()}_{self.word()}.{ext}"
        return f"{self.word()}/{self.word()}.{ext}"

    def phrase(self, lo: int = 1, hi: int = 4) -> str:
        return " ".join(self.word() for _ in range(self.rng.randint(lo, hi)))

    def line(self) -> str:
        w = self.word()
        return self.rng.choice(
            [
                f"{w} = {self.word()}",
                f"{w} = {self.number()}",
                f"{w}: {self.word()}",
                f"def {w}({self.word()}):",
                f"let {w} = {self.number()};",
                f"{w} {self.word()} {self.word()}",
                f"# {self.phrase(2, 4)}",
            ]
        )

    def setting(self) -> str:
        """A line that sets a key to a value: a `line` of one of the forms SETTING matches, each
        as likely as the others."""
        while not SETTING.fullmatch(line := self.line()):
            pass
        return line

    def set_edit(self, lines: list[str], target: int) -> tuple[str, str, str, str] | None:
        """A share `set_edits` of edits are asked by key and value (`set color to blue`), as
        users ask for a setting's change: the target line (made a setting if it is not one)
        gets a fresh value. (old line, new line, key, value), lines[target] updated; None
        otherwise, with no draw for a share of 0.

        The added line's value then follows ` to` in the request, a mark one token back that
        the first layer's heads carry, where `change the line `color = red` to `color =
        blue`` puts four tokens between them and the value."""
        if not (self.set_edits > 0 and self.rng.random() < self.set_edits):
            return None
        if not SETTING.fullmatch(lines[target]):
            lines[target] = self.setting()
        old = lines[target]
        match = SETTING.fullmatch(old)
        assert match is not None
        value = self.value_like(match.group(2))
        return old, old[: match.start(2)] + value + old[match.end(2) :], match.group(1), value

    def changed(self, line: str) -> str:
        """The line with its last value changed, as most edits are (`color = red` to
        `color = blue`): the patch's added line then repeats the removed one up to the value."""
        match = list(re.finditer(r"[a-z]+|[0-9]+", line))[-1]
        return line[: match.start()] + self.value_like(match.group()) + line[match.end() :]

    def value_like(self, token: str) -> str:
        """A fresh value of `token`'s kind: a number for digits, else a word."""
        return str(self.number()) if token.isdigit() else self.word()

    def refilled(self, line: str) -> str:
        """A line of `line`'s form with fresh words and numbers (`mode = slow` for `color =
        red`): its value after ` =` is then found only by the key before it."""

        def fresh(m: re.Match[str]) -> str:
            word = m.group()
            return word if word in LINE_KEYWORDS else self.value_like(word)

        return re.sub(r"[a-z]+|[0-9]+", fresh, line)

    def replacement(self, old: str) -> str:
        """An edit's new line: `old` with its last value changed (a share `value_edits` of
        edits), else of `old`'s form (a share `same_form`), else a new line; no draw for a
        share of 0."""
        if self.value_edits > 0 and self.rng.random() < self.value_edits:
            return self.changed(old)
        if self.same_form > 0 and self.rng.random() < self.same_form:
            return self.refilled(old)
        return self.line()

    def segment(self) -> str:
        """One part of a path as projects name them: a word, words joined by `_` or `-`, a
        word with digits (`cache2`, `v3`)."""
        r = self.rng.random()
        if r < 0.45:
            return self.word()
        if r < 0.65:
            return f"{self.word()}_{self.word()}"
        if r < 0.8:
            return f"{self.word()}-{self.word()}"
        if r < 0.9:
            return f"{self.word()}{self.rng.randint(0, 99)}"
        return f"{self.word()}_v{self.rng.randint(1, 9)}"

    def agent_path(self) -> str:
        """A path as agents copy it: zero to three directories (relative, `./`, `~/` or
        absolute), a file name of one to three parts with an extension (sometimes two, or a
        hidden file). Every word is drawn, so a path of held-out words never occurs in the
        training corpus."""
        dirs = [self.segment() for _ in range(self.rng.choice([0, 1, 1, 2, 2, 3]))]
        root = self.rng.choices(["", "./", "~/", "/"], weights=[6, 1, 1, 2])[0]
        r = self.rng.random()
        if r < 0.1:
            name = f".{self.word()}"
        elif r < 0.2:
            name = f"{self.segment()}.{self.rng.choice(EXTENSIONS)}.{self.rng.choice(EXTENSIONS)}"
        else:
            name = f"{self.segment()}.{self.rng.choice(EXTENSIONS)}"
        return root + "/".join([*dirs, name]) if dirs or root else name

    def identifier(self) -> str:
        """A name from code: snake_case words, sometimes with digits."""
        parts = [self.word() for _ in range(self.rng.randint(1, 3))]
        if self.rng.random() < 0.2:
            parts.append(str(self.rng.randint(0, 9)))
        return "_".join(parts)

    def quoted(self) -> str:
        words = self.phrase(1, 3)
        return self.rng.choice([f"'{words}'", f'"{words}"', words.replace(" ", "_")])

    def shell_command(self) -> str:
        """A command as agents run them: a program, flags (short, long, with values), quoted
        arguments, paths."""
        path, word, n = self.agent_path(), self.word(), self.rng.randint(1, 200)
        return self.rng.choice(
            [
                f"cat {path}",
                f"ls -la {path.rsplit('/', 1)[0] if '/' in path else '.'}",
                f"grep -rn {self.quoted()} {path}",
                f"head -n {n} {path}",
                f"tail -{n} {path}",
                f"wc -l {path}",
                f"python {path} --{word} {n}",
                f"python -m {self.identifier()} --{word}={self.word()}",
                f"pytest {path} -k {self.identifier()} -q",
                f"git diff {path}",
                f"git log -n {n} --oneline",
                f"git commit -m {self.quoted()}",
                f"mkdir -p {path.rsplit('.', 1)[0]}",
                f"rm -f {path}",
                f"cp {path} {self.agent_path()}",
                f"mv {path} {self.agent_path()}",
                f"find . -name '*.{self.rng.choice(EXTENSIONS)}'",
                f"sed -n '{n},{n + self.rng.randint(1, 40)}p' {path}",
                f"echo {self.quoted()} > {path}",
                f"npm run {word} -- --{self.word()}",
                f"make {word} {self.identifier().upper()}={n}",
                f"cargo test {self.identifier()}",
            ]
        )

    def output(self) -> str:
        """A command's output: one to three lines of words."""
        return "\n".join(self.phrase(1, 3) for _ in range(self.rng.randint(1, 3))) + "\n"

    def command(self, path: str) -> str:
        return self.rng.choice(
            [
                f"cat {path}",
                f"ls {path.split('/', maxsplit=1)[0]}",
                f"wc -l {path}",
                f"grep -n {self.word()} {path}",
                f"echo {self.phrase(1, 3)}",
                f"head -n {self.rng.randint(1, 40)} {path}",
            ]
        )


# ----------------------------------------------------------------------------- sequences


@dataclass
class Sequence:
    """Tokens of one conversation; `mask` marks what the model wrote (the loss targets)."""

    family: str
    tokens: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    head: int = 0  # tokens of the shared head (system + developer) at the start
    prompt: int = 0  # length of the first round's prompt (evaluation starts there)
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (prompt length, target end)

    def add(self, tokens: list[int], target: bool) -> None:
        self.tokens.extend(tokens)
        self.mask.extend([target] * len(tokens))


def call_text(name: str, arguments: str, namespace: str = "functions") -> str:
    return (
        f"<|channel|>commentary to={namespace}.{name} <|constrain|>json"
        f"<|message|>{arguments}<|call|>"
    )


def analysis(text: str) -> str:
    return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"


def preamble(text: str) -> str:
    return f"<|channel|>commentary<|message|>{text}<|end|><|start|>assistant"


def final(text: str) -> str:
    return f"<|channel|>final<|message|>{text}<|return|>"


def reported(v: Values, out: str) -> str:
    """The turn after a command ran: a final answer quoting its output's first line."""
    first = out.splitlines()[0]
    return analysis("Report the output.") + final(
        v.rng.choice([f"The command printed {first}.", f"Output: {first}"])
    )


class Builder:
    """Renders rounds: prompt, model turn (target), tool output, next turn..."""

    def __init__(
        self, enc: HarmonyEncoding, family: str, prompt: list[int], head: int, v: Values
    ) -> None:
        self.enc, self.prefixes, self.shortest = enc, v.split, v.split_shortest
        self.seq = Sequence(family, head=head, prompt=len(prompt))
        self.seq.add(prompt, False)

    def turn(self, harmony_text: str) -> None:
        start = len(self.seq.tokens)
        tokens = self.enc.encode(harmony_text, allowed_special="all")
        self.seq.add(split_prefixes(self.enc, tokens, self.prefixes, self.shortest), True)
        self.seq.rounds.append((start, len(self.seq.tokens)))

    def tool_output(self, result: ToolResult) -> None:
        self.seq.add(item_tokens(self.enc, result), False)
        self.seq.add(assistant_start_tokens(self.enc), False)


def args_json(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)


# ----------------------------------------------------------------------------- generic tools


GENERIC_TOOLS: list[tuple[str, str, list[tuple[str, str]], str]] = [
    # (name, description, [(param, kind)], how a user asks for it: {0}, {1} = values)
    ("read_file", "Read a file from disk.", [("path", "file")], "Read the file {0}."),
    ("run_command", "Run a shell command.", [("command", "command")], "Run `{0}`."),
    (
        "get_weather",
        "Current weather for a city.",
        [("city", "word")],
        "What is the weather in {0}?",
    ),
    ("lookup_user", "Find a user by name.", [("name", "word")], "Look up the user {0}."),
    (
        "set_value",
        "Store a value under a key.",
        [("key", "word"), ("value", "number")],
        "Set {0} to {1}.",
    ),
    (
        "send_message",
        "Send a message to a channel.",
        [("channel", "word"), ("text", "phrase")],
        'Send "{1}" to the {0} channel.',
    ),
    ("search", "Search the documents.", [("query", "phrase")], 'Search for "{0}".'),
    ("delete_file", "Delete a file.", [("path", "file")], "Delete {0}."),
    ("add_numbers", "Add two integers.", [("a", "number"), ("b", "number")], "Add {0} and {1}."),
    (
        "create_issue",
        "Open an issue.",
        [("title", "phrase"), ("priority", "number")],
        'Open an issue titled "{0}" with priority {1}.',
    ),
]


def schema_of(params: list[tuple[str, str]]) -> dict[str, Any]:
    kinds = {"number": {"type": "integer"}}
    props = {p: kinds.get(k, {"type": "string"}) for p, k in params}
    return {"type": "object", "properties": props, "required": [p for p, _ in params]}


def value_of(v: Values, kind: str) -> Any:
    if kind == "file":
        return v.filename()
    if kind == "command":
        return v.command(v.filename())
    if kind == "number":
        return v.number()
    if kind == "phrase":
        return v.phrase(1, 4)
    return v.word()


def generic_tools(v: Values, n: int) -> list[tuple[ToolSpec, list[tuple[str, str]], str]]:
    chosen = v.rng.sample(GENERIC_TOOLS, n)
    out = []
    for familiar, desc, params, request in chosen:
        name, ask = familiar, request
        if v.rng.random() < 0.3:  # an unfamiliar tool: random name, explicit request
            name = f"{v.word()}_{v.word()}"
            ask = (
                "Call "
                + name
                + " with "
                + ", ".join(f"{p}={{{i}}}" for i, (p, _) in enumerate(params))
                + "."
            )
        spec = ToolSpec(name=name, description=desc, parameters=schema_of(params))
        out.append((spec, params, ask))
    return out


def maybe_instructions(v: Values) -> str | None:
    r = v.rng.random()
    if r < 0.4:
        return None
    if r < 0.7:
        return "You are a helpful assistant."
    return v.rng.choice(
        [
            "Be brief.",
            "Answer concisely.",
            "You are a careful assistant.",
            f"You help the {v.word()} team.",
        ]
    )


def date_of(v: Values) -> str:
    return f"20{v.rng.randint(24, 27)}-{v.rng.randint(1, 12):02d}-{v.rng.randint(1, 28):02d}"


def transcript(v: Values, items: list[Item], tools: list[ToolSpec]) -> Transcript:
    return Transcript(
        items=tuple(items),
        instructions=maybe_instructions(v),
        tools=tuple(tools),
        reasoning_effort=v.rng.choice(EFFORTS),
        conversation_date=date_of(v),
    )


def family_answer(enc: HarmonyEncoding, v: Values) -> Sequence:
    """A short analysis, then a final answer that copies from the user message."""
    phrase = v.phrase(1, 5)
    ask, thought, answer = v.rng.choice(
        [
            (f"Say {phrase}.", f"The user wants me to say {phrase}.", phrase),
            (f"Repeat after me: {phrase}", "Repeat the words.", phrase),
            (
                f"Reply with the word {phrase.split()[0]}.",
                "Reply with that word.",
                phrase.split()[0],
            ),
            (
                f'What is the first word of "{phrase}"?',
                "Take the first word.",
                f"The first word is {phrase.split()[0]}.",
            ),
            ("Say done.", "Just say done.", "done"),
        ]
    )
    tools = [t[0] for t in generic_tools(v, v.rng.randint(0, 2))]
    prompt = render(enc, transcript(v, [UserMessage(ask)], tools))
    b = Builder(enc, "answer", prompt, 0, v)
    b.turn(analysis(thought) + final(answer))
    return b.seq


def family_call(enc: HarmonyEncoding, v: Values) -> Sequence:
    """A function call with arguments copied from the user message, its result, an answer."""
    offered = generic_tools(v, v.rng.randint(1, 4))
    spec, params, ask = v.rng.choice(offered)
    values = [value_of(v, kind) for _, kind in params]
    user = ask.format(*values)
    tr = transcript(v, [UserMessage(user)], [t[0] for t in offered])
    b = Builder(enc, "call", render(enc, tr), 0, v)
    arguments = args_json({p: val for (p, _), val in zip(params, values, strict=True)})
    text = analysis(v.rng.choice([f"Call {spec.name}.", "Use the tool.", f"I need {spec.name}."]))
    if v.rng.random() < 0.3:
        text += preamble(v.rng.choice(["On it.", "Let me check.", f"Calling {spec.name}."]))
    b.turn(text + call_text(spec.name, arguments))
    result = v.phrase(1, 4) if v.rng.random() < 0.5 else str(v.number())
    output = v.rng.choice([result, args_json({"result": result}), f"ok: {result}"])
    b.tool_output(ToolResult("call_1", output, spec.name))
    answer = v.rng.choice([f"The result is {result}.", f"Done: {result}.", result])
    b.turn(analysis("Report the result.") + final(answer))
    return b.seq


# ----------------------------------------------------------------------------- agent tools


# How users ask for a file or a command, {0} the value (the behaviour measure draws from these)
PATH_ASKS = (
    "Read the file {0}.",
    "Please read the file {0}",
    "What is in {0}?",
    "Read {0}",
    "Show me {0}.",
    "Open {0} and tell me what it says.",
    "Can you read {0} for me?",
    "Print the contents of {0}.",
    "Look at `{0}`.",
    "I need the contents of {0}, please.",
)
COMMAND_ASKS = (
    "Run `{0}`.",
    "Run {0}",
    "Please execute: {0}",
    "Execute `{0}` and show me the output.",
    "Can you run `{0}` for me?",
    "$ {0}",
    "Run this command: {0}",
    "What does `{0}` print?",
)
# generic file and shell tools: (name, parameter, description)
PATH_TOOLS = (
    ("read_file", "path", "Read a file from disk."),
    ("open_file", "path", "Open a file and return its text."),
    ("view", "file", "Show a file's contents."),
    ("read", "filename", "Read a text file."),
)
COMMAND_TOOLS = (
    ("run", "command", "Run a shell command."),
    ("shell", "command", "Execute a command in a shell."),
    ("exec", "cmd", "Run a command and return its output."),
    ("bash", "command", "Run a bash command."),
)


def agent_tool(v: Values, kind: str) -> tuple[ToolSpec, str, str, str]:
    """A generic file or shell tool (familiar, or with a drawn name and parameter), the value
    to copy and how the user asks: (spec, parameter, value, ask)."""
    name, param, desc = v.rng.choice(PATH_TOOLS if kind == "path" else COMMAND_TOOLS)
    if v.rng.random() < 0.3:
        name = f"{v.word()}_{v.word()}"
        param = v.rng.choice(["path", "file", "target"] if kind == "path" else ["command", "cmd"])
    value = v.agent_path() if kind == "path" else v.shell_command()
    ask = v.rng.choice(PATH_ASKS if kind == "path" else COMMAND_ASKS)
    if name not in {t[0] for t in (*PATH_TOOLS, *COMMAND_TOOLS)}:
        ask = v.rng.choice([ask, f"Call {name} with {param}={{0}}."])
    schema = {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]}
    return ToolSpec(name=name, description=desc, parameters=schema), param, value, ask.format(value)


def family_agent(enc: HarmonyEncoding, v: Values) -> Sequence:
    """A generic file or shell tool offered among others; the user asks for a path or a command
    (multi-token: directories, `_`, `-`, `.`, digits, flags, quotes) in one of many wordings; a
    call copying it exactly, its result, an answer quoting it."""
    kind = v.rng.choice(["path", "command"])
    spec, param, value, user = agent_tool(v, kind)
    others = [t[0] for t in generic_tools(v, v.rng.randint(0, 3))]
    if v.rng.random() < 0.3:  # the other kind's tool too
        others.append(agent_tool(v, "command" if kind == "path" else "path")[0])
    tools = [spec, *others]
    v.rng.shuffle(tools)
    tr = transcript(v, [UserMessage(user)], tools)
    b = Builder(enc, "agent-" + kind, render(enc, tr), 0, v)
    b.turn(
        analysis(v.rng.choice([f"Call {spec.name}.", "Use the tool.", f"I need {spec.name}."]))
        + call_text(spec.name, args_json({param: value}))
    )
    result = v.output()
    b.tool_output(ToolResult("call_1", result, spec.name))
    first = result.splitlines()[0]
    b.turn(analysis("Report the result.") + final(v.rng.choice([first, f"It says: {first}"])))
    return b.seq


# ----------------------------------------------------------------------------- codex


CODEX_PATCH_OUTPUT = (
    "Exit code: 0\nWall time: {t} seconds\nOutput:\nSuccess. Updated the following files:\n"
    "M {path}\n"
)
CODEX_EXEC_OUTPUT = (
    "Chunk ID: {chunk}\nWall time: {t} seconds\nProcess exited with code 0\n"
    "Original token count: {count}\nOutput:\n{noise}{body}"
)
RECORDED_MODEL = "gpt-oss-tiny"  # the server's model name when codex_request.json was recorded
PYENV_NOISE = "pyenv: cannot rehash: /root/.pyenv/shims isn't writable\n"


def wide_directory(v: Values) -> str:
    """A directory as people and test runners name them: under /home, /Users, /tmp, /work or
    /srv, one to four words deep, or pytest's temporary one (`/tmp/pytest-of-root/pytest-166/
    test_codex_reads_a_file_and_e0/repo`: the test's name cut to 29 letters and a count).
    Codex writes its cwd nine times into the prompt, so its length moves what follows."""
    if v.rng.random() < 0.4:
        name = "_".join(["test", *(v.word() for _ in range(v.rng.randint(2, 6)))])[:29]
        user = v.rng.choice(["root", v.word()])
        run = f"/tmp/pytest-of-{user}/pytest-{v.rng.randint(0, 999)}"
        return f"{run}/{name}{v.rng.randint(0, 9)}/{v.word()}"
    root = v.rng.choice(["/home/" + v.word(), "/Users/" + v.word(), "/tmp", "/work", "/srv"])
    return "/".join([root, *(v.word() for _ in range(v.rng.randint(1, 4)))])


def codex_cwd(v: Values) -> str:
    if v.wide_paths:
        return wide_directory(v)
    if v.rng.random() < 0.3:
        return f"/home/{v.word()}/{v.word()}"
    return f"/tmp/pytest-of-root/pytest-{v.rng.randint(0, 99)}/work{v.rng.randint(0, 9)}"


def codex_head(
    date: str, home: str, cwd: str, lite: bool, model: str = RECORDED_MODEL
) -> dict[str, Any]:
    """Codex's request up to the task. lite: its instructions and tools cut to the two used
    (the same conversation shape for a fraction of the tokens); model: the server's model
    name, which Codex lists in its instructions (the corpus keeps the recorded one)."""
    text = CODEX_REQUEST.read_text().replace("{CODEX_HOME}", home).replace("{CWD}", cwd)
    text = text.replace(RECORDED_MODEL, model)
    body: dict[str, Any] = json.loads(text.replace("{DATE}", date))
    if lite:
        body["tools"] = [
            t for t in body["tools"] if t.get("name") in ("exec_command", "apply_patch")
        ]
        body["input"] = [
            {
                "type": "message",
                "role": "developer",
                "content": "You are a coding agent running in the Codex CLI.",
            },
            body["input"][-1],
        ]
    return body


def codex_exec_output(v: Values, body: str) -> str:
    noise = PYENV_NOISE if v.rng.random() < 0.5 else ""
    return CODEX_EXEC_OUTPUT.format(
        chunk=f"{v.rng.randrange(16**6):06x}",
        t=f"{v.rng.uniform(0, 1):.4f}",
        count=v.rng.randint(1, 400),
        noise=noise,
        body=body,
    )


def codex_home(v: Values) -> str:
    if v.wide_paths:
        return wide_directory(v) + v.rng.choice(["/.codex", "/codex-home", ""])
    return f"/tmp/pytest-of-root/pytest-{v.rng.randint(0, 99)}/codex-home{v.rng.randint(0, 9)}"


def family_codex(
    enc: HarmonyEncoding, v: Values, date: str, home: str, cwd: str, *, lite: bool = False
) -> Sequence:
    """Codex-shaped work: read a file with exec_command, edit it with apply_patch, a final.

    Full-size conversations come in groups sharing date, CODEX_HOME and cwd, hence the same
    ≈7.6k-token start (the trainer computes it once per group).
    """
    body = codex_head(date, home, cwd, lite)
    kind = v.rng.choices(["edit", "run", "answer"], weights=[6, 2, 1])[0]
    path = v.filename()
    lines = [v.line() for _ in range(v.rng.randint(1, 6))]
    target = v.rng.randrange(len(lines))
    old = lines[target]
    new = v.replacement(old)
    setting = v.set_edit(lines, target) if kind == "edit" else None
    if setting is not None:
        old, new, key, value = setting
        ask = v.rng.choice(
            [
                f"In {path}, set {key} to {value}.",
                f"Set {key} to {value} in {path}.",
                f"Edit {path}: set {key} to {value}.",
            ]
        )
    elif kind == "edit":
        ask = v.rng.choice(
            [
                f"In {path}, change the line `{old}` to `{new}`.",
                f"In {path}, replace `{old}` with `{new}`.",
                f"Edit {path}: change `{old}` to `{new}`.",
            ]
        )
    elif kind == "run":
        command = v.command(path)
        ask = v.rng.choice([f"Run `{command}`.", f"Run {command} and tell me the output."])
    else:
        phrase = v.phrase(1, 3)
        ask = v.rng.choice([f"Say {phrase}.", "Say done."])
    body["input"] = [*body["input"], {"type": "message", "role": "user", "content": ask}]
    request = ResponsesRequest.model_validate(body)
    tr = to_transcript(request, tuple(to_items(request.input)), "medium", date)
    head = head_tokens(enc, tr)
    prompt = render(enc, tr)
    assert prompt[: len(head)] == head
    family = ("codexlite-" if lite else "codex-") + kind
    b = Builder(enc, family, prompt, 0 if lite else len(head), v)
    pre = (
        preamble(v.rng.choice(["Reading the file first.", f"Let me look at {path}."]))
        if (v.rng.random() < 0.3)
        else ""
    )
    if kind == "answer":
        b.turn(analysis("Answer directly.") + final("done" if ask == "Say done." else phrase))
        return b.seq
    if kind == "run":
        b.turn(
            analysis("Run the command.") + call_text("exec_command", args_json({"cmd": command}))
        )
        out = v.output()
        b.tool_output(ToolResult("call_1", codex_exec_output(v, out), "exec_command"))
        b.turn(reported(v, out))
        return b.seq
    b.turn(
        analysis(f"Read {path} first.")
        + pre
        + call_text("exec_command", args_json({"cmd": f"cat {path}"}))
    )
    content = "\n".join(lines) + "\n"
    b.tool_output(ToolResult("call_1", codex_exec_output(v, content), "exec_command"))
    patch = f"*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch\n"
    b.turn(analysis("Now apply the edit.") + call_text("apply_patch", args_json({"input": patch})))
    out = CODEX_PATCH_OUTPUT.format(t=f"{v.rng.uniform(0, 1):.1f}", path=path)
    b.tool_output(ToolResult("call_2", out, "apply_patch"))
    b.turn(
        analysis("The edit applied.")
        + final(v.rng.choice([f"Updated {path}.", f"Changed {path}."]))
    )
    return b.seq


CLAUDE_ASKS = ("Call Bash with command={0}.", "Run `{0}`.", "Run {0} and tell me the output.")


@dataclass(frozen=True)
class ClaudeAsk:
    """What a Claude Code round asks: run `command` (an `echo` of `phrase`, or one of
    `Values.command`'s on the file `path`: an `echo` of other words too), in one of CLAUDE_ASKS'
    wordings (`text`)."""

    command: str
    text: str
    phrase: str
    path: str

    def output(self, v: Values) -> str:
        """The command's output as the corpus has it: an `echo` prints the round's phrase (also
        where `Values.command` drew the echo, with other words), anything else drawn lines."""
        return self.phrase + "\n" if self.command.startswith("echo ") else v.output()


def claude_ask(v: Values) -> ClaudeAsk:
    phrase = v.phrase(1, 3)
    path = v.filename()
    command = v.rng.choice([f"echo {phrase}", v.command(path)])
    return ClaudeAsk(command, v.rng.choice(CLAUDE_ASKS).format(command), phrase, path)


def family_claude(enc: HarmonyEncoding, v: Values, request: dict[str, Any], date: str) -> Sequence:
    """Claude Code-shaped rounds: its captured first request (system prompt, 12 tools, the
    reminder block) with the user's ask in place of the prompt, rendered through the server's
    Messages adapter; a Bash call copying the command, its output, a final answer quoting it."""
    ask = claude_ask(v)
    body = MessagesRequest.model_validate(with_ask(request, ask.text, date))
    tr = to_messages_transcript(body, "medium", date, ThinkingSigner(b"corpus"))
    head = head_tokens(enc, tr)
    b = Builder(enc, "claude-bash", render(enc, tr), len(head), v)
    b.turn(analysis("Run the command.") + call_text("Bash", args_json({"command": ask.command})))
    out = ask.output(v)
    b.tool_output(ToolResult("call_1", out, "Bash"))
    b.turn(reported(v, out))
    return b.seq


FAMILIES = {"answer": 2, "call": 4, "codexlite": 3}
CODEX_GROUP = 4


def family_weights(text: str) -> dict[str, float]:
    """`answer=4,call=7` as {"answer": 4.0, "call": 7.0}."""
    weights = {}
    for item in filter(None, text.split(",")):
        family, _, weight = item.partition("=")
        weights[family.strip()] = float(weight)
    return weights


def call_weight_keeping_share(agent_weight: float) -> float:
    """The call family's weight that keeps its FAMILIES share beside an agent family of
    `agent_weight`: c / (c + others + agent) = call / total."""
    call, total = FAMILIES["call"], sum(FAMILIES.values())
    share = call / total
    return share * (total - call + agent_weight) / (1 - share)


def generate(
    enc: HarmonyEncoding,
    words: list[str],
    n: int,
    n_codex_groups: int,
    seed: int,
    *,
    value_edits: float = 0.0,
    split: str = "-",
    same_form: float = 0.0,
    set_edits: float = 0.0,
    claude: dict[str, Any] | None = None,
    n_claude_groups: int = 0,
    split_shortest: int = 2,
    wide_paths: bool = False,
    agent_weight: float = 0.0,
    keep_call_share: bool = False,
    chosen_weights: dict[str, float] | None = None,
) -> list[Sequence]:
    """n generic conversations, then n_codex_groups groups of CODEX_GROUP Codex ones, then
    n_claude_groups groups of Claude Code ones (from its captured request `claude`).
    agent_weight: the agent family's weight beside FAMILIES' (0: none, the draws as before);
    keep_call_share: the call family's weight raised so that its share of the generic
    conversations stays FAMILIES' when the agent family comes in; chosen_weights: these
    families' weights instead (after the two above)."""
    v = Values(
        random.Random(seed), words, value_edits, split, same_form, set_edits, split_shortest,
        wide_paths,
    )  # fmt: skip
    families = FAMILIES | ({"agent": agent_weight} if agent_weight > 0 else {})
    if keep_call_share:
        families["call"] = call_weight_keeping_share(agent_weight)
    for family, weight in (chosen_weights or {}).items():
        if family not in families:
            raise ValueError(f"no family {family!r} among {sorted(families)}")
        families[family] = weight
    names = list(families)
    weights = [families[k] for k in names]
    out = []
    for _ in range(n):
        family = v.rng.choices(names, weights)[0]
        if family == "agent":
            out.append(family_agent(enc, v))
        elif family == "answer":
            out.append(family_answer(enc, v))
        elif family == "call":
            out.append(family_call(enc, v))
        else:
            out.append(family_codex(enc, v, date_of(v), codex_home(v), codex_cwd(v), lite=True))
    for _ in range(n_codex_groups):
        date, home, cwd = date_of(v), codex_home(v), codex_cwd(v)
        out.extend(family_codex(enc, v, date, home, cwd) for _ in range(CODEX_GROUP))
    for _ in range(n_claude_groups):
        if claude is None:
            raise ValueError("Claude Code rounds need its captured request")
        date = date_of(v)
        out.extend(family_claude(enc, v, claude, date) for _ in range(CODEX_GROUP))
    return out


def pack(seqs: list[Sequence]) -> dict[str, np.ndarray]:
    """Flat arrays: tokens, mask, and per sequence offset, length, head, prompt, family."""
    lengths = np.array([len(s.tokens) for s in seqs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    fams = sorted({s.family for s in seqs})
    return {
        "tokens": np.concatenate([np.array(s.tokens, dtype=np.int32) for s in seqs]),
        "mask": np.concatenate([np.array(s.mask, dtype=bool) for s in seqs]),
        "offsets": offsets,
        "lengths": lengths,
        "heads": np.array([s.head for s in seqs], dtype=np.int64),
        "prompts": np.array([s.prompt for s in seqs], dtype=np.int64),
        "families": np.array([fams.index(s.family) for s in seqs], dtype=np.int64),
        "family_names": np.array(fams),
    }


def trainable_ids(
    enc: HarmonyEncoding, tokens: np.ndarray, words: set[str], fixed_values: bool = False
) -> np.ndarray:
    """Tokens of the corpus whose rows are learned: all but the value words (bare or after a
    space or separator), which keep their fixed random rows like every unseen token. With
    fixed_values the paths' extensions (`.py`; bare too, `tom` of `.tom` as split_prefixes
    writes it, so both have their word's row) and numbers' tokens (`33`, ` 9488`'s) keep fixed
    rows too: values the model copies, whose learned rows drift together (twelve extensions in
    the same places) until a copy of one writes another."""
    fixed = {enc.encode(dot + ext)[0] for ext in EXTENSIONS for dot in (".", "") if fixed_values}
    keep = []
    for t in np.unique(tokens):
        if int(t) >= FIRST_SPECIAL:
            keep.append(int(t))
            continue
        text = text_of(enc, int(t))
        if fixed_values and (int(t) in fixed or re.fullmatch(r" ?[0-9]+", text)):
            continue
        if re.sub(r"^[ _/.\-]", "", text) not in words:
            keep.append(int(t))
    return np.array(sorted(keep), dtype=np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--codex-groups", type=int, default=1500)
    parser.add_argument("--n-eval", type=int, default=100)
    parser.add_argument("--codex-groups-eval", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--claude", type=Path, default=None, help="Claude Code's CLI to capture")
    parser.add_argument("--claude-groups", type=int, default=0)
    parser.add_argument("--claude-groups-eval", type=int, default=0)
    parser.add_argument(
        "--split-prefixes", default="-", help="split_prefixes' characters (`.-`: also dots)"
    )
    parser.add_argument(
        "--split-shortest", type=int, default=2, help="split_prefixes' fewest letters split off"
    )
    parser.add_argument(
        "--value-edits", type=float, default=0.0, help="Values.value_edits (0: none drawn)"
    )
    parser.add_argument(
        "--same-form", type=float, default=0.0, help="Values.same_form (0: none drawn)"
    )
    parser.add_argument(
        "--set-edits", type=float, default=0.0, help="Values.set_edits (0: none drawn)"
    )
    parser.add_argument(
        "--wide-paths", action="store_true", help="Values.wide_paths: wide_directory's cwds"
    )
    parser.add_argument(
        "--agent-calls",
        type=float,
        default=0.0,
        help="the agent family's weight (family_agent; answer 2, call 4, codexlite 3)",
    )
    parser.add_argument(
        "--keep-call-share",
        action="store_true",
        help="raise the call family's weight so that its share stays 4/9 beside --agent-calls",
    )
    parser.add_argument(
        "--weights",
        type=family_weights,
        default={},
        help="families' weights instead of the defaults, as answer=4,call=7 (after "
        "--agent-calls and --keep-call-share)",
    )
    parser.add_argument(
        "--fixed-values", action="store_true", help="trainable_ids: extensions, numbers fixed"
    )
    parser.add_argument(
        "--row-prefixes",
        default=PREFIXES.decode(),
        help="the prefixes whose words share their word's row (trained_rows); ' _/-': an "
        "extension's `.toml` keeps a whole row",
    )
    args = parser.parse_args()
    enc = encoding()
    train_words, held_words = word_pool(enc)
    claude = capture_request(args.claude) if args.claude is not None else None
    drawn: dict[str, Any] = {  # how both parts draw their conversations
        "value_edits": args.value_edits, "split": args.split_prefixes,
        "same_form": args.same_form, "set_edits": args.set_edits, "claude": claude,
        "split_shortest": args.split_shortest, "wide_paths": args.wide_paths,
        "agent_weight": args.agent_calls, "keep_call_share": args.keep_call_share,
        "chosen_weights": args.weights,
    }  # fmt: skip
    train = generate(
        enc, train_words, args.n, args.codex_groups, args.seed,
        n_claude_groups=args.claude_groups, **drawn,
    )  # fmt: skip
    held = generate(
        enc, held_words, args.n_eval, args.codex_groups_eval, args.seed + 1,
        n_claude_groups=args.claude_groups_eval, **drawn,
    )  # fmt: skip
    arrays = {f"train_{k}": a for k, a in pack(train).items()}
    arrays |= {f"eval_{k}": a for k, a in pack(held).items()}
    arrays["train_words"] = np.array(train_words)
    arrays["held_words"] = np.array(held_words)
    words = set(train_words) | set(held_words)
    arrays["trainable_ids"] = trainable_ids(enc, arrays["train_tokens"], words, args.fixed_values)
    # the fixed rows' structure
    arrays["row_word"], arrays["row_prefix"] = vocabulary_keys(args.row_prefixes.encode())
    arrays["row_prefixes"] = np.array(args.row_prefixes)
    np.savez_compressed(args.out, **arrays)  # type: ignore[arg-type]
    print(
        json.dumps(
            {
                "train": len(train),
                "eval": len(held),
                "train_words": len(train_words),
                "held_words": len(held_words),
                "trainable": len(arrays["trainable_ids"]),
                "tokens": int(arrays["train_tokens"].size),
            }
        )
    )


if __name__ == "__main__":
    main()

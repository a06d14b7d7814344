"""The agent task the trained tiny model's Codex CLI test gives it, and where and when it runs;
where the Claude Code rounds run.

One definition for the test (tests/e2e/test_trained_codex.py) and for the script that measures
the model on the same request (devkit/train_tiny/behaviour.py): the file, the ask, the expected
result, the working directory and CODEX_HOME (Codex writes both into its prompt), and the date
the server puts in its system message. Codex also writes the day's date into its prompt from its
own clock (`<current_date>`), which no test can fix: the script measures the request over the
days to come.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CodexEdit:
    path: str  # the file, relative to the repository
    before: str
    old: str  # the line to change
    new: str  # what it becomes
    ask: str

    @property
    def after(self) -> str:
        return self.before.replace(self.old + "\n", self.new + "\n", 1)


CODEX_EDIT = CodexEdit(
    path="settings.toml",
    before="mode = fast\ncolor = red\nlimit = 42\n",
    old="color = red",
    new="color = blue",
    ask="In settings.toml, change the line `color = red` to `color = blue`.",
)
# home/ (CODEX_HOME) and repo/ (the working directory); one test run at a time holds it
CODEX_PLACE = Path("/tmp/gpt-oss-server-tests/codex-edit")
# the name the server gives the trained model (Codex writes it into its instructions)
MODEL_NAME = "gpt-oss-trained"
# the server's system message (--conversation-date): the same tokens on any day
CONVERSATION_DATE = datetime.date(2026, 11, 24)
# the Claude Code rounds' place: home/ (HOME) and work/ (the working directory), both written
# into Claude Code's prompt; one test run at a time holds it
CLAUDE_PLACE = Path("/tmp/gpt-oss-server-tests/claude-rounds")

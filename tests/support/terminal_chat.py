"""`gpt-oss-server run` with forced-token scripts, for the tests that drive it in a terminal.

    python -m tests.support.terminal_chat SCRIPTS.json PROMPTS.jsonl [run's flags and MODEL]

The same command and code as `gpt-oss-server run` (its flags parsed by the same class), with
the engine's sampling hook set: SCRIPTS.json is a list of harmony texts, one per generation in
order (devkit.forced), and each generation's prompt is appended to PROMPTS.jsonl as
its harmony text, so a test reads what the model was given.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic_settings import CliApp

from devkit.forced import ForcedScript
from server.cli import Run
from server.harmony.encoding import load_encoding
from server.ops.chat.repl import run_chat


class RecordingScript(ForcedScript):
    """Forced scripts, and every prompt written to a file as it starts."""

    prompts_file: Path

    def __call__(self, prompt_tokens: Sequence[int]) -> Callable[[int], int] | None:
        text = self.encoding.decode(list(prompt_tokens))
        with self.prompts_file.open("a") as out:
            out.write(json.dumps(text) + "\n")
        return super().__call__(prompt_tokens)


def main(argv: list[str]) -> None:
    scripts, prompts, *flags = argv

    class ScriptedRun(Run):
        def cli_cmd(self) -> None:
            hook = RecordingScript(load_encoding(self.cache_dir / "vocab"))
            hook.prompts_file = Path(prompts)
            for text in json.loads(Path(scripts).read_text()):
                hook.push(text)
            settings = (
                self.model_copy(update={"model": (self.model_arg,)}) if self.model_arg else self
            )
            sys.exit(run_chat(settings, self.url, self.system, sampling_hook=hook))

    CliApp.run(ScriptedRun, cli_args=flags)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Codex CLI run headless, as the tests and the Codex-loop benchmark run it.

Where the pinned CLI lives (the pin: devkit/client_pins.py; the tests install it from
npm once per machine) and one `codex exec --json` run: its own CODEX_HOME (what `gpt-oss-server
codex-config` writes), stdin closed, no OpenAI key taken from the environment, its JSONL events
parsed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.client_pins import CODEX

CODEX_VERSION = CODEX.version  # the pin (devkit/client_pins.py) or its override


def codex_dir() -> Path:
    """$GPT_OSS_CODEX_DIR, or ~/.cache/gpt-oss-server/codex-<version>: where the CLI is
    installed (its binary: node_modules/.bin/codex)."""
    return CODEX.directory()


@dataclass
class CodexExec:
    """What `codex exec --json` did: its exit status, JSONL events and stderr."""

    returncode: int
    events: list[dict[str, Any]]
    stderr: str


def codex_exec(
    binary: Path,
    home: Path,
    workdir: Path,
    *args: str,
    timeout: float = 120,
    extra_env: Mapping[str, str] | None = None,
) -> CodexExec:
    """Codex on `args` (options, then the prompt) in `workdir`, with CODEX_HOME `home` (and
    `extra_env` in its environment)."""
    env = {**os.environ, **(extra_env or {}), "CODEX_HOME": str(home), "NO_COLOR": "1"}
    # Codex (0.171 on) runs shell commands in bubblewrap through a `codex-linux-sandbox` alias it
    # links under CODEX_HOME, and refuses to make one inside the temporary directory, where the
    # tests keep CODEX_HOME: it gets a temporary directory of its own, beside that.
    scratch = home / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(scratch)
    env.pop("OPENAI_API_KEY", None)
    result = subprocess.run(
        [str(binary), "exec", "--json", "--skip-git-repo-check", *args],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = result.stdout.splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return CodexExec(result.returncode, events, result.stderr)

"""The coding-agent CLIs the tests and benchmarks run, each pinned to one npm version, here only.

Each client installs (tests/support/npm_cli.py) into `~/.cache/gpt-oss-server/<key>-<version>`.
`GPT_OSS_<KEY>_VERSION` and `GPT_OSS_<KEY>_DIR` (KEY: CODEX, CLAUDE_CODE, PI, CLINE) run another
version from another directory: the release watch (`python -m scripts.release_watch`) runs the
end-to-end tests on the newest releases that way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from server.ops.settings import default_cache_dir


@dataclass(frozen=True)
class NpmClient:
    """A command-line client published on npm, at its pinned version."""

    key: str  # the cache directory's and the environment variables' name
    package: str
    pinned: str
    binary: str  # node_modules/.bin/<binary>

    @property
    def env_prefix(self) -> str:
        return "GPT_OSS_" + self.key.upper().replace("-", "_")

    @property
    def version(self) -> str:
        """The version to run: the pin, or $GPT_OSS_<KEY>_VERSION."""
        return os.environ.get(f"{self.env_prefix}_VERSION") or self.pinned

    def directory(self) -> Path:
        """Where it is installed: $GPT_OSS_<KEY>_DIR, or the cache's `<key>-<version>`."""
        override = os.environ.get(f"{self.env_prefix}_DIR")
        if override:
            return Path(override)
        return default_cache_dir() / f"{self.key}-{self.version}"

    def binary_path(self) -> Path:
        return self.directory() / "node_modules" / ".bin" / self.binary


CODEX = NpmClient("codex", "@openai/codex", "0.171.0", "codex")
CLAUDE_CODE = NpmClient("claude-code", "@anthropic-ai/claude-code", "2.1.332", "claude")
PI = NpmClient("pi", "@mariozechner/pi-coding-agent", "0.73.1", "pi")
CLINE = NpmClient("cline", "cline", "3.0.65", "cline")
CLIENTS = (CODEX, CLAUDE_CODE, PI, CLINE)

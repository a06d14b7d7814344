"""`gpt-oss-server codex-config`: a Codex CLI setup that runs on this server.

Two files in the Codex home (`$CODEX_HOME`, default `~/.codex`): `config.toml` with a model
provider that speaks the Responses API (`wire_api = "responses"`) to this server, and a model
catalog entry for gpt-oss. Codex 0.169 knows nothing about gpt-oss: without the catalog it uses
fallback metadata and offers no apply_patch tool at all; the entry makes it offer its freeform
apply_patch tool, gives it the server's context window (for its compaction), and says that the
server writes reasoning summaries, so that Codex passes its `model_reasoning_summary` setting on.
Summaries are off by default (`default_reasoning_summary = "none"`): each one is an extra short
generation per tool round, and the response (the next tool call) waits for it; turn them on with
`--reasoning-summary auto` here, or per run with `codex -c model_reasoning_summary=auto`. Codex
shows a summary as its reasoning item; the raw chain of thought only with
`show_raw_agent_reasoning = true`. The entry's base instructions are Codex's own default
prompt (`codex_catalog_template.json`, taken from Codex 0.169's requests).

The provider speaks the Responses API over a WebSocket (`supports_websockets = true`, the
server's socket on /v1/responses: one socket per Codex run, each tool round sending only its
new items); `--no-websockets` writes `false`, and Codex then POSTs every request.

Without `--write` the files are printed. With it, an existing file with other content is never
replaced silently: the command refuses, unless `--force`, which keeps the old file as `.bak`.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROVIDER_ID = "gpt-oss-server"
CONFIG_NAME = "config.toml"
CATALOG_NAME = "gpt-oss-catalog.json"
TEMPLATE = Path(__file__).with_name("codex_catalog_template.json")
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MODEL = "gpt-oss-20b"
DEFAULT_CONTEXT = 32768
FIRST_PROMPT_TOKENS = 8000  # Codex's first request renders to ≈5.5k-7.3k harmony tokens
CPU_PREFILL_PER_CORE = 10.0  # tokens/s per core for gpt-oss-20b on a CPU, a rough floor


class CodexConfigError(Exception):
    """The setup cannot be written as asked; the message says what to do."""


@dataclass(frozen=True)
class CodexSetup:
    """What the Codex configuration says about this server."""

    base_url: str = DEFAULT_BASE_URL
    model: str = DEFAULT_MODEL
    context_window: int = DEFAULT_CONTEXT
    stream_idle_timeout_ms: int = 300_000
    reasoning_effort: str = "medium"
    reasoning_summary: str = "none"  # auto | concise | detailed: what Codex asks for by default
    env_key: str | None = None  # environment variable holding the server's API key
    websockets: bool = True  # Codex speaks the Responses API over a WebSocket to the server


def idle_timeout_ms(cpus: int | None = None, *, gpu: bool = False) -> int:
    """A stream idle timeout that survives the first prompt's evaluation on this machine.

    The server sends events while it evaluates a prompt, so this is a safety net for servers
    that do not; on a CPU, allow twice the time an 8k-token prompt takes at a modest rate.
    """
    if gpu:
        return 300_000
    cores = cpus or os.cpu_count() or 1
    seconds = 2 * FIRST_PROMPT_TOKENS / (cores * CPU_PREFILL_PER_CORE)
    return int(min(3600.0, max(300.0, seconds)) * 1000)


def catalog(setup: CodexSetup) -> dict[str, Any]:
    """The model catalog (`model_catalog_json`) with one gpt-oss entry."""
    template = json.loads(TEMPLATE.read_text(encoding="utf-8"))
    entry = dict(template["models"][0])
    entry.update(
        slug=setup.model,
        display_name=setup.model,
        description=f"{setup.model} served by gpt-oss-server",
        apply_patch_tool_type="freeform",
        supports_reasoning_summaries=True,
        supports_reasoning_summary_parameter=True,
        default_reasoning_summary=setup.reasoning_summary,
        supports_parallel_tool_calls=False,
        context_window=setup.context_window,
        max_context_window=setup.context_window,
        default_reasoning_level=setup.reasoning_effort,
    )
    return {"models": [entry]}


def config_toml(setup: CodexSetup, catalog_path: Path) -> str:
    """config.toml: the model, the catalog, and a Responses-API provider for this server."""
    lines = [
        "# Codex CLI on gpt-oss-server (written by `gpt-oss-server codex-config`).",
        f"model = {_toml(setup.model)}",
        f"model_provider = {_toml(PROVIDER_ID)}",
        f"model_reasoning_effort = {_toml(setup.reasoning_effort)}",
        f"model_catalog_json = {_toml(str(catalog_path))}",
        "",
        f"[model_providers.{PROVIDER_ID}]",
        'name = "gpt-oss-server (local gpt-oss)"',
        f"base_url = {_toml(setup.base_url)}",
        'wire_api = "responses"',
    ]
    if setup.env_key:
        lines.append(f"env_key = {_toml(setup.env_key)}")
    lines += [
        "request_max_retries = 2",
        "stream_max_retries = 2",
        f"stream_idle_timeout_ms = {setup.stream_idle_timeout_ms}",
    ]
    if setup.websockets:
        lines += [
            "# One WebSocket per Codex run: each tool round sends only its new items, and the",
            "# conversation stays in the server's KV cache. To use HTTP instead, set this to",
            "# false (or start the server with --no-websocket: Codex then falls back at once).",
            "supports_websockets = true",
        ]
    else:
        lines.append("supports_websockets = false  # HTTP (POST /v1/responses) only")
    return "\n".join(lines) + "\n"


def files(setup: CodexSetup, codex_home: Path) -> dict[Path, str]:
    """The files of the setup and their content."""
    catalog_path = codex_home.expanduser().resolve() / CATALOG_NAME
    return {
        catalog_path.parent / CONFIG_NAME: config_toml(setup, catalog_path),
        catalog_path: json.dumps(catalog(setup), indent=2, ensure_ascii=False) + "\n",
    }


def write(setup: CodexSetup, codex_home: Path, *, force: bool = False) -> list[Path]:
    """Write the setup; refuses to replace other content unless `force` (then keeps a .bak)."""
    planned = files(setup, codex_home)
    clashes = [
        path
        for path, content in planned.items()
        if path.exists() and path.read_text(encoding="utf-8") != content
    ]
    if clashes and not force:
        names = ", ".join(str(path) for path in clashes)
        raise CodexConfigError(
            f"{names} already exist(s) with other content; nothing was written. Run again with "
            "--force to replace (the old file is kept as .bak), or choose another Codex home "
            "with --codex-home DIR and start Codex with CODEX_HOME=DIR."
        )
    written = []
    for path, content in planned.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if path in clashes:
            backup = path.with_name(path.name + ".bak")
            path.replace(backup)
            log.warning("kept the previous %s as %s", path.name, backup)
        path.write_text(content, encoding="utf-8")
        written.append(path)
    return written


def render(setup: CodexSetup, codex_home: Path) -> str:
    """Both files as text, each under a header naming where `--write` puts it."""
    return "".join(
        f"# ---- {path} ----\n{content}" for path, content in files(setup, codex_home).items()
    )


def default_codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


def served_model(base_url: str, api_key: str | None = None) -> tuple[str, int] | None:
    """The model id and context window a running server reports, or None if none answers."""
    request = urllib.request.Request(f"{base_url.rstrip('/')}/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            model = json.load(response)["data"][0]
        return str(model["id"]), int(model["context_length"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        log.info("no server answered at %s (%s); using defaults", base_url, exc)
        return None


def _toml(value: str) -> str:
    """A TOML basic string (JSON string escapes are valid TOML escapes)."""
    return json.dumps(value)

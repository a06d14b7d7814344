"""Settings: one pydantic-settings model for flags, environment (GPT_OSS_*), config file, defaults.

Precedence: command-line flags > environment variables > the TOML config file (--config PATH or
$GPT_OSS_CONFIG, see server.ops.config_file) > defaults.
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from server.engine.rpc.hosts import is_loopback, split_endpoint
from server.ops.config_file import ConfigFileSource


def _endpoint_list(value: object) -> object:
    """--rpc "h1:p1,h2:p2" (flag, variable) or a TOML list: a tuple of checked HOST:PORT."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return value  # pydantic reports the type error
    named = (str(item).strip() for item in items)
    endpoints = tuple(dict.fromkeys(endpoint for endpoint in named if endpoint))  # once each
    for endpoint in endpoints:
        split_endpoint(endpoint)  # ValueError: not HOST:PORT
    return endpoints


def _name_list(value: object) -> object:
    """--allowed-hosts "a,b" (flag, variable) or a TOML list: a tuple of lower-case names."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return value  # pydantic reports the type error
    return tuple(dict.fromkeys(str(item).strip().lower() for item in items if str(item).strip()))


def _model_list(value: object) -> object:
    """--model A --model B (the flag repeated: the values come comma-joined), --model A,B, a
    variable, or a TOML list: a tuple of specs, each once."""
    if isinstance(value, str):
        value = value.split(",")
    if isinstance(value, list | tuple):
        return tuple(dict.fromkeys(str(item).strip() for item in value if str(item).strip()))
    return value  # pydantic reports the type error


def _alias_list(value: object) -> object:
    """--model-aliases "a,b" (flag, variable) or a TOML list: a tuple of names, each once."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return value  # pydantic reports the type error
    return tuple(dict.fromkeys(str(item).strip() for item in items if str(item).strip()))


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> object:
    """A duration as Ollama's keep_alive writes it ("5m", "1h30m", "90s", "500ms", or bare
    seconds) -> seconds; "0", "off", "none" or "" -> None (off)."""
    if value is None or isinstance(value, int | float):
        return None if value is None or value == 0 else float(value)
    if not isinstance(value, str):
        return value  # pydantic reports the type error
    text = value.strip().lower()
    if text in ("", "0", "off", "none", "false"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(number + unit for number, unit in parts) != text:
            raise ValueError(
                f"{value!r} is not a duration: write it as 90s, 5m, 1h30m or seconds"
            ) from None
        seconds = sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)
    return None if seconds == 0 else seconds


def default_cache_dir() -> Path:
    """The server's cache directory (vocabulary, prompt cache, test models): gpt-oss-server in
    $XDG_CACHE_HOME, or in ~/.cache where that is unset or empty."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "gpt-oss-server"


def default_responses_store() -> Path:
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "gpt-oss-server" / "responses.sqlite3"


def default_prompt_cache_dir() -> Path:
    return default_cache_dir() / "kv"


class ModelOptions(BaseModel):
    """The settings one served model may set for itself (the config file's `[models.NAME]`
    tables); the others are the server's, shared by every model."""

    model_config = ConfigDict(extra="forbid")

    served_model_name: str | None = None
    model_aliases: Annotated[tuple[str, ...] | None, BeforeValidator(_alias_list)] = None
    n_ctx: int | None = Field(None, ge=0)
    n_slots: int | None = Field(None, ge=1, le=64)
    max_waiting: int | None = Field(None, ge=0)
    n_threads: int | None = Field(None, ge=1)
    n_threads_batch: int | None = Field(None, ge=1)
    n_gpu_layers: Annotated[int, Field(ge=-1)] | Literal["auto", "all"] | None = None
    cpu_moe: bool | None = None
    n_cpu_moe: int | None = Field(None, ge=0)
    speculative: Literal["auto", "on", "off"] | None = None
    draft_max: int | None = Field(None, ge=0, le=64)
    batch_invariant: bool | None = None
    swa_full: bool | None = None
    idle_unload: Annotated[float | None, BeforeValidator(parse_duration)] = Field(None, gt=0)


class Settings(BaseSettings):
    """Everything the server can be told."""

    model_config = SettingsConfigDict(
        env_prefix="GPT_OSS_", extra="ignore", cli_kebab_case=True, cli_implicit_flags=True
    )

    config: Path | None = Field(
        None,
        description="TOML file of settings, keyed by these options' names (n_ctx = 65536); "
        "flags and GPT_OSS_* variables win over it.",
    )
    model: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_model_list)] = Field(
        ("gpt-oss-20b",),
        min_length=1,
        description="Catalog alias (gpt-oss-20b, gpt-oss-120b), a path to a .gguf file, or a "
        "Hugging Face repo as owner/name[:file.gguf]. Repeat it to serve several models: a "
        "request's `model` picks one, loaded on demand within --models-memory (the first is "
        "loaded at start and answers requests that name no model).",
    )
    models_dir: Path | None = Field(
        None,
        description="Serve every gpt-oss GGUF in this directory too (each under its file name "
        "without .gguf; a split model by its first part), after the --model ones.",
    )
    models_memory_gb: float | None = Field(
        None,
        gt=0,
        description="With several models: the memory (GiB) the models loaded together may take, "
        "each counted by its estimate from its GGUF header at its context (weights, KV cache, "
        "compute buffer). Default: the GPUs' free memory at start, less --gpu-margin-mb each; "
        "without a GPU, the system memory available at start less 1 GiB. A model that needs "
        "more than the whole budget loads alone. The least recently used idle model is "
        "unloaded to make room; one with requests in flight never is.",
    )
    models_max: int | None = Field(
        None,
        ge=1,
        description="With several models: the most loaded at once (default: as many as "
        "--models-memory holds).",
    )
    models: dict[str, ModelOptions] = Field(
        default_factory=dict,
        description="Per-model settings, in the config file as [models.NAME] tables (NAME: the "
        "--model value or the model's id): n_ctx, n_slots, max_waiting, n_threads, "
        "n_threads_batch, n_gpu_layers, cpu_moe, n_cpu_moe, speculative, draft_max, "
        "batch_invariant, swa_full, idle_unload, served_model_name, model_aliases.",
    )
    served_model_name: str | None = Field(
        None, description="Model id reported by /v1/models; default: the alias or file name."
    )
    model_aliases: Annotated[tuple[str, ...] | None, NoDecode, BeforeValidator(_alias_list)] = (
        Field(
            None,
            description="Other names the model answers to, NAME[,NAME...]: listed by /v1/models "
            "and Ollama's /api/tags, so `codex --oss` finds its model. Default: Ollama's and LM "
            "Studio's names for the model's size (gpt-oss:20b and openai/gpt-oss-20b; 120b for "
            "a model of 60B parameters or more); '' for none.",
        )
    )
    host: str = Field("127.0.0.1", description="Address to bind.")
    allowed_hosts: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_name_list)] = Field(
        (),
        description="Host names requests may address the server by, besides localhost, IP "
        "addresses and --host (a guard against DNS rebinding: a web page whose name points at "
        "this machine): NAME[,NAME...], *.example.com for every subdomain, * for any (only "
        "behind a reverse proxy that checks the Host itself). Browsers' requests from another "
        "origin are refused unless their origin's host is listed here.",
    )
    port: int = Field(8000, ge=1, le=65535, description="Port to bind.")
    shutdown_grace_s: float = Field(
        8.0,
        ge=0,
        description="On SIGTERM or Ctrl-C, seconds in-flight requests may take to finish; then "
        "their generations are stopped and each stream ends with its terminal event. Under "
        "Docker's default 10 s stop timeout.",
    )
    python_tool: bool = Field(
        False,
        description="Offer gpt-oss's python tool, run by the server: a stateful kernel per "
        "conversation in a bubblewrap sandbox with a seccomp filter (no network, no host files "
        "but the system's, a private /mnt/data) and a cgroup of its own (memory, processes and "
        "CPU bounded for the sandbox as a whole). Needs Linux, bubblewrap and a cgroup (root, "
        "or a delegated cgroup v2 scope); where its sandbox cannot run, the tool stays off and "
        "the start-up log says why.",
    )
    python_tool_interpreter: str | None = Field(
        None,
        description="The python the sandbox runs (default: the system's /usr/bin/python3). "
        "Its packages are what the model can import; it must be reachable by an unprivileged "
        "user when the server runs as root.",
    )
    python_tool_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="Wall-clock time of one python call."
    )
    python_tool_memory_mb: int = Field(
        1024,
        ge=64,
        description="Memory of one python sandbox, in MiB: all its processes and the files in "
        "its /tmp, /dev/shm and /mnt/data together (its cgroup), and the address space of each "
        "process.",
    )
    python_tool_cpu_cores: float = Field(
        1.0,
        gt=0,
        le=256,
        description="CPU one python sandbox may use, in cores, all its processes together.",
    )
    python_tool_data_mb: int = Field(
        256,
        ge=1,
        description="Size of a python sandbox's /mnt/data, in MiB (kept for the conversation; "
        "counted in its memory).",
    )
    python_tool_without_cgroup: bool = Field(
        False,
        description="Run the python tool even where no cgroup can be made for its sandboxes, "
        "with per-process limits only: memory, CPU time and processes are then bounded for "
        "each process, not for the sandbox, and threads a call started can run between calls.",
    )
    python_tool_max_kernels: int = Field(
        4, ge=1, le=256, description="Python kernels alive at once (one per conversation)."
    )
    python_tool_idle_s: float = Field(
        600.0, gt=0, description="A python kernel idle this long is closed, its files removed."
    )
    python_tool_uid: int = Field(
        64000,
        ge=1,
        description="The unprivileged user (and group) a root server runs sandboxes as.",
    )
    browser_tool: bool = Field(
        False,
        description="Offer gpt-oss's browser tool, run by the server: search (through "
        "--browser-search-url), open and find. Pages on private, loopback and link-local "
        "addresses are refused.",
    )
    browser_search_url: str | None = Field(
        None,
        description="A SearXNG-compatible search endpoint (GET URL?q=...&format=json), for "
        "the browser tool's search; without it the browser only opens URLs.",
    )
    browser_allow_private: bool = Field(
        False,
        description="Let the browser tool open private, loopback and link-local addresses "
        "(for tests against local pages; it lets the model reach this machine's services).",
    )
    idle_unload: Annotated[float | None, BeforeValidator(parse_duration)] = Field(
        None,
        gt=0,
        description="Unload the model after this long without a request (90s, 5m, 1h; 0 or off: "
        "never, the default), giving its GPU and host memory back; the next request loads it "
        "again (waiting in the queue meanwhile) and the prompt cache on disk spares it the "
        "prompt it has seen. Off by default: a reload costs seconds to minutes.",
    )
    n_ctx: int = Field(
        32768,
        ge=0,
        description="Context window in tokens (0: the model's full 131072). The KV cache costs "
        "about 48 KiB per token for gpt-oss-20b with the full-size sliding-window cache.",
    )
    n_slots: int = Field(
        4,
        ge=1,
        le=64,
        description="Sequences in the context: conversations whose KV cache is kept (a Codex "
        "session with sub-agents, several users) and requests generated in parallel. They share "
        "the n_ctx cells; the least recently used idle conversation gives way when full.",
    )
    max_request_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted (HTTP 413 beyond it).",
    )
    max_waiting: int = Field(
        64,
        ge=0,
        description="Requests that may wait for a free sequence; beyond that new requests get "
        "HTTP 429 with Retry-After.",
    )
    history_max_entries: int = Field(
        4096,
        ge=1,
        description="Generated messages remembered for exact-token replay (least recently used "
        "first out): clients send output back as text, and replaying the exact sampled tokens "
        "keeps the KV cache valid. A few KiB each.",
    )
    prefill_chunk: int = Field(
        512,
        ge=1,
        description="Prompt tokens evaluated per step while other requests are generating, so "
        "their streams keep flowing.",
    )
    n_batch: int = Field(2048, ge=1, description="Prompt tokens evaluated per llama_decode call.")
    n_ubatch: int = Field(512, ge=1, description="Physical batch size inside llama.cpp.")
    n_threads: int | None = Field(
        None, ge=1, description="Threads for generation; default: every CPU this process may use."
    )
    n_threads_batch: int | None = Field(
        None, ge=1, description="Threads for prompt evaluation; default: same as n_threads."
    )
    n_gpu_layers: Annotated[int, Field(ge=-1)] | Literal["auto", "all"] = Field(
        "auto",
        description="Layers to offload to the GPU: auto (what fits the free GPU memory, keeping "
        "MoE experts on the CPU as needed; 0 on a CPU-only build), all (or -1), or a number. "
        "Needs a CUDA build of llama-cpp-python.",
    )
    cpu_moe: bool = Field(
        False, description="Keep the MoE expert tensors of every layer in system memory."
    )
    n_cpu_moe: int = Field(
        0,
        ge=0,
        description="Keep the MoE expert tensors of the first N layers in system memory "
        "(with auto: at least these; auto adds more until the rest fits the GPU).",
    )
    gpu_margin_mb: int = Field(
        1024, ge=0, description="GPU memory (MiB) that --n-gpu-layers auto leaves free per GPU."
    )
    rpc: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_endpoint_list)] = Field(
        (),
        description="Offload layers to llama.cpp rpc-server hosts too: HOST:PORT[,HOST:PORT...] "
        "(their devices count as GPUs for --n-gpu-layers). Needs llama-cpp-python built with "
        "RPC; rpc-server is unauthenticated, so hosts other than this one need "
        "--rpc-trust-network.",
    )
    rpc_trust_network: bool = Field(
        False,
        description="Allow --rpc hosts that are not this machine (loopback). Only on a network "
        "you trust: rpc-server has no authentication or encryption.",
    )
    rpc_timeout_s: float = Field(
        5.0, gt=0, description="Seconds to wait for each --rpc host to answer at start-up."
    )
    use_mmap: bool = Field(
        False,
        description="Memory-map the model file. Off by default: on CPU llama.cpp repacks the "
        "MXFP4 experts, and with mmap both copies stay resident (≈21.5 GiB instead of ≈12 GiB "
        "for gpt-oss-20b).",
    )
    flash_attn: Literal["auto", "on", "off"] = Field("auto", description="Flash attention.")
    swa_full: bool = Field(
        True,
        description="Full-size cache for the sliding-window layers, so the KV cache can roll "
        "back to any earlier prefix (costs ≈24 KiB per token of context for gpt-oss-20b).",
    )
    speculative: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Speculative decoding from the context: drafts copied from the sequence's own "
        "tokens, verified exactly in the batch (the output is what it would be without). auto: on "
        "where the verify cost measured at start lets drafts pay, and each sequence drafts only "
        "while its drafts are accepted often enough to pay; on: draft whatever the context "
        "offers, cost unweighed. Needs the full-size sliding-window cache.",
    )
    draft_max: int = Field(
        16, ge=0, le=64, description="The most drafted tokens verified in one step."
    )
    backend_sampling: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Draw free text (no grammar, logprobs, top-k/top-p/min-p) inside the "
        "model's graph with llama.cpp's backend sampler, so only the token comes back; headers "
        "and everything else are sampled on the host. auto: on where it measured faster (the "
        "output layer on a GPU, speculation off); off on the CPU (docs/sampling.md).",
    )
    batch_invariant: bool = Field(
        False,
        description="A request's tokens depend on the request alone, not on what else the "
        "server runs (reproducible evaluations): each sequence is evaluated in llama_decode calls "
        "of its own, its prompt in fixed chunks from the first token, reusing no prefix another "
        "request computed, its drafts weighed by its own acceptance, its KV cells its own (each "
        "sequence holds n_ctx / n_slots tokens). Costs throughput under concurrency and every "
        "prompt's full prefill (docs/speculative.md#batch-invariant-mode).",
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Default sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Default nucleus sampling threshold.")
    seed: int | None = Field(
        None,
        ge=0,
        description="Default sampling seed: a request that gives none (Anthropic's Messages has "
        "no `seed`) draws from this one, so the same request gives the same tokens (reproducible "
        "runs and tests). Unset: each such request draws afresh.",
    )
    conversation_date: datetime.date | None = Field(
        None,
        description="The date (YYYY-MM-DD) the system message gives the model instead of "
        "today's: reproducible runs (evaluations, tests) whose prompts are the same tokens on "
        "any day.",
    )
    reasoning_effort: Literal["low", "medium", "high"] = Field(
        "medium", description="Reasoning effort when a request does not say."
    )
    reasoning_visibility: Literal["raw", "summary", "none"] = Field(
        "raw",
        description="What clients may see of the model's chain of thought, in both APIs: raw "
        "(the reasoning, plus summaries when a request asks for them), summary (a summary "
        "written by the same model replaces it in every output; the raw text never leaves the "
        "server but is kept for the tool loop), none (no reasoning at all). For deployments "
        "that face end users: OpenAI advises against showing raw chain of thought to them.",
    )
    summary_max_tokens: int = Field(
        512,
        ge=16,
        description="Most tokens of one reasoning summary's generation (its own short reasoning "
        "included; the answer is forced to start halfway).",
    )
    reasoning_content: bool = Field(
        True,
        description="Also send Chat Completions reasoning as `reasoning_content` (the name "
        "llama.cpp and DeepSeek clients read), besides `reasoning`.",
    )
    api_key: SecretStr | None = Field(
        None,
        description="When set, every /v1 request must carry `Authorization: Bearer <key>`.",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where the server keeps its own files (the o200k vocabulary copy); default: "
        "$XDG_CACHE_HOME/gpt-oss-server (~/.cache/gpt-oss-server).",
    )
    download_dir: Path | None = Field(
        None, description="Hugging Face cache for model downloads; default: huggingface-hub's."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Logging level."
    )
    responses_store_path: Path = Field(
        default_factory=default_responses_store,
        description="SQLite file of the /v1/responses store (store=true, previous_response_id); "
        "default: $XDG_DATA_HOME/gpt-oss-server/responses.sqlite3 (~/.local/share/...). Its "
        "directory is the server's private state directory (also the thinking-signature key).",
    )
    responses_store_max_entries: int = Field(
        1000, ge=1, description="Most responses kept in the store; the oldest go first."
    )
    responses_store_max_mb: int = Field(
        256, ge=1, description="Most megabytes of responses kept in the store."
    )
    responses_keepalive_s: float = Field(
        5.0,
        gt=0,
        description="Seconds without output (e.g. a long prompt being evaluated) after which a "
        "/v1/responses stream sends a response.in_progress event; Codex resets its idle timer "
        "only on real events.",
    )
    responses_reasoning_events: Literal["openai", "open-responses"] = Field(
        "openai",
        description="Names of the /v1/responses events that stream raw reasoning text: openai "
        "(response.reasoning_text.delta / .done, what OpenAI's API sends and Codex and the "
        "OpenAI SDKs read) or open-responses (response.reasoning.delta / .done, the Open "
        "Responses specification's names). One name per event, never both: a client that "
        "knows both would read the text twice.",
    )
    websocket: bool = Field(
        True,
        description="Serve /v1/responses also over a WebSocket (Codex CLI's default transport: "
        "a socket per run, each tool round sending only its new items). --no-websocket "
        "answers the handshake with HTTP 426, on which Codex uses HTTP at once.",
    )
    # --- server-run tools (/v1/responses) ---
    mcp_config: Path | None = Field(
        None,
        description="MCP servers /v1/responses may use, in the `mcpServers` JSON format of "
        "Claude Desktop and Claude Code (stdio `command`/`args`/`env`, or HTTP `url`/`headers`). "
        "A request names one by its key as `server_label` in a tool of type `mcp`; the server "
        "lists its tools and runs the calls the model makes. Unset: no MCP.",
    )
    mcp_allowed_urls: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_alias_list)] = Field(
        (),
        description="MCP server URLs a request may name itself (`server_url`), exactly as "
        "written: URL[,URL...]. Any other URL a request gives is refused (a server that "
        "connects wherever a request says is an SSRF hole).",
    )
    tool_max_calls: int = Field(16, ge=1, description="Most server-run tool calls in one response.")
    tool_timeout_s: float = Field(
        60.0, gt=0, description="Seconds a server-run tool call may take; then it fails."
    )
    tool_max_output_chars: int = Field(
        20_000,
        ge=100,
        description="Most characters of a server-run tool's result the model reads; the rest "
        "is cut with a note to the model.",
    )
    messages_ping_s: float = Field(
        5.0,
        gt=0,
        description="Seconds without output (e.g. a long prompt being evaluated) after which a "
        "/v1/messages stream sends a `ping` event.",
    )
    # --- prompt cache on disk ---
    prompt_cache: bool = Field(
        True,
        description="Keep the KV state of evaluated prompt prefixes (instructions and tools, "
        "conversations) on disk, so a new session or the first request after a restart skips "
        "what was evaluated before. --no-prompt-cache turns it off.",
    )
    prompt_cache_dir: Path = Field(
        default_factory=default_prompt_cache_dir,
        description="Directory of the prompt cache; default: $XDG_CACHE_HOME/gpt-oss-server/kv "
        "(~/.cache/gpt-oss-server/kv). Several servers may share it.",
    )
    prompt_cache_gb: float = Field(
        8.0,
        gt=0,
        description="Disk budget of the prompt cache in GB (GiB); the least recently used "
        "entries are deleted beyond it.",
    )
    prompt_cache_min_tokens: int = Field(
        512, ge=1, description="Shortest prompt prefix saved to (and looked up on) disk."
    )
    stream_interval_ms: float = Field(
        10.0,
        ge=0,
        le=1000,
        description="Streams send at most one update per this many milliseconds while tokens "
        "come faster (the first token and the end are never held back): each update carries "
        "every token since the last, so a fast GPU does not pay a network write per token. "
        "0: every token as soon as it is sampled.",
    )
    strict_tools: bool = Field(
        True,
        description="Sample the arguments of every function tool under its JSON schema when "
        "the schema can be enforced exactly, even for tools marked `strict: false` (Codex marks "
        "all of its tools so); --no-strict-tools: any JSON object. Tools with `strict: true` "
        "always follow their schema.",
    )

    def today(self) -> str:
        """The date of a new conversation's system message: conversation_date, else today."""
        return (self.conversation_date or datetime.date.today()).isoformat()

    def model_options(self, *names: str) -> ModelOptions | None:
        """The `[models.NAME]` table of the first of `names` that has one."""
        return next((self.models[name] for name in names if name in self.models), None)

    def for_model(self, options: ModelOptions | None) -> Settings:
        """These settings with one model's own (its `[models.NAME]` table) over them."""
        if options is None:
            return self
        return self.model_copy(update=options.model_dump(exclude_unset=True))

    @property
    def state_dir(self) -> Path:
        """The private state directory: the responses store's, also the signing key's."""
        return self.responses_store_path.parent

    @model_validator(mode="after")
    def _rpc_hosts_allowed(self) -> Settings:
        for endpoint in self.rpc:
            host, _ = split_endpoint(endpoint)
            if not self.rpc_trust_network and not is_loopback(host):
                raise ValueError(
                    f"--rpc {endpoint}: {host} is not this machine, and rpc-server has no "
                    "authentication; add --rpc-trust-network if that network is trusted"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init) > environment > the config file > defaults."""
        config_file = ConfigFileSource(settings_cls)
        return init_settings, env_settings, dotenv_settings, config_file, file_secret_settings

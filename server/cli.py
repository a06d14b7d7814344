"""The `gpt-oss-server` command: serve, download."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import uvicorn
from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    CliApp,
    CliPositionalArg,
    CliSubCommand,
    SettingsConfigDict,
)

from server.app import create_app
from server.config import Settings
from server.errors import StartupError
from server.model_source import resolve_model
from server.runtime import Runtime, load_runtime

log = logging.getLogger("gpt_oss_server")


class Serve(Settings):
    """Load a gpt-oss model and serve the OpenAI-compatible API."""

    def cli_cmd(self) -> None:
        configure_logging(self.log_level)
        try:
            runtime = load_runtime(self)
        except StartupError as exc:
            log.error("%s", exc)
            sys.exit(1)
        print_banner(self, runtime)
        app = create_app(self, runtime)
        try:
            uvicorn.run(app, host=self.host, port=self.port, log_level=self.log_level)
        finally:
            runtime.close()


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


class Command(BaseSettings):
    """gpt-oss-server: run OpenAI's gpt-oss models locally behind an OpenAI-compatible API."""

    model_config = SettingsConfigDict(
        cli_prog_name="gpt-oss-server", cli_kebab_case=True, cli_implicit_flags=True
    )

    serve: CliSubCommand[Serve] = Field(description=Serve.__doc__)
    download: CliSubCommand[Download] = Field(description=Download.__doc__)

    def cli_cmd(self) -> None:
        CliApp.run_subcommand(self)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if level != "debug":
        logging.getLogger("llama_cpp").setLevel(logging.WARNING)


def print_banner(settings: Settings, runtime: Runtime) -> None:
    info = runtime.engine.info
    url = f"http://{settings.host}:{settings.port}/v1"
    log.info(
        "serving %s (%s, %.1f GB) with a %d-token context on %s",
        runtime.model_name,
        info.description,
        info.size_bytes / 1e9,
        info.n_ctx,
        "GPU" if settings.n_gpu_layers else "CPU",
    )
    log.info(
        "OpenAI-compatible API at %s; try:\n  curl %s/chat/completions -H 'Content-Type: "
        'application/json\' -d \'{"model": "%s", "messages": [{"role": "user", "content": '
        '"Hello"}]}\'',
        url,
        url,
        runtime.model_name,
    )


def main(argv: list[str] | None = None) -> None:
    CliApp.run(Command, cli_args=sys.argv[1:] if argv is None else argv)

"""`python -m server.bench --model PATH [...]`: the same benchmark as `gpt-oss-server bench`."""

from __future__ import annotations

import sys

from pydantic_settings import BaseSettings, CliApp, SettingsConfigDict

from server.bench.options import BenchOptions


class BenchCommand(BaseSettings, BenchOptions):
    """Prefill and decode tokens/s, time to first token and peak memory, side by side."""

    model_config = SettingsConfigDict(
        env_prefix="GPT_OSS_BENCH_",
        cli_prog_name="python -m server.bench",
        cli_kebab_case=True,
        cli_implicit_flags=True,
    )


def main(argv: list[str] | None = None) -> None:
    CliApp.run(BenchCommand, cli_args=sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()

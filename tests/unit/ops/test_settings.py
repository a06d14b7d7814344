"""Settings precedence: command-line flags > GPT_OSS_* environment > config file > defaults."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import CliApp

from devkit import models
from server.cli import Command, Serve, main
from server.contracts.errors import ConfigFileError
from server.ops.settings import Settings
from server.ops.startup import engine_config


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read the process environment: the developer's GPT_OSS_* must not leak in."""
    for name in ("GPT_OSS_CONFIG", "GPT_OSS_N_CTX", "GPT_OSS_N_GPU_LAYERS", "GPT_OSS_CPU_MOE",
                 "GPT_OSS_CONVERSATION_DATE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpt-oss-server.toml"
    path.write_text(text, encoding="utf-8")
    return path


def parse_serve(args: list[str]) -> Serve:
    return CliApp.run(Serve, cli_args=args, cli_cmd_method_name="")


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPT_OSS_MODEL", "GPT_OSS_PORT", "GPT_OSS_N_CTX"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.model == ("gpt-oss-20b",)
    assert settings.host == "127.0.0.1"
    assert settings.port == 8000
    assert settings.use_mmap is False
    assert settings.swa_full is True


def test_environment_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPT_OSS_PORT", "9001")
    monkeypatch.setenv("GPT_OSS_USE_MMAP", "true")
    settings = Settings()
    assert settings.port == 9001
    assert settings.use_mmap is True


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPT_OSS_PORT", "9001")
    monkeypatch.setenv("GPT_OSS_N_CTX", "8192")
    serve = parse_serve(["--port", "9002", "--no-swa-full"])
    assert serve.port == 9002
    assert serve.n_ctx == 8192
    assert serve.swa_full is False


def test_invalid_values_are_refused() -> None:
    with pytest.raises(ValueError, match="port"):
        Settings(port=0)


def test_config_file_sits_between_environment_and_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = write_config(tmp_path, "port = 9100\nn_ctx = 16384\nn-gpu-layers = 10\n")
    monkeypatch.setenv("GPT_OSS_PORT", "9001")
    serve = parse_serve(["--config", str(config), "--n-gpu-layers", "all"])
    assert serve.config == config
    assert serve.n_ctx == 16384  # file > default 32768
    assert serve.port == 9001  # environment > file
    assert serve.n_gpu_layers == "all"  # flag > file
    assert serve.host == "127.0.0.1"  # neither: the default


def test_config_file_named_by_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = write_config(tmp_path, 'model = "gpt-oss-120b"\ncpu_moe = true\nn_ctx = 8192\n')
    monkeypatch.setenv("GPT_OSS_CONFIG", str(config))
    settings = Settings()
    assert (settings.model, settings.cpu_moe, settings.n_ctx) == (("gpt-oss-120b",), True, 8192)
    assert parse_serve(["--n-ctx", "4096"]).n_ctx == 4096


def test_websocket_by_flag_or_config_file(tmp_path: Path) -> None:
    assert parse_serve([]).websocket is True
    assert parse_serve(["--no-websocket"]).websocket is False
    config = write_config(tmp_path, "websocket = false\n")
    assert parse_serve(["--config", str(config)]).websocket is False
    assert parse_serve(["--config", str(config), "--websocket"]).websocket is True


def test_config_file_through_the_serve_subcommand(tmp_path: Path) -> None:
    config = write_config(tmp_path, "n_cpu_moe = 12\nshutdown_grace_s = 2.5\n")
    command = CliApp.run(
        Command, cli_args=["serve", "--config", str(config)], cli_cmd_method_name="no_such_method"
    )
    assert command.serve is not None
    assert (command.serve.n_cpu_moe, command.serve.shutdown_grace_s) == (12, 2.5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n_ctx = 1024\nnot_a_setting = 1\n", "unknown settings: not_a_setting"),
        ('config = "other.toml"\n', "unknown settings: config"),
        ("n_ctx = \n", "is not valid TOML"),
    ],
)
def test_bad_config_files_are_named(tmp_path: Path, text: str, message: str) -> None:
    config = write_config(tmp_path, text)
    with pytest.raises(ConfigFileError, match=message):
        Settings(config=config)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="cannot read the config file"):
        Settings(config=tmp_path / "missing.toml")


def test_invalid_value_in_config_file(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="n_ctx"):
        Settings(config=write_config(tmp_path, "n_ctx = -5\n"))


def test_the_command_reports_a_bad_config_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = write_config(tmp_path, "colour = 'blue'\n")
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--config", str(config)])
    assert exited.value.code == 2
    assert "unknown settings: colour" in caplog.text


@pytest.mark.parametrize(
    ("value", "expected"), [("auto", "auto"), ("all", "all"), ("-1", -1), ("20", 20), ("0", 0)]
)
def test_n_gpu_layers_values(monkeypatch: pytest.MonkeyPatch, value: str, expected: object) -> None:
    assert parse_serve(["--n-gpu-layers", value]).n_gpu_layers == expected
    monkeypatch.setenv("GPT_OSS_N_GPU_LAYERS", value)
    assert Settings().n_gpu_layers == expected


def test_placement_defaults_and_refusals() -> None:
    settings = Settings()
    assert settings.n_gpu_layers == "auto"
    assert (settings.cpu_moe, settings.n_cpu_moe, settings.gpu_margin_mb) == (False, 0, 1024)
    with pytest.raises(ValidationError):
        Settings(n_gpu_layers="most")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Settings(n_gpu_layers=-2)
    with pytest.raises(ValidationError):
        Settings(n_cpu_moe=-1)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300.0), ("1h30m", 5400.0), ("90s", 90.0), ("500ms", 0.5), ("300", 300.0),
     ("1.5s", 1.5), ("0", None), ("off", None), ("", None)],
)  # fmt: skip
def test_idle_unload_takes_ollamas_durations(text: str, seconds: float | None) -> None:
    assert parse_serve(["--idle-unload", text]).idle_unload == seconds


def test_idle_unload_is_off_by_default() -> None:
    assert Settings().idle_unload is None


@pytest.mark.parametrize("text", ["5 minutes", "m", "5x", "-1", "1h-5m"])
def test_a_bad_idle_unload_names_the_option(text: str) -> None:
    with pytest.raises(ValidationError, match="idle_unload"):
        Settings(idle_unload=text)


def test_model_aliases_from_a_flag_or_automatic() -> None:
    assert parse_serve(["--model-aliases", "a:1, openai/b"]).model_aliases == ("a:1", "openai/b")
    assert parse_serve(["--model-aliases", ""]).model_aliases == ()
    assert Settings().model_aliases is None  # automatic: see server.ops.startup.model_aliases


def test_speculative_flags_reach_the_engine(tmp_path: Path) -> None:
    defaults = engine_config(Settings(), tmp_path / "model.gguf")
    assert (defaults.speculative, defaults.draft_max) == ("auto", 16)
    serve = parse_serve(["--speculative", "off", "--draft-max", "8"])
    config = engine_config(serve, tmp_path / "model.gguf")
    assert (config.speculative, config.draft_max) == ("off", 8)
    with pytest.raises(ValidationError):
        parse_serve(["--speculative", "sometimes"])
    with pytest.raises(ValidationError):
        Settings(draft_max=65)


def test_the_backend_sampling_flag_reaches_the_engine(tmp_path: Path) -> None:
    assert engine_config(Settings(), tmp_path / "model.gguf").backend_sampling == "auto"
    for mode in ("on", "off", "auto"):
        config = engine_config(parse_serve(["--backend-sampling", mode]), tmp_path / "m.gguf")
        assert config.backend_sampling == mode
    with pytest.raises(ValidationError):
        parse_serve(["--backend-sampling", "sometimes"])


def test_batch_invariant_flag_reaches_the_engine(tmp_path: Path) -> None:
    assert engine_config(Settings(), tmp_path / "model.gguf").batch_invariant is False
    serve = parse_serve(["--batch-invariant"])
    assert engine_config(serve, tmp_path / "model.gguf").batch_invariant is True


def test_conversation_date_by_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().today() == datetime.date.today().isoformat()
    assert parse_serve(["--conversation-date", "2024-02-29"]).today() == "2024-02-29"
    monkeypatch.setenv("GPT_OSS_CONVERSATION_DATE", "2025-01-31")
    assert Settings().today() == "2025-01-31"
    with pytest.raises(ValidationError, match="conversation_date"):
        Settings(conversation_date="2025-02-30")  # type: ignore[arg-type]


def test_every_cache_directory_follows_xdg_cache_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The server's files, the prompt cache and the test models: one rule, $XDG_CACHE_HOME
    where set (and not empty), ~/.cache otherwise."""
    monkeypatch.delenv("GPT_OSS_TEST_CACHE", raising=False)
    for name in ("GPT_OSS_CACHE_DIR", "GPT_OSS_PROMPT_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    for cache_home, expected in ((str(tmp_path), tmp_path), ("", Path.home() / ".cache")):
        monkeypatch.setenv("XDG_CACHE_HOME", cache_home)
        settings = Settings()
        assert settings.cache_dir == expected / "gpt-oss-server"
        assert settings.prompt_cache_dir == expected / "gpt-oss-server" / "kv"
        assert models.default_cache_dir() == expected / "gpt-oss-server" / "synthetic"


def test_model_repeated_gives_several() -> None:
    settings = parse_serve(["--model", "gpt-oss-20b", "--model", "/models/b.gguf"])
    assert settings.model == ("gpt-oss-20b", "/models/b.gguf")
    assert parse_serve(["--model", "/models/b.gguf"]).model == ("/models/b.gguf",)


def test_per_model_settings_come_from_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text(
        'model = ["gpt-oss-20b", "b.gguf"]\nn_ctx = 8192\n'
        '[models.b]\nn_ctx = 2048\nspeculative = "off"\nidle_unload = "5m"\n',
        encoding="utf-8",
    )
    settings = parse_serve(["--config", str(config)])
    assert settings.model == ("gpt-oss-20b", "b.gguf")
    own = settings.for_model(settings.model_options("b.gguf", "b"))
    assert (own.n_ctx, own.speculative, own.idle_unload) == (2048, "off", 300.0)
    assert own.n_slots == settings.n_slots  # what the table does not set is the server's
    assert settings.for_model(settings.model_options("gpt-oss-20b")).n_ctx == 8192


BAD_TABLES = [
    ("bogus = 1", "models.b.bogus"),
    ("n_ctx = -1", "models.b.n_ctx"),
    ('speculative = "sometimes"', "models.b.speculative"),
]


@pytest.mark.parametrize(("table", "named"), BAD_TABLES)
def test_a_bad_per_model_setting_is_named(tmp_path: Path, table: str, named: str) -> None:
    config = tmp_path / "server.toml"
    config.write_text(f"[models.b]\n{table}\n", encoding="utf-8")
    with pytest.raises(ValidationError, match=named.replace(".", r"\.")):
        parse_serve(["--config", str(config)])

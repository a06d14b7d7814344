"""Settings precedence: command-line flags > GPT_OSS_* environment > defaults."""

from __future__ import annotations

import pytest
from pydantic_settings import CliApp

from server.cli import Serve
from server.config import Settings


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPT_OSS_MODEL", "GPT_OSS_PORT", "GPT_OSS_N_CTX"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.model == "gpt-oss-20b"
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
    serve = CliApp.run(Serve, cli_args=["--port", "9002", "--no-swa-full"], cli_cmd_method_name="")
    assert serve.port == 9002
    assert serve.n_ctx == 8192
    assert serve.swa_full is False


def test_invalid_values_are_refused() -> None:
    with pytest.raises(ValueError, match="port"):
        Settings(port=0)

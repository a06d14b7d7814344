"""`gpt-oss-server codex-config`: the Codex config.toml and gpt-oss catalog it prints or writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic_settings import CliApp

from server.cli import Command
from server.ops.codex_config import (
    CONFIG_NAME,
    CodexConfigError,
    CodexSetup,
    catalog,
    config_toml,
    idle_timeout_ms,
    write,
)

tomllib = pytest.importorskip("tomllib")

SETUP = CodexSetup(
    base_url="http://127.0.0.1:9000/v1",
    model="gpt-oss-120b",
    context_window=65536,
    stream_idle_timeout_ms=900_000,
    env_key="GPT_OSS_API_KEY",
)


def test_config_toml_is_a_responses_provider(tmp_path: Path) -> None:
    config = tomllib.loads(config_toml(SETUP, tmp_path / "catalog.json"))
    assert config["model"] == "gpt-oss-120b"
    assert config["model_provider"] == "gpt-oss-server"
    assert config["model_catalog_json"] == str(tmp_path / "catalog.json")
    provider = config["model_providers"]["gpt-oss-server"]
    assert provider["wire_api"] == "responses"
    assert provider["base_url"] == "http://127.0.0.1:9000/v1"
    assert provider["stream_idle_timeout_ms"] == 900_000
    assert provider["env_key"] == "GPT_OSS_API_KEY"
    without_key = tomllib.loads(config_toml(CodexSetup(), tmp_path / "c.json"))
    assert "env_key" not in without_key["model_providers"]["gpt-oss-server"]


def test_config_toml_offers_the_websocket_and_says_how_to_turn_it_off(tmp_path: Path) -> None:
    text = config_toml(SETUP, tmp_path / "catalog.json")
    assert tomllib.loads(text)["model_providers"]["gpt-oss-server"]["supports_websockets"] is True
    assert "--no-websocket" in text  # the comment beside it
    http = CodexSetup(websockets=False)
    provider = tomllib.loads(config_toml(http, tmp_path / "c.json"))["model_providers"]
    assert provider["gpt-oss-server"]["supports_websockets"] is False


def test_catalog_entry_offers_freeform_apply_patch() -> None:
    (entry,) = catalog(SETUP)["models"]
    assert entry["slug"] == entry["display_name"] == "gpt-oss-120b"
    assert entry["apply_patch_tool_type"] == "freeform"
    assert entry["supports_reasoning_summaries"] is True  # the server writes summaries
    assert entry["supports_reasoning_summary_parameter"] is True
    assert entry["default_reasoning_summary"] == "none"  # only when asked: they cost a turn
    (summarized,) = catalog(CodexSetup(reasoning_summary="auto"))["models"]
    assert summarized["default_reasoning_summary"] == "auto"
    assert entry["context_window"] == entry["max_context_window"] == 65536
    assert entry["base_instructions"].startswith("You are a coding agent running in the Codex CLI")
    assert {level["effort"] for level in entry["supported_reasoning_levels"]} == {
        "low",
        "medium",
        "high",
    }


def test_idle_timeout_suits_the_machine() -> None:
    assert idle_timeout_ms(gpu=True) == 300_000
    assert idle_timeout_ms(64) == 300_000  # many cores: Codex's default is enough
    assert idle_timeout_ms(2) == 800_000  # a small CPU box: minutes of prefill
    assert idle_timeout_ms(1) == 1_600_000
    assert 300_000 <= idle_timeout_ms() <= 3_600_000


def test_write_never_replaces_other_content_silently(tmp_path: Path) -> None:
    config = tmp_path / CONFIG_NAME
    config.write_text('model = "mine"\n')
    with pytest.raises(CodexConfigError, match="--force"):
        write(SETUP, tmp_path)
    assert config.read_text() == 'model = "mine"\n'
    assert not (tmp_path / "gpt-oss-catalog.json").exists()  # nothing written at all
    written = write(SETUP, tmp_path, force=True)
    assert sorted(p.name for p in written) == [CONFIG_NAME, "gpt-oss-catalog.json"]
    assert (tmp_path / "config.toml.bak").read_text() == 'model = "mine"\n'
    assert write(SETUP, tmp_path) == written  # same content again: no clash


def test_cli_prints_or_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "codex"
    common = ["--codex-home", str(home), "--base-url", "http://127.0.0.1:9/v1"]
    CliApp.run(Command, cli_args=["codex-config", *common, "--model", "m", "--n-ctx", "1234"])
    printed = capsys.readouterr().out
    assert f"# ---- {home / CONFIG_NAME} ----" in printed
    assert not home.exists()
    CliApp.run(Command, cli_args=["codex-config", *common, "--write", "--gpu"])
    config = tomllib.loads((home / CONFIG_NAME).read_text())
    assert config["model"] == "gpt-oss-20b"  # no server answered: the default
    assert config["model_providers"]["gpt-oss-server"]["stream_idle_timeout_ms"] == 300_000
    entry = json.loads((home / "gpt-oss-catalog.json").read_text())["models"][0]
    assert entry["context_window"] == 32768
    assert config["model_providers"]["gpt-oss-server"]["supports_websockets"] is True
    CliApp.run(Command, cli_args=["codex-config", *common, "--no-websockets"])
    provider = tomllib.loads(capsys.readouterr().out.split("----\n", 1)[1].split("# ----")[0])
    assert provider["model_providers"]["gpt-oss-server"]["supports_websockets"] is False
    with pytest.raises(SystemExit) as exited:
        CliApp.run(Command, cli_args=["codex-config", *common, "--write", "--model", "other"])
    assert exited.value.code == 1

"""The names the model also answers to: Codex's --oss slugs for its size, or --model-aliases;
with several models, each name picks one."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.errors import StartupError
from server.engine.base import Engine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from server.ops.startup import directory_models, distinct_names, model_aliases, model_specs


def test_a_20b_model_answers_to_codexs_20b_slugs() -> None:
    assert model_aliases(Settings(), 20_914_757_184) == ("gpt-oss:20b", "openai/gpt-oss-20b")


def test_a_120b_model_answers_to_the_120b_slugs() -> None:
    assert model_aliases(Settings(), 116_829_156_672) == ("gpt-oss:120b", "openai/gpt-oss-120b")


def test_the_flag_replaces_them() -> None:
    assert model_aliases(Settings(model_aliases="mine"), 20_914_757_184) == ("mine",)
    assert model_aliases(Settings(model_aliases=""), 20_914_757_184) == ()


def named(name: str, *aliases: str) -> Runtime:
    """A runtime as far as its names go (distinct_names reads nothing else)."""
    return Runtime(cast(Engine, None), cast(HarmonyEncoding, None), name, aliases=aliases)


def test_an_alias_two_models_have_stays_with_the_first() -> None:
    first = named("gpt-oss-20b", "gpt-oss:20b", "openai/gpt-oss-20b")
    second = named("my-finetune", "gpt-oss:20b", "openai/gpt-oss-20b", "mine")
    distinct_names([first, second])
    assert first.names == ("gpt-oss-20b", "gpt-oss:20b", "openai/gpt-oss-20b")
    assert second.names == ("my-finetune", "mine")


def test_an_alias_cannot_take_another_models_id() -> None:
    first = named("a", "b")
    second = named("b")
    distinct_names([first, second])
    assert (first.names, second.names) == (("a",), ("b",))


def test_two_models_of_one_id_are_refused() -> None:
    with pytest.raises(StartupError, match="two models are named 'a'"):
        distinct_names([named("a"), named("a")])


def test_a_models_directory_serves_each_model_once(tmp_path: Path) -> None:
    for name in ("b.gguf", "a-00001-of-00002.gguf", "a-00002-of-00002.gguf", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub.gguf").mkdir()
    assert directory_models(tmp_path) == [tmp_path / "a-00001-of-00002.gguf", tmp_path / "b.gguf"]
    only_dir = Settings(models_dir=tmp_path)
    assert model_specs(only_dir) == [
        str(tmp_path / "a-00001-of-00002.gguf"),
        str(tmp_path / "b.gguf"),
    ]
    both = Settings(model="gpt-oss-20b", models_dir=tmp_path)
    assert model_specs(both)[0] == "gpt-oss-20b"
    assert len(model_specs(both)) == 3
    with pytest.raises(StartupError, match=r"no \.gguf file"):
        model_specs(Settings(models_dir=tmp_path / "sub.gguf"))

"""The names the model also answers to: Codex's --oss slugs for its size, or --model-aliases."""

from __future__ import annotations

from server.ops.settings import Settings
from server.ops.startup import model_aliases


def test_a_20b_model_answers_to_codexs_20b_slugs() -> None:
    assert model_aliases(Settings(), 20_914_757_184) == ("gpt-oss:20b", "openai/gpt-oss-20b")


def test_a_120b_model_answers_to_the_120b_slugs() -> None:
    assert model_aliases(Settings(), 116_829_156_672) == ("gpt-oss:120b", "openai/gpt-oss-120b")


def test_the_flag_replaces_them() -> None:
    assert model_aliases(Settings(model_aliases="mine"), 20_914_757_184) == ("mine",)
    assert model_aliases(Settings(model_aliases=""), 20_914_757_184) == ()

"""Offline loading of the harmony encoding, from every supported source."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import server.harmony.encoding as encoding_module
from server.contracts.errors import VocabularyNotFound
from server.engine.loading.gguf_header import vocabulary_bytes
from server.harmony.encoding import ENV_VAR, VOCAB_FILE, VOCAB_SHA256, ensure_vocab_dir


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def no_bpe_openai(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoding_module, "_from_bpe_openai", lambda: None)


def test_from_bpe_openai(tmp_path: Path, no_env: None) -> None:
    assert ensure_vocab_dir(tmp_path) == tmp_path
    assert (tmp_path / VOCAB_FILE).is_file()


def test_rebuilt_from_the_gguf_vocabulary(
    tmp_path: Path, tiny_gguf: Path, no_env: None, no_bpe_openai: None
) -> None:
    assert ensure_vocab_dir(tmp_path, lambda: vocabulary_bytes(tiny_gguf)) == tmp_path
    assert hashlib.sha256((tmp_path / VOCAB_FILE).read_bytes()).hexdigest() == VOCAB_SHA256


def test_existing_env_directory_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env: None
) -> None:
    assert ensure_vocab_dir(tmp_path / "first") == tmp_path / "first"
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "first"))
    assert ensure_vocab_dir(tmp_path / "second") == tmp_path / "first"
    assert not (tmp_path / "second").exists()


def test_wrong_vocabulary_is_rejected(tmp_path: Path, no_env: None, no_bpe_openai: None) -> None:
    with pytest.raises(VocabularyNotFound):
        ensure_vocab_dir(tmp_path, lambda: [b"a"] * 199998)


def test_no_source_is_a_clear_error(tmp_path: Path, no_env: None, no_bpe_openai: None) -> None:
    with pytest.raises(VocabularyNotFound) as raised:
        ensure_vocab_dir(tmp_path)
    message = str(raised.value)
    assert "pip install bpe-openai" in message
    assert ENV_VAR in message
    assert os.fspath(tmp_path) in message

"""Vocabulary: a model file's vocabulary alone (llama.cpp's vocab_only load), no weights.

What answers grammar checks and token texts while the model itself is unloaded (see
server.ops.residency): a few MB of host memory, read in well under a second.
"""

from __future__ import annotations

from typing import Any

import llama_cpp as lc


class Vocabulary:
    """The vocabulary of one GGUF file; `close()` frees it."""

    def __init__(self, model_path: str) -> None:
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.vocab_only = True
        self._model: Any = lc.llama_model_load_from_file(model_path.encode(), params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not read the vocabulary of {model_path}")
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))

    def validate_grammar(self, grammar: str) -> None:
        """Raise ValueError if llama.cpp cannot use this GBNF grammar."""
        sampler = lc.llama_sampler_init_grammar(self._vocab, grammar.encode(), b"root")
        if not sampler:
            raise ValueError("llama.cpp rejected the grammar")
        lc.llama_sampler_free(sampler)

    def token_text(self, token_id: int) -> str:
        if not 0 <= token_id < self.n_vocab:
            raise ValueError(f"token id {token_id} is outside the vocabulary")
        text = lc.llama_vocab_get_text(self._vocab, token_id)
        return text.decode("utf-8", errors="replace") if text else ""

    def close(self) -> None:
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None

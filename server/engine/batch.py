"""Batch: a llama_batch whose arrays are numpy buffers allocated once and reused every step.

llama_batch_init allocates one array per token for the sequence ids, which must then be written
one ctypes item at a time; here every field is a slice assignment into numpy arrays that the
llama_batch struct points at (each token belongs to exactly one sequence).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp.llama_cpp as lc
import numpy as np

from server.engine.base import BatchPart

__all__ = ["Batch", "BatchPart"]


class Batch:
    """Up to `capacity` tokens for one llama_decode; owns its memory (nothing to free)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.outputs = 0  # rows of logits the last batch filled keeps
        self._tokens = np.zeros(capacity, dtype=np.int32)
        self._pos = np.zeros(capacity, dtype=np.int32)
        self._n_seq_id = np.ones(capacity, dtype=np.int32)
        self._seq_id = np.zeros(capacity, dtype=np.int32)
        self._logits = np.zeros(capacity, dtype=np.int8)
        self._steps = np.arange(capacity, dtype=np.int32)
        int_p = ctypes.POINTER(ctypes.c_int32)
        base = self._seq_id.ctypes.data
        self._seq_ptrs = (int_p * capacity)(
            *(ctypes.cast(base + 4 * i, int_p) for i in range(capacity))
        )
        self.struct = lc.llama_batch(
            n_tokens=0,
            token=self._tokens.ctypes.data_as(int_p),
            embd=ctypes.POINTER(ctypes.c_float)(),  # NULL: tokens, not embeddings
            pos=self._pos.ctypes.data_as(int_p),
            n_seq_id=self._n_seq_id.ctypes.data_as(int_p),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(int_p)),
            logits=self._logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def fill(self, parts: Sequence[BatchPart]) -> list[int]:
        """Write the parts in order; the batch index of each part's last logits (-1: none kept;
        a part with `all_logits` has its tokens' logits at the indices just before)."""
        n = outputs = 0
        indices = []
        for part in parts:
            end = n + len(part.tokens)
            if end > self.capacity:
                raise ValueError(f"a batch holds at most {self.capacity} tokens")
            self._tokens[n:end] = part.tokens
            np.add(self._steps[: end - n], part.start_pos, out=self._pos[n:end])
            self._seq_id[n:end] = part.seq_id
            self._logits[n:end] = 0
            if part.all_logits:
                self._logits[n:end] = 1
                outputs += end - n
            elif part.logits:
                if not 0 < part.outputs <= len(part.tokens):
                    raise ValueError(f"{part.outputs} outputs asked of {len(part.tokens)} tokens")
                self._logits[end - part.outputs : end] = 1
                outputs += part.outputs
            indices.append(end - 1 if part.logits or part.all_logits else -1)
            n = end
        self.struct.n_tokens = n
        self.outputs = outputs  # rows of logits this batch keeps
        return indices

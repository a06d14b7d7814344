"""LlamaContext: a loaded gpt-oss model and its llama.cpp context, driven through the C API.

Owned by exactly one thread (the engine's worker). Knows how to evaluate tokens at positions of
sequence 0, trim the KV cache back to a prefix, and build llama.cpp's sampler chains. Logits
never leave llama.cpp: numpy views (sampling/numpy_sampler.py) and sampler chains read them in
place.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np

from server.contracts.directives import Constrain
from server.engine.base import EngineConfig, ModelInfo, SamplingParams, default_threads
from server.engine.batch import Batch, BatchPart
from server.engine.loading import offload
from server.engine.sampling.llama_chain import LlamaSamplerChain
from server.engine.sampling.numpy_sampler import Workspace
from server.engine.stop_flag import StopFlag

__all__ = ["BatchPart", "DecodeError", "LlamaContext"]

log = logging.getLogger(__name__)
llama_log = logging.getLogger("llama_cpp")

_FLASH_ATTN = {
    "auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line.
# llama.cpp warns about normal gpt-oss facts at load (token attributes, EOG list, SWA cache
# size), so its warnings are logged at INFO; errors stay errors.
_LOG_LEVELS = {2: logging.DEBUG, 3: logging.INFO, 4: logging.ERROR}


_DEBUG = 1  # ggml_log_level of llama.cpp's debug lines
_debug_sinks: list[Callable[[str], None]] = []  # LlamaContext.debug_sink's (the step trace's)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


_MALLOC_TRIM = _malloc_trim()


def return_freed_memory() -> None:
    """Give the pages that freeing a model left in malloc's arenas back to the system.

    glibc keeps freed blocks below its mmap threshold in its heaps, and raises that threshold
    each time a large block is freed: after one unload, the next load's weight buffers come
    from the heaps, and freeing them again returned only part of the model (71 to 93 MB of the
    trained test model's 93 MB, measured over five unloads of one process). malloc_trim(0)
    releases every free page of every arena."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


@lc.llama_log_callback  # type: ignore[untyped-decorator]
def _route_llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace").rstrip()
    if level == _DEBUG and _debug_sinks:
        for sink in _debug_sinks:
            sink(message)
    if message:
        llama_log.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", message)


ABORTED = 2  # llama_decode's return value when its abort callback asked it to stop


class DecodeError(RuntimeError):
    """llama_decode failed; `code` is its return value (1: no KV slot, 2: aborted, <0: fatal)."""

    def __init__(self, code: int):
        super().__init__(f"llama_decode failed with code {code}")
        self.code = code


_NO_ABORT = lc.ggml_abort_callback()  # a null callback: decodes run to the end


class LoadAborted(RuntimeError):
    """The model's load was stopped on request (the server is shutting down)."""


class LlamaContext:
    """One model, one context with `n_seq` sequences: sharing a unified KV cache, or — in the
    batch-invariant mode — each in cells of its own (`n_ctx` is then what one sequence holds)."""

    def __init__(self, config: EngineConfig, abort: Callable[[], bool] | None = None) -> None:
        lc.llama_log_set(_route_llama_log, ctypes.c_void_p(0))
        lc.llama_backend_init()
        self._model = self._load_model(config, abort)
        self._ctx = self._new_context(config)
        self._vocab = lc.llama_model_get_vocab(self._model)
        self._memory = lc.llama_get_memory(self._ctx)
        self.n_ctx = int(lc.llama_n_ctx_seq(self._ctx))  # what one sequence can hold
        self.n_batch = int(lc.llama_n_batch(self._ctx))
        self.n_ubatch = int(lc.llama_n_ubatch(self._ctx))  # tokens per graph a decode splits into
        self.n_seq = int(lc.llama_n_seq_max(self._ctx))
        self.n_swa = int(lc.llama_model_n_swa(self._model))
        self._batch = Batch(self.n_batch)
        self.info = self._model_info(config.model_path)
        self.workspace = Workspace(self.info.n_vocab)  # the sampling buffers of this thread
        self.llama_sampling = config.sampler == "llama"
        self._logit_views: dict[int, np.ndarray[Any, np.dtype[np.float32]]] = {}
        # rows of llama.cpp's output buffer: it grows to the most a decode asked for, never
        # shrinks (llama_context::output_reserve); the step trace reports it
        self.outputs_reserved = self.n_seq
        self._debug_sink: Callable[[str], None] | None = None

    @staticmethod
    def _load_model(config: EngineConfig, abort: Callable[[], bool] | None) -> Any:
        # GPU layers, experts kept on the CPU, load mode, progress bar: see loading/offload.py.
        with offload.model_params(config, abort) as params:
            model = lc.llama_model_load_from_file(config.model_path.encode(), params)
        if not model and abort is not None and abort():
            raise LoadAborted(f"loading {config.model_path} was stopped")
        if not model:
            raise RuntimeError(f"llama.cpp could not load {config.model_path}")
        return model

    def _new_context(self, config: EngineConfig) -> Any:
        params = lc.llama_context_default_params()
        params.n_ctx = config.n_ctx
        params.n_batch = config.n_batch
        params.n_ubatch = min(config.n_ubatch, config.n_batch)
        params.n_seq_max = config.n_slots
        # Sequences share the cells, so one conversation may use them all. In the batch-invariant
        # mode each has its own: a sequence's cells then stay in the order of its positions,
        # whatever else runs or is rolled back, and attention sums over them in that order.
        params.kv_unified = not config.batch_invariant
        params.n_threads = config.n_threads or default_threads()
        params.n_threads_batch = config.n_threads_batch or params.n_threads
        params.flash_attn_type = _FLASH_ATTN[config.flash_attn]
        params.swa_full = config.swa_full
        params.no_perf = True
        ctx = lc.llama_init_from_model(self._model, params)
        if not ctx:
            lc.llama_model_free(self._model)
            raise RuntimeError("llama.cpp could not create a context (out of memory?)")
        return ctx

    def _model_info(self, path: str) -> ModelInfo:
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self._model, buf, len(buf))
        return ModelInfo(
            path=path,
            description=buf.value.decode("utf-8", errors="replace"),
            n_ctx=self.n_ctx,
            n_ctx_train=int(lc.llama_model_n_ctx_train(self._model)),
            n_vocab=int(lc.llama_vocab_n_tokens(self._vocab)),
            n_params=int(lc.llama_model_n_params(self._model)),
            size_bytes=int(lc.llama_model_size(self._model)),
        )

    @property
    def vocab(self) -> Any:
        """The llama_vocab pointer (for samplers built outside this module)."""
        return self._vocab

    def token_text(self, token_id: int) -> str:
        if not 0 <= token_id < self.info.n_vocab:
            raise ValueError(f"token id {token_id} is outside the vocabulary")
        text = lc.llama_vocab_get_text(self._vocab, token_id)
        return text.decode("utf-8", errors="replace") if text else ""

    @property
    def debug_sink(self) -> Callable[[str], None] | None:
        """Where llama.cpp's debug log lines go besides the log (the step trace)."""
        return self._debug_sink

    @debug_sink.setter
    def debug_sink(self, sink: Callable[[str], None] | None) -> None:
        if self._debug_sink is not None:
            _debug_sinks.remove(self._debug_sink)
        self._debug_sink = sink
        if sink is not None:
            _debug_sinks.append(sink)

    def graphs_reused(self) -> int:
        """How many decodes reused the previous compute graph so far (llama.cpp's counter)."""
        return int(lc.llama_perf_context(self._ctx).n_reused)

    def seq_span(self, seq_id: int) -> list[int]:
        """[lowest, highest] position a sequence holds in the KV cache ([-1, -1]: none)."""
        low = int(lc.llama_memory_seq_pos_min(self._memory, seq_id))
        return [low, int(lc.llama_memory_seq_pos_max(self._memory, seq_id))]

    def close(self) -> None:
        self.debug_sink = None
        lc.llama_free(self._ctx)
        lc.llama_model_free(self._model)
        return_freed_memory()

    def reusable_prefix(self, seq_id: int, n_common: int) -> int:
        """How much of a common prefix of `n_common` tokens a sequence can really keep.

        With a sliding-window cache that is not full-size, positions far behind the last one
        are gone; rolling back past them would silently attend to nothing.
        """
        if n_common <= 0:
            return 0
        pos_min = int(lc.llama_memory_seq_pos_min(self._memory, seq_id))
        if self.n_swa > 0 and pos_min > max(0, n_common - self.n_swa):
            return 0
        return n_common

    def truncate(self, seq_id: int, n_keep: int) -> int:
        """Drop a sequence's KV entries at positions >= n_keep; returns how many remain."""
        if lc.llama_memory_seq_rm(self._memory, seq_id, n_keep, -1):
            return n_keep
        lc.llama_memory_seq_rm(self._memory, seq_id, -1, -1)  # removing a whole sequence works
        return 0

    def share_prefix(self, source: int, target: int, n_tokens: int) -> None:
        """Give `target` the first `n_tokens` of `source` (cells are shared, nothing is copied)."""
        lc.llama_memory_seq_rm(self._memory, target, -1, -1)
        lc.llama_memory_seq_cp(self._memory, source, target, 0, n_tokens)

    def seq_state_size(self, seq_id: int) -> int:
        """Bytes of a sequence's state (its KV cells, sliding-window layers included)."""
        return int(lc.llama_state_seq_get_size(self._ctx, seq_id))

    def seq_state(self, seq_id: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """A copy of a sequence's state, as llama_state_seq_get_data writes it."""
        size = self.seq_state_size(seq_id)
        state = np.empty(size, dtype=np.uint8)  # not zeroed: llama.cpp writes every byte
        pointer = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        written = int(lc.llama_state_seq_get_data(self._ctx, pointer, size, seq_id))
        return state[:written]

    def probe_state(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The state of one token evaluated in sequence 0: what this context's states look
        like. Only while no sequence holds anything (at load): the cache is cleared after it,
        so the first prompt lands in the cells it would have had without the probe."""
        self.decode([BatchPart(0, [0], 0, False)])
        try:
            return self.seq_state(0)
        finally:
            lc.llama_memory_clear(self._memory, False)

    def reserve_outputs(self, rows: int) -> None:
        """Grow llama.cpp's output buffer to `rows` rows of logits now, whatever the speculative
        setting: it grows at the first decode that keeps more rows than it has (a verify), and
        never shrinks. Reserved at load, every server steps with the buffer of the same size
        (`auto`'s start-up timing of 1 + 16 rows used to leave its buffer 17 rows and `off`'s 4),
        and no step reallocates it mid-generation. Only while no sequence holds anything (at
        load): the cache is cleared after it."""
        rows = min(rows, self.n_batch)
        if rows <= self.outputs_reserved:
            return
        self._batch.fill([BatchPart(0, [0] * rows, 0, True, rows)])  # not a step: no `decode`
        code = lc.llama_decode(self._ctx, self._batch.struct)
        lc.llama_memory_clear(self._memory, False)
        if code != 0:
            raise DecodeError(int(code))
        self.outputs_reserved = rows

    def load_seq_state(self, seq_id: int, data: bytearray, offset: int) -> bool:
        """Replace a sequence's cache with a state saved by seq_state (`data[offset:]`).

        False when llama.cpp refuses it (no room, another layout); the sequence is then empty.
        """
        lc.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
        size = len(data) - offset
        buffer = (ctypes.c_uint8 * size).from_buffer(data, offset)
        return int(lc.llama_state_seq_set_data(self._ctx, buffer, size, seq_id)) > 0

    def decode(
        self,
        parts: Sequence[BatchPart],
        stop: StopFlag | None = None,
        before: Callable[[], object] | None = None,
    ) -> list[int]:
        """Evaluate every part in one llama_decode; the batch index of each part's logits.

        `before` runs once the batch is ready, just before llama_decode: what it wakes finds
        this thread in C, holding no GIL, rather than filling the batch.

        With `stop`, llama.cpp reads the flag between the graph's operations (on the CPU
        backend; no Python runs for it) and stops the decode once it is set: a long prompt
        chunk stops within its compute, not after it. Ubatches evaluated before the stop stay
        in the KV cache (`seq_end`).

        Raises DecodeError (code 1: the KV cache has no room for the batch; 2: aborted).
        """
        indices = self._batch.fill(parts)
        outputs = self._batch.outputs
        self.outputs_reserved = max(self.outputs_reserved, outputs)
        if stop is not None:
            lc.llama_set_abort_callback(self._ctx, stop.callback, stop.data)
        try:
            if before is not None:
                before()
            code = lc.llama_decode(self._ctx, self._batch.struct)
        finally:
            if stop is not None:
                lc.llama_set_abort_callback(self._ctx, _NO_ABORT, None)
        if code != 0:
            raise DecodeError(int(code))
        return indices

    def synchronize(self) -> None:
        """Wait for the last decode to finish: on a GPU, llama_decode returns once its work is
        queued; reading logits waits too."""
        lc.llama_synchronize(self._ctx)

    def seq_end(self, seq_id: int) -> int:
        """One past the last position a sequence holds in the KV cache (0 when empty)."""
        return int(lc.llama_memory_seq_pos_max(self._memory, seq_id)) + 1

    def new_chain(
        self, params: SamplingParams, seed: int, constraint: Constrain | None = None
    ) -> LlamaSamplerChain:
        """llama.cpp's sampler chain for these settings, reading this context's logits; `seed`
        from sampling.llama_chain.chain_seed."""
        return LlamaSamplerChain(self._ctx, self._vocab, params, seed, constraint)

    def set_backend_chain(self, seq_id: int, chain: Any) -> bool:
        """Draw a sequence's tokens with `chain` inside the graph from the next decode on (a
        llama_sampler pointer, set up on the backend once: sampling/backend_chain.py); None
        takes it off, and its logits come back to the host again. False where llama.cpp cannot
        sample this chain on the backend (the sequence then has none)."""
        return bool(lc.llama_set_sampler(self._ctx, seq_id, chain))

    def sampled_token(self, index: int) -> int:
        """The token the backend chain drew at batch position `index` (-1: none drawn)."""
        return int(lc.llama_get_sampled_token_ith(self._ctx, index))

    def logits(self, index: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The logits of batch position `index`, as a view (no copy).

        Views are kept by address: llama.cpp's output buffer moves only when it grows.
        """
        pointer = lc.llama_get_logits_ith(self._ctx, index)
        address = ctypes.addressof(pointer.contents)
        view = self._logit_views.get(address)
        if view is None:
            if len(self._logit_views) >= 4 * self.n_seq:
                self._logit_views.clear()
            view = np.ctypeslib.as_array(pointer, (self.info.n_vocab,))
            self._logit_views[address] = view
        return view

    def validate_grammar(self, grammar: str) -> None:
        sampler = lc.llama_sampler_init_grammar(self._vocab, grammar.encode(), b"root")
        if not sampler:
            raise ValueError("llama.cpp rejected the grammar")
        lc.llama_sampler_free(sampler)

"""The engine contract: what generation asks of an engine and what it gets back."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from server.contracts.directives import Steering, SteeringStats
from server.contracts.events import Timings, TokenLogprob, Usage

TokenChooser = Callable[[int], int]
"""Given the token the sampler picked, returns the token to use instead (tests force scripts)."""

SamplingHook = Callable[[Sequence[int]], TokenChooser | None]
"""Called at the start of each generation with its prompt; may return a TokenChooser.

The chooser sees only tokens the engine sampled, never tokens a Steering forced."""


@dataclass(frozen=True, slots=True)
class BatchPart:
    """Tokens of one sequence at consecutive positions, evaluated within a batch."""

    seq_id: int
    tokens: Sequence[int]
    start_pos: int
    logits: bool  # keep the logits of the last token (to sample from)
    outputs: int = 1  # with `logits`: how many of the last tokens keep theirs (a verify's draft)
    all_logits: bool = False  # keep every token's (prompt log-probabilities)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens, and when to stop."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_tokens: frozenset[int] = frozenset()
    logprobs: int | None = None  # report each sampled token's logprob and this many alternatives
    prompt_logprobs: bool = False  # also every prompt token's (evaluates the prompt in full)
    speculate: bool = True  # False: one token a step for this request, whatever the engine's mode


class SlotPin:
    """A conversation's claim on the slot that holds it, for as long as whatever holds the pin
    lives (a Responses WebSocket: the socket's life). Each generation submitted with the pin
    runs in the slot the pin holds (or one it then moves to); while the pin is held, no other
    conversation's prompt is given that slot, so its KV cache waits for the next turn. Where
    every slot is pinned, the pin used least recently yields (server/engine/slots.py). Released
    from any thread: the engine reads `held` whenever it chooses a slot, and calls nothing."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = True

    @property
    def held(self) -> bool:
        return self._held

    def release(self) -> None:
        """The slot goes back to the others (at once, the next time the engine chooses one)."""
        self._held = False


class StopReason(StrEnum):
    STOP_TOKEN = "stop_token"
    MAX_TOKENS = "max_tokens"
    CONTEXT_FULL = "context_full"
    CANCELLED = "cancelled"
    ERROR = "error"
    UNAVAILABLE = "unavailable"  # the engine can no longer generate (an RPC host dropped,
    # its model failed to load, the shutdown): HTTP 503, where an ERROR is a 500


@dataclass(frozen=True, slots=True)
class EngineResult:
    """How a generation ended, with its counters and timings."""

    stop_reason: StopReason
    usage: Usage
    timings: Timings
    stop_token: int | None = None
    error: str | None = None
    steering: SteeringStats = field(default_factory=SteeringStats)  # overrides of the model
    # SamplingParams.prompt_logprobs: one per prompt token, None for the first (nothing before it)
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How to load the model and size the context."""

    model_path: str
    n_ctx: int = 32768  # shared by all sequences (a unified KV cache; batch-invariant: split)
    n_slots: int = 4  # sequences: conversations kept in the cache / generated in parallel
    prefill_chunk: int = 512  # prompt tokens per step while other sequences are generating
    max_waiting: int = 64  # requests queued beyond the running ones before new ones are refused
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None  # None: every CPU this process may use
    n_threads_batch: int | None = None
    n_gpu_layers: int = 0  # the last N layers (the output counting as one) on the GPU; -1: all
    cpu_tensor_patterns: tuple[str, ...] = ()  # tensor-name regexes kept on the CPU (MoE experts)
    tensor_split: tuple[float, ...] = ()  # share of the offloaded layers per device (several)
    rpc_servers: tuple[str, ...] = ()  # HOST:PORT of RPC hosts, connected (rpc/backend.py)
    use_mmap: bool = False
    cpu_repack: bool = True  # llama.cpp's CPU weight repacking (extra buffer types); off: -nr
    flash_attn: str = "auto"  # auto | on | off
    swa_full: bool = True
    sampler: str = "numpy"  # numpy (sampling/numpy_sampler.py) | llama (llama.cpp's chain)
    speculative: str = "auto"  # auto (drafts weighed by the measured verify cost) | on | off
    draft_max: int = 16  # the most drafted tokens verified in one step
    # free text drawn inside the graph by llama.cpp's backend chain (sampling/backend_chain.py):
    # auto (where it measured faster: the output layer on a GPU, speculation off) | on | off
    backend_sampling: str = "off"
    # a request's tokens depend on it alone (scheduler.py): its own decodes, fixed prefill
    # chunks, no prefix computed by another request, drafts weighed by its own acceptance,
    # KV cells of its own (n_ctx / n_slots each)
    batch_invariant: bool = False
    # prompt cache on disk (see disk_cache/prompt_cache.py); None: off
    prompt_cache_dir: str | None = None
    prompt_cache_bytes: int = 8 * 1024**3  # LRU deletion beyond this
    prompt_cache_min_tokens: int = 512  # shorter prefixes are not worth a file


def default_threads() -> int:
    """Every CPU this process may use (its affinity where the OS has one): n_threads's default."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class PromptCacheStats:
    """Counters of the prompt cache on disk (other threads read them as snapshots)."""

    hits: int = 0  # prompts that started from a disk entry
    misses: int = 0  # prompts for which the disk held nothing longer than the memory did
    bytes_read: int = 0
    bytes_written: int = 0
    saves: int = 0
    skipped_saves: int = 0  # dropped: too many bytes waiting to be written, or the disk is full
    corrupt: int = 0  # entries deleted because they failed their checks
    evicted: int = 0  # entries deleted to stay within the budget
    copy_seconds: float = 0.0  # engine-thread time spent copying states out of llama.cpp
    load_seconds: float = 0.0  # engine-thread time spent restoring entries (read elsewhere)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What the engine is doing right now."""

    waiting: int  # requests not admitted yet
    running: int  # requests being prefilled or generating
    slots: int
    max_waiting: int


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Facts about the loaded model."""

    path: str
    description: str
    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    n_params: int
    size_bytes: int


class TokenChunk(list[int]):
    """Tokens handed over together; `logprobs` holds one entry per token when the request asked
    for them (None for a token steering forced: no distribution was sampled), else is empty."""

    __slots__ = ("logprobs",)

    def __init__(
        self, tokens: list[int] | None = None, logprobs: list[TokenLogprob | None] | None = None
    ) -> None:
        super().__init__(tokens or ())
        self.logprobs: list[TokenLogprob | None] = logprobs or []


class TokenStream(Protocol):
    """The sampled tokens of one generation, in chunks, as they come."""

    def __aiter__(self) -> AsyncIterator[TokenChunk]: ...

    def paced(self, interval_s: float) -> AsyncIterator[TokenChunk]:
        """The chunks, at most one per `interval_s` while tokens come faster (the first chunk
        and the end are not held back): tokens that come in between are handed over together."""
        ...

    @property
    def result(self) -> EngineResult:
        """Available once the iteration has ended."""
        ...

    def cancel(self) -> None: ...

    async def evaluating(self, within_s: float) -> None:
        """Wait until the engine begins evaluating the generation (or it ended), `within_s` at
        most; at once where it is not on the engine yet (a model being loaded)."""
        ...

    def unpace(self) -> None:
        """The chunk just taken showed the client nothing (hidden header tokens): `paced` hands
        over the next one as soon as it comes."""
        ...

    @property
    def likely(self) -> tuple[int, ...]:
        """The tokens the generation most likely starts with (the header its steering forces
        and then most likely lets the model pick), once the engine started it; () before, or
        where it guesses none. What comes may differ: it is a guess to prepare for."""
        ...

    def on_close(self, callback: Callable[[EngineResult], object]) -> None:
        """Call `callback(result)` on the consumer's event loop once the engine is done."""
        ...


class Engine(Protocol):
    """Token ids in, token ids out."""

    @property
    def info(self) -> ModelInfo: ...

    @property
    def load(self) -> EngineLoad: ...

    @property
    def prompt_cache(self) -> PromptCacheStats | None:
        """The disk cache's counters; None when it is off."""
        ...

    @property
    def failure(self) -> str | None:
        """Why the engine can no longer generate (an RPC host dropped); None while it can."""
        ...

    def submit(
        self,
        prompt_tokens: Sequence[int],
        params: SamplingParams,
        steering: Steering | None = None,
        save_points: Sequence[int] = (),
        pin: SlotPin | None = None,
    ) -> TokenStream:
        """Generate from `prompt_tokens`; `save_points` are prompt lengths worth keeping on disk
        (message boundaries) once evaluated; `pin`: the conversation's claim on its slot."""
        ...

    def validate_grammar(self, grammar: str) -> None:
        """Raise ValueError if llama.cpp cannot use this GBNF grammar."""
        ...

    def token_text(self, token_id: int) -> str:
        """The vocabulary's text for a token id (as stored in the model file)."""
        ...

    def close(self) -> None: ...

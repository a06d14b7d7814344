"""The resolved benchmark settings, the request schedule and the per-path result record."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.bench.options import FlashAttn

Measurement = dict[str, float]
"""One measured request (or llama-bench repetition): metric name -> value."""

CTX_MARGIN = 256  # room for the chat prompt's system/user headers beyond the prompt tokens
WARMUP_PROMPT_CAP = 128  # warm-up prompts touch every weight; they need not be full size
PP_ONLY_GEN = 16  # tokens generated after a prefill-only prompt: enough for a visible delta
TUPLES = ("prompt_sizes", "depths", "streams")  # the Plan's fields that JSON holds as lists


class BenchError(RuntimeError):
    """A path could not be measured (it is reported, and the other paths still run)."""


def pp_label(n_prompt: int) -> str:
    return f"pp{n_prompt}"


def tg_label(n_gen: int) -> str:
    return f"tg{n_gen}"


@dataclass(frozen=True, slots=True)
class Step:
    """One request: evaluate `n_prompt` fresh tokens, then generate `n_gen`."""

    index: int  # running number: seeds the prompt and makes its first token differ
    n_prompt: int
    n_gen: int
    measured: bool
    decode_test: bool  # its decode speed is the tgN result


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything every path must agree on."""

    model_path: Path
    prompt_sizes: tuple[int, ...]
    gen_tokens: int
    repetitions: int
    warmup: int
    rounds: int
    n_threads: int
    n_gpu_layers: int
    n_ctx: int
    n_slots: int
    use_mmap: bool
    flash_attn: FlashAttn
    seed: int
    startup_timeout_s: float = 900.0
    memory_wait_s: float = 600.0
    temperature: float = 1.0  # sampling of every path; top_k 0 and min_p 0 everywhere
    top_p: float = 1.0
    depths: tuple[int, ...] = ()  # paired decode after these depths (server/bench/paired.py)
    streams: tuple[int, ...] = ()  # paired aggregate decode of these many streams
    pairs: int = 8  # paired requests of each depth and stream count
    context_limit: int | None = None  # the context the depths and streams had to fit in

    @property
    def sampling(self) -> str:
        return f"temperature {self.temperature:g}, top_p {self.top_p:g}, top_k 0, min_p 0"

    @property
    def tg_depth(self) -> int:
        """Decode is measured after a prompt of the first size (llama-bench: `-d`)."""
        return self.prompt_sizes[0]

    def steps(self) -> list[Step]:
        """Warm-up requests, then every prompt size once per repetition."""
        warm_prompt = min(self.prompt_sizes[0], WARMUP_PROMPT_CAP)
        steps = [Step(i, warm_prompt, 2, False, False) for i in range(self.warmup)]
        for _ in range(self.repetitions):
            for n_prompt in self.prompt_sizes:
                decode_test = n_prompt == self.tg_depth
                n_gen = self.gen_tokens if decode_test else min(PP_ONLY_GEN, self.gen_tokens)
                steps.append(Step(len(steps), n_prompt, n_gen, True, decode_test))
        return steps

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["model_path"] = str(self.model_path)
        for name in TUPLES:
            data[name] = list(data[name])
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        values = dict(data)
        values["model_path"] = Path(values["model_path"])
        for name in TUPLES:
            values[name] = tuple(values.get(name, ()))
        return cls(**values)


@dataclass
class PathRun:
    """What one path measured."""

    name: str
    tests: dict[str, list[Measurement]] = field(default_factory=dict)
    peak_rss_bytes: int | None = None
    child_cpu_s: float = 0.0  # CPU time of the path's child processes
    other_cores: list[float] = field(default_factory=list)  # per round: CPUs others kept busy
    load_s: float | None = None
    commands: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def add(self, label: str, measurement: Measurement) -> None:
        self.tests.setdefault(label, []).append(measurement)

    def add_child(self, peak_rss_bytes: int, cpu_s: float) -> None:
        """Account for an ended child process of this path."""
        self.peak_rss_bytes = max(self.peak_rss_bytes or 0, peak_rss_bytes)
        self.child_cpu_s += cpu_s

    def merge(self, later: PathRun) -> None:
        """Add a later round's measurements of the same path."""
        for label, measurements in later.tests.items():
            self.tests.setdefault(label, []).extend(measurements)
        if later.peak_rss_bytes is not None:
            self.add_child(later.peak_rss_bytes, later.child_cpu_s)
        self.other_cores += later.other_cores
        if later.load_s is not None:
            self.load_s = max(self.load_s or 0.0, later.load_s)
        self.commands += [c for c in later.commands if c not in self.commands]
        self.notes += [n for n in later.notes if n not in self.notes]
        self.error = self.error or later.error

"""`--speculative auto` against `off`, paired per round, with bootstrap 95 % intervals.

`python -m scripts.bench.auto_off [--rounds 5] [--workloads codex prose tiny concurrent edit]
[--tokens 256] [--instances 2] [--control] [--resamples 4000] [--trace DIR] [--out FILE]`

`--instances` `serve` processes per model and setting, started once (scripts/bench/codex_loop.py's
server: the trained preset, greedy by default, two threads, no disk cache), in the order
auto, off, off, auto, ..., each warmed up by one uncounted run of every workload; round r runs
every workload on both settings back to back on their instance r mod `--instances`, which goes
first alternating by round, so each pair sees the machine as it is then. Two processes of the
same build and settings differ by several per cent here, steadily (where each one's memory
landed, which started first): with one process a setting, an off-against-off run read 0.938
(0.878 to 1.001) on 20 rounds, so the processes are sampled too. `--control` adds a third side
in the same rounds, `off` again on processes of its own (`control`, its ratio control / off
beside auto / off): the bench's own noise, measured in the same minutes, which a result must
stand clear of (runs of the same code an hour apart differ by more than their intervals, so a
control from another run does not do). The sides take turns going first. The workloads:

- `codex`: Codex CLI's read-then-patch loop (codex_loop.loop; the CLI the tests install);
- `prose`: a long sampled reply (temperature 1, a seed per round), `--tokens` tokens, on the
  trained model: its continuation of a plain-text opening through /v1/completions (its chat
  replies end within 15 to 23 tokens, which would time the request, not the decode); it repeats
  itself at times, so drafts are sometimes right, and at temperature 1 often wrong;
- `tiny`: the same request on the random-weight tiny model: nothing to copy, nothing to win;
- `concurrent`: four such replies at once on the trained model (throughput: the tokens of the
  four over the wall time until the last ended);
- `edit`: the trained model's apply_patch turn after reading the file (Codex's short head,
  held-out prompts of devkit/trained/workloads.py), greedy, through /v1/completions: its
  analysis message first (a raw completion ends at `<|end|>`; not measured), then the call.

A run's rate is its generated tokens over the server's decode seconds (Prometheus), as in
codex_loop, except `concurrent` (wall time). The greedy workloads must generate the same tokens
on both settings (speculation is exact): each pair's token counts are compared, and `codex`
compares what the loop did. The sampled ones (`prose`, `tiny`, `concurrent`) need not: a seed
gives the same tokens only where the logits are bit-identical, and without `--batch-invariant`
a verify's rows (docs/speculative.md) and the streams that share a batch move their last bits,
so a near-tie at temperature 1 can part the two texts and their lengths (`pairs_differing`
counts them; a pair's rate is still its tokens over its decode seconds). Two `off` processes
never parted on one stream (0 of 40 pairs of off-against-off runs).
Per workload, the paired ratios auto / off, their geometric mean and a percentile
bootstrap 95 % interval of it (resampling the rounds); over all workloads, the geometric mean
of the workloads' means, its interval resampling the rounds within each workload. Prints JSON
with the machine's load average before and after: on a busy machine the intervals are wide.
"""

from __future__ import annotations

import argparse
import fcntl
import math
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from devkit.models import cached_gguf
from devkit.trained.tasks import CODEX_PLACE, MODEL_NAME
from devkit.trained.workloads import trained_cases
from scripts.bench.codex_loop import CODEX, counters, loop, server
from server.bench.machine import load_average
from server.bench.report import print_json
from server.harmony.encoding import load_encoding
from server.private_files import open_private, private_dir

WORKLOADS = ("codex", "prose", "tiny", "concurrent", "edit")
MODES = ("auto", "off")
PROSE = "Once upon a time, a lighthouse keeper"  # the trained model ends a full sentence at once
STREAMS = 4

Run = Callable[[str, int], dict[str, float]]  # (url, round) -> generated, seconds, extra


def prose_reply(url: str, seed: int, tokens: int) -> dict[str, Any]:
    body = {
        "model": MODEL_NAME,
        "prompt": PROSE,
        "max_tokens": tokens,
        "temperature": 1.0,
        "seed": seed,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    response.raise_for_status()
    return dict(response.json())


def by_counters(url: str, work: Callable[[], object]) -> dict[str, float]:
    """Run `work`; the tokens it generated and the server's decode seconds for them."""
    before = counters(url)
    work()
    after = counters(url)
    names = {"generated": "generated", "seconds": "decode_s", "drafted": "drafted"}
    names["accepted"] = "accepted"
    return {key: after.get(c, 0.0) - before.get(c, 0.0) for key, c in names.items()}


def long_seeds(url: str, count: int, tokens: int, start: int) -> list[int]:
    """The first `count` seeds from `start` whose prose reply runs to `tokens` tokens (the
    trained model ends it early for about half of them): every measured reply is as long."""
    seeds: list[int] = []
    for seed in range(start, start + 20 * count):
        if prose_reply(url, seed, tokens)["usage"]["completion_tokens"] == tokens:
            seeds.append(seed)
            if len(seeds) == count:
                return seeds
    raise SystemExit(f"{len(seeds)} of {20 * count} seeds from {start} ran to {tokens} tokens")


def runs(args: argparse.Namespace, place: Path, seeds: dict[str, list[int]]) -> dict[str, Run]:
    """The workloads; `seeds`: the long replies' seeds of "prose", "tiny" and "concurrent"
    (`long_seeds`, found before the warm-up, which runs round `args.rounds`)."""
    edits = trained_cases(args.rounds + 1)["trained_apply_patch"]
    encoding = load_encoding(Path.home() / ".cache" / "gpt-oss-server" / "vocab")

    def codex(url: str, r: int) -> dict[str, float]:
        out: dict[str, Any] = {}

        def work() -> None:
            out.update(loop(args.codex, url, place))

        measured = by_counters(url, work)
        return {**measured, "exact": float(out["exact"]), "items": hash(str(out["items"]))}

    def prose(url: str, r: int, kind: str = "prose") -> dict[str, float]:
        return by_counters(url, lambda: prose_reply(url, seeds[kind][r], args.tokens))

    def tiny(url: str, r: int) -> dict[str, float]:
        return prose(url, r, "tiny")

    def concurrent(url: str, r: int) -> dict[str, float]:
        def work() -> None:
            threads = [
                threading.Thread(
                    target=prose_reply,
                    args=(url, seeds["concurrent"][STREAMS * r + i], args.tokens),
                )
                for i in range(STREAMS)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        started = time.perf_counter()
        measured = by_counters(url, work)
        return {**measured, "seconds": time.perf_counter() - started}

    def complete(url: str, prompt: list[int]) -> str:
        body = {
            "model": MODEL_NAME,
            "prompt": prompt,
            "allow_special_tokens": True,  # the prompt is harmony's tokens, headers and all
            "max_tokens": 200,
            "temperature": 0.0,
        }
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
        response.raise_for_status()
        return str(response.json()["choices"][0]["text"])

    def edit(url: str, r: int) -> dict[str, float]:
        # a raw completion ends at <|end|>: the model's analysis first (not measured), then
        # the turn's apply_patch call after it
        analysis = complete(url, edits[r])
        turn = f"{analysis}<|end|><|start|>assistant"
        prompt = [*edits[r], *encoding.encode(turn, allowed_special="all")]
        return by_counters(url, lambda: complete(url, prompt))

    return {"codex": codex, "prose": prose, "tiny": tiny, "concurrent": concurrent, "edit": edit}


def rate_of(run: dict[str, float]) -> float:
    return run["generated"] / run["seconds"] if run["seconds"] else 0.0


def bootstrap(ratios: list[float], resamples: int, rng: random.Random) -> list[float]:
    """The log geometric means of `resamples` resamplings of the ratios (in drawing order)."""
    logs = [math.log(r) for r in ratios]
    return [statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(resamples)]


def interval(log_means: list[float]) -> list[float]:
    """The percentile 95 % interval of resampled log means, as ratios."""
    means = sorted(log_means)
    n = len(means)
    low, high = means[int(0.025 * n)], means[min(n - 1, int(0.975 * n))]
    return [round(math.exp(low), 3), round(math.exp(high), 3)]


def geomean(ratios: list[float]) -> float:
    return round(math.exp(statistics.fmean(math.log(x) for x in ratios)), 3)


def summary(rows: dict[str, list[dict[str, Any]]], resamples: int) -> dict[str, Any]:
    rng = random.Random(0)
    out: dict[str, Any] = {}
    boots: list[list[float]] = []
    for workload, pairs in rows.items():
        ratios = [p["ratio"] for p in pairs if p["ratio"] > 0]
        if not ratios:
            continue
        means = bootstrap(ratios, resamples, rng)
        boots.append(means)
        controls = [p["control_ratio"] for p in pairs if p.get("control_ratio", 0) > 0]
        control = {}
        if controls:  # control / off in the same rounds: what a ratio of two offs spans
            spread = bootstrap(controls, resamples, rng)
            control = {"control": {"geomean": geomean(controls), "ci95": interval(spread)}}
        out[workload] = {
            "ratios": [round(x, 3) for x in ratios],
            "geomean": geomean(ratios),
            "ci95": interval(means),
            **control,
            "same_tokens": all(p["same_tokens"] for p in pairs),
            "pairs_differing": sum(not p["same_tokens"] for p in pairs),
            "auto_drafted": sum(p["auto"]["drafted"] for p in pairs),
            "auto_accepted": sum(p["auto"]["accepted"] for p in pairs),
        }
    if boots:  # each workload resampled on its own: the i-th draws are independent
        overall = [statistics.fmean(b[i] for b in boots) for i in range(resamples)]
        out["all"] = {
            "geomean": round(
                math.exp(statistics.fmean(math.log(out[w]["geomean"]) for w in rows if w in out)),
                3,
            ),
            "ci95": interval(overall),
        }
    return out


def turn(sides: tuple[str, ...], n: int) -> tuple[str, ...]:
    """The sides in the order of turn `n`: each goes first in its turn; with two, the order
    flips from one turn to the next."""
    k = n % len(sides)
    return (*sides[k:], *sides[:k])


def start_servers(
    stack: ExitStack,
    models: dict[str, str],
    sides: tuple[str, ...],
    args: argparse.Namespace,
    logs: Path,
) -> dict[tuple[str, str, int], str]:
    """Every model's `args.instances` servers of each side, up (the control's are `off`); their
    URLs by (model, side, instance)."""
    urls: dict[tuple[str, str, int], str] = {}
    for name, model in models.items():
        for i in range(args.instances):
            for side in turn(sides, i):  # who starts first, in turn
                setting = "off" if side == "control" else side
                process, urls[name, side, i] = server(model, setting, logs, args.trace)
                stack.enter_context(process)
    return urls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--tokens", type=int, default=256, help="tokens of each prose reply")
    parser.add_argument("--instances", type=int, default=2, help="processes a model and setting")
    parser.add_argument("--control", action="store_true", help="a third side, off again")
    parser.add_argument("--resamples", type=int, default=4000)
    parser.add_argument("--codex", type=Path, default=CODEX, help="the Codex CLI binary")
    parser.add_argument("--trace", type=Path, help="a folder for the servers' step traces")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if "codex" in args.workloads and not args.codex.exists():
        parser.error(f"no Codex CLI at {args.codex} (the Codex tests install it)")
    models = {"trained": str(cached_gguf("trained"))}
    if "tiny" in args.workloads:
        models["tiny"] = str(cached_gguf("tiny"))
    report: dict[str, Any] = {
        "models": models,
        "loadavg_before": load_average(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "instances": args.instances,
        "control": args.control,
    }
    rows: dict[str, list[dict[str, Any]]] = {w: [] for w in args.workloads}
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        lock = stack.enter_context(
            open_private(private_dir(CODEX_PLACE.parent) / "codex-edit.lock", "ab")
        )
        fcntl.flock(lock, fcntl.LOCK_EX)  # Codex's place: never beside its test
        CODEX_PLACE.mkdir(exist_ok=True)
        stack.callback(shutil.rmtree, CODEX_PLACE, True)
        sides = (*MODES, "control") if args.control else MODES
        urls = start_servers(stack, models, sides, args, logs)
        seeds: dict[str, list[int]] = {}
        for kind, model, count, start in (
            ("prose", "trained", args.rounds + 1, 1000),
            ("tiny", "tiny", args.rounds + 1, 1000),
            ("concurrent", "trained", STREAMS * (args.rounds + 1), 2000),
        ):
            if kind in args.workloads:
                seeds[kind] = long_seeds(urls[model, "off", 0], count, args.tokens, start)
        report["seeds"] = seeds
        work = runs(args, CODEX_PLACE, seeds)
        for workload in args.workloads:  # warm-up: grammars built, first turns cached
            model = "tiny" if workload == "tiny" else "trained"
            for (name, _, _), url in urls.items():
                if name == model:
                    work[workload](url, args.rounds)
        for r in range(args.rounds):
            for workload in args.workloads:
                model = "tiny" if workload == "tiny" else "trained"
                at = r % args.instances
                got = {side: work[workload](urls[model, side, at], r) for side in turn(sides, r)}
                rate = {m: rate_of(g) for m, g in got.items()}
                pair = {
                    "round": r,
                    **got,
                    "ratio": rate["auto"] / rate["off"] if rate["off"] else 0.0,
                    "same_tokens": got["auto"]["generated"] == got["off"]["generated"]
                    and got["auto"].get("items") == got["off"].get("items"),
                }
                if "control" in rate:
                    pair["control_ratio"] = rate["control"] / rate["off"] if rate["off"] else 0.0
                rows[workload].append(pair)
                rates = " ".join(f"{side} {rate[side]:.1f}" for side in sides)
                print(f"round {r} {workload}: {rates} tok/s", file=sys.stderr)
    report |= {
        "pairs": rows,
        "summary": summary(rows, args.resamples),
        "loadavg_after": load_average(),
    }
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

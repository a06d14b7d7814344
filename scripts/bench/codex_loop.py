"""Speculative decoding where the agent runs: Codex CLI's read-then-patch loop on the trained model.

`python -m scripts.bench.codex_loop [--rounds 5] [--warmup 1] [--loops 2] [--modes auto off]
[--codex PATH] [--out FILE]`

Every round starts a fresh `gpt-oss-server serve` process per speculative setting (`--modes`,
auto and off by default) on the trained preset: greedy, the test's conversation date and model
name (the prompts are the test's), two threads, the disk prompt cache off. Each runs the Codex CLI
test's task (devkit/trained/tasks.py: read settings.toml, change one line with apply_patch, say
so): first `--warmup` loops that are not counted (a fresh server's first loop also builds the
steering's grammars for Codex's tools, ≈1.5 s here, which would swamp the decode times), then
`--loops` measured ones, the servers' loops alternating (which goes first rotates every round),
so that the loops compared run seconds apart. Nothing is forced: Codex executes what the model
writes. After each, the
script checks the file on disk and reads the server's Prometheus counters: tokens generated,
decode seconds, drafted and accepted tokens (`gpt_oss_draft_tokens*`, llama-server's draft_n /
draft_n_accepted). Decode tok/s is the generated tokens over the decode seconds of the loop's
turns (the exec call, the patch, the final message): the prefill of Codex's ≈8k-token prompts is
not in it. Every setting must give the same loop (the same command, patch, message and token
count): speculation is exact. Prints JSON with the machine's load average before and after.

The Codex CLI is the one the tests install (`~/.cache/gpt-oss-server/codex-<version>`); the
run holds the test's lock on its place, so it never runs beside the test.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from devkit.client_pins import CODEX as CODEX_CLI
from devkit.codex_cli import codex_exec
from devkit.models import TRAINED, cached_gguf
from devkit.trained.tasks import CODEX_EDIT, CODEX_PLACE, CONVERSATION_DATE, MODEL_NAME
from server.bench.http_path import free_port
from server.bench.machine import load_average
from server.bench.procs import ServerProcess, serve_command
from server.bench.report import print_json
from server.ops.codex_config import CodexSetup, write
from server.private_files import open_private, private_dir

CODEX = CODEX_CLI.binary_path()
N_CTX = 16384  # Codex's first prompt is ≈7.9k tokens, and the loop adds its turns
SANDBOX = "workspace-write"  # as the test runs it (the permission text is in the prompt)
COUNTERS = {
    ("gpt_oss_tokens_total", "generated"): "generated",
    ("gpt_oss_engine_seconds_total", "decode"): "decode_s",
    ("gpt_oss_draft_tokens_total", None): "drafted",
    ("gpt_oss_draft_tokens_accepted_total", None): "accepted",
}


def counters(url: str) -> dict[str, float]:
    """The loop's totals from the server's /metrics."""
    found: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = sample.labels.get("kind") or sample.labels.get("phase")
            key = COUNTERS.get((sample.name, label)) or COUNTERS.get((sample.name, None))
            if key is not None:
                found[key] = float(sample.value)
    return found


def fresh_place(place: Path) -> tuple[Path, Path]:
    """CODEX_PLACE's home/ and repo/ made anew: the repository holds the task's file."""
    for sub in ("home", "repo"):
        shutil.rmtree(place / sub, ignore_errors=True)
    home, repo = place / "home", place / "repo"
    home.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / CODEX_EDIT.path).write_text(CODEX_EDIT.before)
    return home, repo


def done_item(item: dict[str, Any]) -> tuple[str, Any]:
    """What a completed Codex item did (its id differs run to run)."""
    return item["type"], item.get("command") or item.get("changes") or item.get("text")


def loop(codex: Path, url: str, place: Path) -> dict[str, Any]:
    """One Codex run of the task against the server at `url`: what it did and what it cost."""
    home, repo = fresh_place(place)
    before = counters(url)
    setup = CodexSetup(  # over HTTP, as this measurement has always run
        base_url=f"{url}/v1",
        model=MODEL_NAME,
        context_window=N_CTX,
        stream_idle_timeout_ms=60_000,
        websockets=False,
    )
    write(setup, home)
    started = time.perf_counter()
    result = codex_exec(codex, home, repo, "--sandbox", SANDBOX, CODEX_EDIT.ask, timeout=600)
    wall_s = time.perf_counter() - started
    items = [e["item"] for e in result.events if e.get("type") == "item.completed"]
    done = {key: value - before.get(key, 0.0) for key, value in counters(url).items()}
    return {
        "returncode": result.returncode,
        "exact": (repo / CODEX_EDIT.path).read_text() == CODEX_EDIT.after,
        "codex_wall_s": round(wall_s, 2),
        # what the loop did, compared across the settings
        "items": [done_item(i) for i in items],
        **done,
        "tokens_per_s": round(done["generated"] / done["decode_s"], 1) if done["decode_s"] else 0,
    }


def server(
    model: str, mode: str, logs: Path, trace: Path | None = None
) -> tuple[ServerProcess, str]:
    """A fresh `serve` process with `mode` (not started yet) and its URL; with `trace`, it
    writes its step trace there (server/engine/step_trace.py, llama.cpp's cell counters on)."""
    port = free_port()
    command = serve_command(
        model, port,
        "--n-ctx", str(N_CTX),
        "--n-threads", "2",
        "--n-threads-batch", "2",
        "--speculative", mode,
        "--temperature", "0",
        "--conversation-date", CONVERSATION_DATE.isoformat(),
        "--served-model-name", MODEL_NAME,
        "--no-prompt-cache",
        "--responses-store-path", str(logs / f"store-{port}.sqlite3"),
        "--log-level", "warning",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    env = None
    if trace is not None:
        trace.mkdir(parents=True, exist_ok=True)
        path = trace / f"steps-{mode}-{port}.jsonl"
        env = {"GPT_OSS_STEP_TRACE": str(path), "LLAMA_KV_CACHE_DEBUG": "1"}
    log_path = logs / f"server-{mode}-{port}.log"
    return ServerProcess(command, log_path, f"{url}/health", 300, env=env), url


def round_runs(
    model: str, modes: list[str], args: argparse.Namespace, place: Path, logs: Path
) -> Iterator[tuple[str, dict[str, Any]]]:
    """One round: a fresh server per mode, all started and warmed up, then their measured loops
    alternating (one loop each, in `modes`' order, `--loops` times): the loops compared are
    seconds apart, where this VM's speed moves by a quarter between minutes. An idle server
    takes no CPU while the other runs."""
    with ExitStack() as stack:
        urls = {}
        for mode in modes:
            process, urls[mode] = server(model, mode, logs, args.trace)
            stack.enter_context(process)
        for mode in modes:
            for _ in range(args.warmup):
                loop(args.codex, urls[mode], place)
        for _ in range(args.loops):
            for mode in modes:
                yield mode, loop(args.codex, urls[mode], place)


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, rows in runs.items():
        drafted = sum(r["drafted"] for r in rows)
        accepted = sum(r["accepted"] for r in rows)
        out[mode] = {
            "exact": sum(r["exact"] for r in rows),
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rows),
            "generated": sorted({r["generated"] for r in rows}),
            "drafted": drafted,
            "accepted": accepted,
            "acceptance": round(accepted / drafted, 3) if drafted else None,
        }
    modes = list(runs)
    base = runs[modes[-1]]
    for mode in modes[:-1]:
        pairs = zip(runs[mode], base, strict=True)
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs]
        out[mode][f"vs_{modes[-1]}_paired"] = round(statistics.median(ratios), 3)
    loops = {json.dumps(r["items"]) for rows in runs.values() for r in rows}
    out["identical_loops"] = len(loops) == 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="uncounted loops per server")
    parser.add_argument("--loops", type=int, default=2, help="measured loops per server")
    parser.add_argument(
        "--modes", nargs="+", default=["auto", "off"], help="--speculative settings; the last "
        "is the baseline of the paired ratios"
    )  # fmt: skip
    parser.add_argument("--model", help="a GGUF file (default: the trained preset)")
    parser.add_argument("--codex", type=Path, default=CODEX, help="the Codex CLI binary")
    parser.add_argument(
        "--trace", type=Path, help="a folder: each server writes its step trace there"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not args.codex.exists():
        parser.error(f"no Codex CLI at {args.codex} (the Codex tests install it)")
    model = args.model or str(cached_gguf(TRAINED))
    report: dict[str, Any] = {
        "model": model,
        "loadavg_before": load_average(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
    with (
        open_private(private_dir(CODEX_PLACE.parent) / "codex-edit.lock", "ab") as lock,
        tempfile.TemporaryDirectory() as logs,
    ):
        fcntl.flock(lock, fcntl.LOCK_EX)  # the test's place: never beside the test
        CODEX_PLACE.mkdir(exist_ok=True)
        try:
            for r in range(args.rounds):
                shift = r % len(args.modes)
                modes = args.modes[shift:] + args.modes[:shift]
                for mode, row in round_runs(model, modes, args, CODEX_PLACE, Path(logs)):
                    runs[mode].append({"round": r, **row})
                    print(f"round {r} {mode}: {row['tokens_per_s']} tok/s, "
                          f"{row['accepted']:.0f}/{row['drafted']:.0f} accepted, "
                          f"exact {row['exact']}", file=sys.stderr)  # fmt: skip
        finally:
            shutil.rmtree(CODEX_PLACE, ignore_errors=True)
    report |= {"runs": runs, "summary": summary(runs), "loadavg_after": load_average()}
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

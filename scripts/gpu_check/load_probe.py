"""Which way of loading a model crashes: each variant in a child process, stage by stage.

    python3 -m scripts.gpu_check.load_probe MODEL [--out DIR] [--gdb] [--bisect]

Variants: the server's model and context (llama_context.LlamaContext) in the main thread and in
a worker thread as the engine loads them, with and without mmap, the whole LlamaEngine, and the
engine after the imports `serve` makes first (`import server.cli`), with llama_cpp imported
before them or not, and the vocabulary alone after those imports (in a thread and in the main
thread: where `serve` died, before any tensor was read). Each child runs with faulthandler on
and prints the stage it reached; a child that dies by a signal is reported with its signal and
the Python stack faulthandler wrote.

`--bisect`: when the engine loads alone but not after serve's imports, find the first module in
serve's import order whose import (with those before it) makes the load crash (loading the
vocabulary alone where that crashes too). `--gdb`: rerun
the first variant that crashed under (cuda-)gdb and keep its native backtrace.
`GPU_CHECK_PROBE_FAULT_AFTER=MODULE` makes a child die by SIGSEGV before loading once MODULE
is imported: how tests/bench/test_gpu_load_probe.py checks the bisection on a machine where nothing
crashes.

The first GPU run (an H200) found `serve` dying by SIGSEGV in llama.cpp's vocabulary load
(`init_tokenizer`) while the same load in a bare process passed: devkit/notes/gpu-runbook.md.
Standard library only in the parent (the children import the server).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# name: (modules imported first, what is built, where, mmap)
VARIANTS: dict[str, tuple[tuple[str, ...], str, str, bool]] = {
    "context-main": ((), "context", "main", False),
    "context-main-mmap": ((), "context", "main", True),
    "context-thread": ((), "context", "thread", False),
    "context-bigstack": ((), "context", "bigstack", False),
    "engine": ((), "engine", "thread", False),
    "engine-mmap": ((), "engine", "thread", True),
    "vocab-after-serve-imports": (("server.cli",), "vocab", "thread", False),
    "vocab-main-after-serve-imports": (("server.cli",), "vocab", "main", False),
    "engine-after-serve-imports": (("server.cli",), "engine", "thread", False),
    "engine-llama-first-then-serve-imports": (
        ("llama_cpp", "server.cli"),
        "engine",
        "thread",
        False,
    ),
}
BASELINE = "engine"
SERVE = "engine-after-serve-imports"
VOCAB = "vocab-after-serve-imports"  # where this crashes too, the bisection loads only that

CHILD = r"""
import importlib, json, sys, threading, time
first, what, where, model = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[5]
mmap = sys.argv[4] == "1"
for name in first:
    try:
        importlib.import_module(name)
    except Exception as exc:  # a module that only imports as part of its package
        pass
print(f"stage: imported {len(first)} modules", flush=True)
import os, resource, signal
print(f"info: RLIMIT_STACK {resource.getrlimit(resource.RLIMIT_STACK)}, thread stack size "
      f"{threading.stack_size()}, threads {[t.name for t in threading.enumerate()]}", flush=True)
if os.environ.get("GPU_CHECK_PROBE_FAULT_AFTER") in sys.modules:  # the bisect's own test
    os.kill(os.getpid(), signal.SIGSEGV)
from server.engine.base import EngineConfig
config = EngineConfig(model_path=model, n_ctx=4096, n_slots=4, n_gpu_layers=-1, use_mmap=mmap)
def body():
    t = time.monotonic()
    if what == "vocab":
        import llama_cpp.llama_cpp as lc
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.vocab_only = True
        params.n_gpu_layers = -1
        found = lc.llama_model_load_from_file(model.encode(), params)
        print(f"stage: vocabulary loaded ({bool(found)})", flush=True)
    elif what == "context":
        from server.engine.llama_context import LlamaContext
        ctx = LlamaContext(config)
        print(f"stage: context ready in {time.monotonic() - t:.1f} s", flush=True)
        ctx.close()
    else:
        from server.engine.llama import LlamaEngine
        engine = LlamaEngine(config)
        print(f"stage: engine ready in {time.monotonic() - t:.1f} s", flush=True)
        engine.close()
    print("stage: closed", flush=True)
if where == "main":
    body()
else:
    if where == "bigstack":
        threading.stack_size(256 * 1024 * 1024)
    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
print("stage: done", flush=True)
"""


def child_command(first: tuple[str, ...] | list[str], what: str, where: str, mmap: bool,
                  model: str) -> list[str]:  # fmt: skip
    return [sys.executable, "-X", "faulthandler", "-c", CHILD, json.dumps(list(first)), what,
            where, "1" if mmap else "0", model]  # fmt: skip


def run_child(command: list[str], log: Path, timeout: float) -> dict[str, Any]:
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)
        code: int | str = done.returncode
        text = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code = "timeout"
        text = _text(exc.stdout) + _text(exc.stderr)
    log.write_text(text)
    stages = [line[7:] for line in text.splitlines() if line.startswith("stage: ")]
    info = next((line[6:] for line in text.splitlines() if line.startswith("info: ")), None)
    return {"returncode": code, "last_stage": stages[-1] if stages else None, "info": info,
            "tail": text.splitlines()[-25:]}  # fmt: skip


def _text(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


def crashed(result: dict[str, Any]) -> bool:
    """Died by a signal (a negative return code), not a timeout or a Python error."""
    code = result["returncode"]
    return isinstance(code, int) and code < 0


def serve_import_order(out: Path) -> list[str]:
    """The modules `import server.cli` imports, in the order their imports finish (python's
    -X importtime): each one's own imports come before it, so importing a prefix of the list
    imports those modules and what they need, no more."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import server.cli"],
                          check=False, capture_output=True, text=True, timeout=120)  # fmt: skip
    (out / "import-order.log").write_text(done.stderr)
    names = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
            names.append(parts[2].strip())
    return [name for name in names if name not in sys.builtin_module_names]


def bisect(model: str, out: Path, timeout: float, what: str = "engine") -> dict[str, Any]:
    """The shortest prefix of serve's import order after which the load crashes: the engine's,
    or the vocabulary's alone (`what="vocab"`, a second where the engine's takes several)."""
    modules = serve_import_order(out)
    tries: list[dict[str, Any]] = []

    def crashes_after(n: int) -> bool:
        result = run_child(child_command(modules[:n], what, "thread", False, model),
                           out / f"bisect-{n}.log", timeout)  # fmt: skip
        tries.append({"prefix": n, "returncode": result["returncode"],
                      "last_stage": result["last_stage"]})  # fmt: skip
        print(f"[probe] bisect: first {n} of {len(modules)} modules -> rc {result['returncode']}",
              flush=True)  # fmt: skip
        return crashed(result)

    report: dict[str, Any] = {"load": what, "modules": len(modules), "tries": tries}
    if not modules or not crashes_after(len(modules)):
        report["culprit"] = None
        return report
    low, high = 0, len(modules)  # no crash after `low` modules, a crash after `high`
    while high - low > 1:
        middle = (low + high) // 2
        if crashes_after(middle):
            high = middle
        else:
            low = middle
    culprit = modules[high - 1]
    report["culprit"] = culprit
    report["culprit_alone_crashes"] = crashes_after_only(culprit, what, model, out, timeout)
    report["imported_before"] = modules[max(0, high - 6) : high - 1]
    return report


def crashes_after_only(module: str, what: str, model: str, out: Path, timeout: float) -> bool:
    result = run_child(child_command([module], what, "thread", False, model),
                       out / "bisect-alone.log", timeout)  # fmt: skip
    return crashed(result)


def gdb_backtrace(name: str, model: str, out: Path) -> None:
    gdb = shutil.which("gdb") or shutil.which("cuda-gdb") or "/usr/local/cuda/bin/cuda-gdb"
    if not Path(gdb).exists():
        (out / "probe-gdb.log").write_text("no gdb\n")
        return
    first, what, where, mmap = VARIANTS[name]
    command = [gdb, "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 40",
               "-ex", "info sharedlibrary", "--args",
               *child_command(first, what, where, mmap, model)]  # fmt: skip
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
        text = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        text = "timeout\n" + _text(exc.stdout)
    (out / "probe-gdb.log").write_text(text)
    backtrace = [ln for ln in text.splitlines() if ln.startswith("#")]
    print("[probe] native backtrace:", *backtrace[:40], sep="\n", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "."))
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--gdb", action="store_true")
    parser.add_argument("--bisect", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for name in args.variants:
        first, what, where, mmap = VARIANTS[name]
        result = run_child(child_command(first, what, where, mmap, args.model),
                           args.out / f"probe-{name}.log", args.timeout)  # fmt: skip
        results[name] = result
        print(f"[probe] {name}: rc {result['returncode']}, last stage {result['last_stage']}",
              flush=True)  # fmt: skip
    report: dict[str, Any] = {"variants": results}
    bad = [name for name, result in results.items() if crashed(result)]
    for name in bad[:1]:
        print(f"--- {name}:", *results[name]["tail"], sep="\n", flush=True)
    (args.out / "probe.json").write_text(json.dumps(report, indent=1))
    serve_only = SERVE in bad and BASELINE in results and not crashed(results[BASELINE])
    if args.bisect and serve_only:
        what = "vocab" if VOCAB in bad else "engine"
        report["bisect"] = bisect(args.model, args.out, args.timeout, what)
        print(f"[probe] bisect: {json.dumps(report['bisect'], default=str)}", flush=True)
        (args.out / "probe.json").write_text(json.dumps(report, indent=1))
    if args.gdb and bad:
        gdb_backtrace(bad[0], args.model, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

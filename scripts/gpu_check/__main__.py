"""The GPU check: build, test and measure on a lent GPU machine in one command, one table out.

    python3 -m scripts.gpu_check [--out DIR] [--budget-s 540] [--phases NAME ...]
    python3 -m scripts.gpu_check --cpu      # the rehearsal: every phase on this CPU, tiny model

Run `python -m scripts.gpu_check.prepare` first (here, with PyPI): it writes the carried folder
`.gpu-check/carry` (a pruned llama.cpp source and the python 3.12 wheels the device lacks).
On the device, from the carried tree alone (no registry, no network), the phases are:

- setup: unpack the source, install the wheels offline into `.gpu-check/work/site`;
- build: llama.cpp with CUDA for the GPU `nvidia-smi` reports (`90-real` on an H100/H200):
  libllama and libmtmd (llama-cpp-python loads them through `LLAMA_CPP_LIB_PATH`),
  llama-bench and llama-server from the same source; `--cpu`: the CPU build. A build is sent
  back under --out in parts, and a build of the same source carried by the preparation
  (`--builds`) is unpacked instead of building where the GPUs and the CPU's flags match;
- models (beside the build): the synthetic gpt-oss-20b (`--cpu`: the tiny one) and the trained
  tiny model;
- doctor: `gpt-oss-server doctor` on that build;
- load: the engine's load in child processes, the ways the server loads (load_probe.py); where
  only `serve`'s crashes, the import after which it does (bisected) and the native backtrace;
- bench: `gpt-oss-server bench`, every layer on the GPU, the four paths in rounds;
- concurrency: 4 and 8 streams against one, this server beside llama-server `-np`;
- speculation: the verify-cost curve k = 0..16 and auto/off on the copy workloads, then the
  trained model's Codex patch turn;
- tests: `pytest -m gpu` (the GPU-only tests; skipped on a machine without a GPU).

Each phase runs as a child process with a time budget, cut at the check's deadline, so a slow
phase costs only itself: what it had written is kept and the next phase starts. Everything is
written as it comes to `gpu-check.json` and `gpu-check.md` under `--out` ($OUT when set), with
the wall time of each phase and a tarball of the logs and raw results. Intermediate files stay
in `.gpu-check/work` (git-ignored): a second call on the same machine reuses the build and the
models, and `--phases` runs only some. Standard library only: it starts before the wheels are
installed, with the device's python3.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CARRY = ROOT / ".gpu-check" / "carry"
WORK = ROOT / ".gpu-check" / "work"
ARCHIVE = "llama-cpp-python.tar.xz"
TARGETS = ("llama", "mtmd", "llama-bench", "llama-server")
PHASES = ("setup", "build", "models", "doctor", "load", "bench", "concurrency", "speculation",
          "tests", "sampling", "floor", "stack", "ubatch")  # fmt: skip
# Where a driver's unversioned libcuda.so may be (CMake links the VMM pool against it).
LIBCUDA_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64")
REPORT_RESERVE_S = 15.0  # kept at the end for the table and the tarball
MIN_PHASE_S = 10.0  # a phase with less time than this left is not started
BUILD_PART_BYTES = 15 * 1024 * 1024  # the device tool returns files of up to 16 MiB
# in a build sent back: the CPU flags of the machine that built it (GGML_NATIVE: its CPU
# backend uses them), which a machine must have to run that build
CPU_FLAGS = "bin/cpu-flags.txt"


@dataclass
class Mode:
    """What differs between the device run and the CPU rehearsal: sizes, budgets, flags."""

    gpu: bool
    budgets: dict[str, float]
    preset: str
    ngl: str
    bench: str  # flags, split at the spaces
    concurrency: str
    streams: tuple[int, ...]
    speculation: str
    trained: str
    sampling: str
    floor: str
    stack: str
    ubatch: str


GPU = Mode(
    gpu=True,
    # On paper (devkit/notes/gpu-runbook.md): the build of one CUDA architecture on 16
    # cores, the 20b written beside it, the bench's 8 model loads, ...; their sum is over the
    # 540 s of one call, and the deadline cuts the last phases before the table is lost.
    budgets={
        "setup": 60,
        "build": 330,
        "models": 330,
        "doctor": 40,
        "load": 170,
        "bench": 300,  # the depth and streams pairs: ~20 llama-bench runs, 8 servers
        "concurrency": 110,
        "speculation": 110,
        "tests": 120,
        "sampling": 60,
        "floor": 90,
        "stack": 60,
        "ubatch": 75,
    },
    preset="20b",
    ngl="-1",
    bench="--prompt-tokens 512,4096 --gen-tokens 128 --repetitions 3 --rounds 1 "
    "--depths 0,4096,16384,32768 --streams 1,2,4,8 --pairs 5",
    concurrency="--prompt-tokens 64 --gen-tokens 128 --repetitions 1",
    streams=(4, 8),
    speculation="--rounds 2 --cost-rounds 3 --tokens 128",
    trained="--rounds 2",
    sampling="--prompt 512 --gen 128 --rounds 3",
    floor="--prompt 512 --gen 128 --rounds 3",
    stack="--prompt-tokens 512 --rounds 60",
    # 515: 512 and the three header tokens evaluated with a prompt's last chunk (last: the
    # first the phase's budget cuts)
    ubatch="--prompts 512,2048,4096 --ubatches 512,1024,2048,515 --repetitions 3",
)
CPU = Mode(
    gpu=False,
    budgets={
        "setup": 60,
        "build": 3000,
        "models": 300,
        "doctor": 60,
        "load": 120,
        "bench": 420,
        "concurrency": 180,
        "speculation": 420,
        "tests": 120,
        "sampling": 120,
        "floor": 180,
        "stack": 120,
        "ubatch": 120,
    },
    preset="tiny",
    ngl="0",
    bench="--prompt-tokens 512 --gen-tokens 64 --repetitions 2 --rounds 1 "
    "--depths 0,4096,16384 --streams 1,2,4 --pairs 3",
    concurrency="--prompt-tokens 32 --gen-tokens 32 --repetitions 1",
    streams=(4,),
    speculation="--rounds 1 --cost-rounds 2 --tokens 64 --only apply_patch no_copy",
    trained="--rounds 1",
    sampling="--prompt 64 --gen 32 --rounds 2",
    floor="--prompt 128 --gen 64 --rounds 2 --threads 2",
    stack="--prompt-tokens 128 --rounds 10",
    ubatch="--prompts 512,2048 --ubatches 512,1024 --repetitions 1 --threads 2",
)


@dataclass
class PhaseResult:
    name: str
    status: str = "not run"  # ok | failed | timed out | no time | skipped
    wall_s: float = 0.0
    budget_s: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


class Check:
    def __init__(
        self,
        mode: Mode,
        out: Path,
        budget_s: float,
        *,
        cuda_arch: str | None = None,
        carry: Path = CARRY,
        work: Path = WORK,
    ) -> None:
        self.mode = mode
        self.carry = carry
        self.out = out
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.work = work
        self.results_dir = self.work / "results"
        self.logs = self.work / "logs"
        self.build_dir = self.work / ("build-cuda" if mode.gpu else "build-cpu")
        self.lib_dir = self.bin_dir = self.build_dir / "bin"
        self.prebuilt = False
        self.pack = True  # send a build made here back for the next run to carry
        self.rebuild = False  # build even where a build of this source is carried
        self.build_packed: dict[str, Any] = {}
        self.phases: dict[str, PhaseResult] = {}
        self.machine: dict[str, Any] = {}
        self.model_paths: dict[str, str] = {}
        self.cuda_arch = cuda_arch
        self.background: dict[str, tuple[subprocess.Popen[bytes], float, float]] = {}
        for folder in (self.out, self.results_dir, self.logs):
            folder.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ the environment

    def env(self) -> dict[str, str]:
        """The children's environment: the carried llama_cpp package and wheels first, the
        library and binaries of this build, the models under the work folder."""
        env = dict(os.environ)
        paths = [str(self.work / "src")]
        if self.mode.gpu:
            paths.append(str(self.work / "site"))
            env["GPT_OSS_TEST_CACHE"] = str(self.work / "models")
        paths.append(str(ROOT))
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(":")
        env["LLAMA_CPP_LIB_PATH"] = str(self.lib_dir)
        env["GPT_OSS_LLAMA_BIN_DIR"] = str(self.bin_dir)
        env["PYTHONUNBUFFERED"] = "1"
        extra = self.machine.get("cuda_library_dirs", [])
        if extra:
            env["LD_LIBRARY_PATH"] = os.pathsep.join([*extra, env.get("LD_LIBRARY_PATH", "")])
        return env

    def left_s(self) -> float:
        return self.deadline - REPORT_RESERVE_S - time.monotonic()

    # ------------------------------------------------------------------ running children

    def run(
        self,
        name: str,
        commands: Sequence[Sequence[str]],
        result: PhaseResult,
        extra_env: dict[str, str] | None = None,
    ) -> bool:
        """Run commands one after another inside the phase's budget; False when one failed or
        the budget ran out (the rest is not started)."""
        log_path = self.logs / f"{name}.log"
        end = time.monotonic() + result.budget_s
        with log_path.open("a") as log:
            for command in commands:
                left = min(end, self.deadline - REPORT_RESERVE_S) - time.monotonic()
                if left < 1:
                    result.status = "timed out"
                    return False
                log.write(f"$ {' '.join(command)}\n")
                log.flush()
                proc = subprocess.Popen(
                    list(command), stdout=log, stderr=subprocess.STDOUT,
                    env=self.env() | (extra_env or {}), cwd=ROOT, start_new_session=True,
                )  # fmt: skip
                try:
                    code = proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    stop(proc)
                    log.write(f"\n[gpu_check] stopped at the phase's budget ({left:.0f} s)\n")
                    result.status = "timed out"
                    return False
                if code != 0:
                    result.status = "failed"
                    result.detail["exit_code"] = code
                    return False
        result.status = "ok"
        return True

    def phase(self, name: str, body: Callable[[PhaseResult], None]) -> None:
        result = PhaseResult(name, budget_s=min(self.mode.budgets[name], self.left_s()))
        self.phases[name] = result
        if result.budget_s < MIN_PHASE_S:
            result.status = "no time"
            self.save()
            return
        started = time.monotonic()
        print(f"[gpu_check] {name}: up to {result.budget_s:.0f} s", flush=True)
        try:
            body(result)
        except Exception as exc:  # a phase's own error must not cost the table
            result.status = "failed"
            result.detail["error"] = f"{type(exc).__name__}: {exc}"
        result.wall_s = round(time.monotonic() - started, 1)
        print(f"[gpu_check] {name}: {result.status} in {result.wall_s} s", flush=True)
        self.save()

    # ------------------------------------------------------------------ phases

    def setup(self, result: PhaseResult) -> None:
        manifest = json.loads((self.carry / "manifest.json").read_text())
        stamp = self.work / "src" / ".archive-sha256"
        if not stamp.is_file() or stamp.read_text() != manifest["archive_sha256"]:
            shutil.rmtree(self.work / "src", ignore_errors=True)
            (self.work / "src").mkdir(parents=True)
            with tarfile.open(self.carry / ARCHIVE) as archive:
                archive.extractall(self.work / "src", filter="data")
            stamp.write_text(manifest["archive_sha256"])
        result.detail["llama_cpp_python"] = manifest["llama_cpp_python"]
        if self.mode.gpu and not self.prebuilt and not self.rebuild:
            self.use_carried_build(manifest, result)
        wheels = sorted(str(p) for p in (self.carry / "wheels").glob("*.whl"))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
               "--no-compile", "--disable-pip-version-check"]  # fmt: skip
        if self.mode.gpu:
            command = [*pip, "--upgrade", "--target", str(self.work / "site"), *wheels]
        else:
            # this interpreter is not the device's 3.12: check the wheels would install there,
            # and run on this environment's own packages
            command = [*pip, "--dry-run", "--ignore-installed", "--target", str(self.work / "site"),
                       "--python-version", "3.12", "--implementation", "cp",
                       "--only-binary=:all:", *platform_flags(), *wheels]  # fmt: skip
        self.run("setup", [command], result)
        result.detail["wheels"] = len(wheels)

    def build_name(self, manifest: dict[str, Any]) -> str:
        """The file a build of this source for these GPUs is kept in, between device runs."""
        arch = (self.cuda_arch or cuda_arch_of(self.machine.get("gpus", []))).replace(";", "+")
        return f"build-{manifest['archive_sha256'][:12]}-{arch}.tar.xz"

    def use_carried_build(self, manifest: dict[str, Any], result: PhaseResult) -> None:
        """Unpack a build of this very source for these GPUs that an earlier device run sent
        back and the preparation carried: the build phase then has nothing to do."""
        try:
            name = self.build_name(manifest)
        except (RuntimeError, IndexError, ValueError):  # no GPU listed: the build phase says so
            return
        carried = self.carry / name
        if not carried.is_file():
            return
        with tarfile.open(carried) as archive:
            try:
                stored = archive.extractfile(CPU_FLAGS)
                needed = set(stored.read().decode().split()) if stored else set()
            except KeyError:
                needed = set()
            missing = sorted(needed - cpu_flags())
            if not needed or missing:  # the CPU backend was built for the machine it ran on
                result.detail["build"] = f"carried {name} not used: this CPU lacks {missing}"
                return
            shutil.rmtree(self.build_dir, ignore_errors=True)
            self.build_dir.mkdir(parents=True)
            archive.extractall(self.build_dir, filter="data")
        self.prebuilt = True
        result.detail["build"] = f"carried: {name}"

    def pack_build(self) -> None:
        """Send the build back (under $OUT, in parts the device tool returns) for the next
        run to carry: `python -m scripts.gpu_check.prepare --builds DIR` takes it."""
        xz = shutil.which("xz")
        manifest = json.loads((self.carry / "manifest.json").read_text())
        if xz is None or not (self.build_dir / "bin").is_dir():
            return
        name = self.build_name(manifest)
        packed = self.work / name
        started = time.monotonic()
        (self.build_dir / CPU_FLAGS).write_text(" ".join(sorted(cpu_flags())) + "\n")
        with packed.open("wb") as sink:
            tar = subprocess.Popen(["tar", "-C", str(self.build_dir), "-cf", "-", "bin"],
                                   stdout=subprocess.PIPE)  # fmt: skip
            subprocess.run([xz, "-T0", "-6"], stdin=tar.stdout, stdout=sink, check=True)
            tar.wait()
        data = packed.read_bytes()
        parts = [data[i : i + BUILD_PART_BYTES] for i in range(0, len(data), BUILD_PART_BYTES)]
        for index, part in enumerate(parts):
            (self.out / f"{name}.part{index}").write_bytes(part)
        packed.unlink()
        self.build_packed = {"name": name, "bytes": len(data), "parts": len(parts),
                             "seconds": round(time.monotonic() - started, 1)}  # fmt: skip

    def build_commands(self) -> list[list[str]]:
        source = self.work / "src" / "vendor" / "llama.cpp"
        flags = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
                 "-DGGML_RPC=ON", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
                 "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"]  # fmt: skip
        if self.mode.gpu:
            flags += cuda_flags(self.cuda_arch, self.machine)
        jobs = str(os.cpu_count() or 2)
        return [
            ["cmake", "-S", str(source), "-B", str(self.build_dir), *flags],
            ["cmake", "--build", str(self.build_dir), "-j", jobs, "--target", *TARGETS],
        ]

    def models_command(self) -> list[str]:
        code = (
            "import json; from devkit.models import cached_gguf; "
            f"print('MODELS=' + json.dumps({{'main': str(cached_gguf({self.mode.preset!r})), "
            "'trained': str(cached_gguf('trained'))}))"
        )
        return [sys.executable, "-c", code]

    def start_background(self, name: str, commands: list[list[str]]) -> None:
        """Start a phase beside the next ones (the build beside the models): one shell runs
        its commands in order; `finish_background` waits for it inside its budget."""
        budget = min(self.mode.budgets[name], self.left_s())
        script = " && ".join(shell_join(c) for c in commands)
        log = (self.logs / f"{name}.log").open("a")
        log.write(f"$ {script}\n")
        log.flush()
        proc = subprocess.Popen(["bash", "-c", script], stdout=log, stderr=subprocess.STDOUT,
                                env=self.env(), cwd=ROOT, start_new_session=True)  # fmt: skip
        self.background[name] = (proc, time.monotonic(), budget)
        print(f"[gpu_check] {name}: started, up to {budget:.0f} s", flush=True)

    def finish_background(self, name: str) -> None:
        proc, started, budget = self.background.pop(name)
        result = PhaseResult(name, budget_s=round(budget))
        self.phases[name] = result
        left = min(started + budget, self.deadline - REPORT_RESERVE_S) - time.monotonic()
        try:
            code = proc.wait(timeout=max(left, 0.1))
            result.status = "ok" if code == 0 else "failed"
            if code:
                result.detail["exit_code"] = code
        except subprocess.TimeoutExpired:
            stop(proc)
            result.status = "timed out"
        result.wall_s = round(time.monotonic() - started, 1)
        print(f"[gpu_check] {name}: {result.status} in {result.wall_s} s", flush=True)
        self.save()

    def models(self, result: PhaseResult) -> None:
        log_path = self.logs / "models.log"
        if self.run("models", [self.models_command()], result):
            for line in log_path.read_text().splitlines():
                if line.startswith("MODELS="):
                    self.model_paths = json.loads(line.removeprefix("MODELS="))
            result.detail.update(self.model_paths)
            result.detail["main_bytes"] = Path(self.model_paths["main"]).stat().st_size

    def doctor(self, result: PhaseResult) -> None:
        self.run("doctor", [[sys.executable, "-m", "server", "doctor"]], result)
        text = (self.logs / "doctor.log").read_text(errors="replace")
        backends = next((ln.strip() for ln in text.splitlines() if "backends:" in ln), "")
        result.detail["backends"] = backends
        if self.mode.gpu and "CUDA" not in backends:
            result.status = "failed"
            result.detail["error"] = "the build has no CUDA backend"

    def load(self, result: PhaseResult) -> None:
        """The model loaded the ways the server loads it (scripts/gpu_check/load_probe.py):
        which variant crashes, if one does, with its stage; the import after which `serve`'s
        load crashes (bisected); the native backtrace."""
        out = self.results_dir / "probe"
        command = [sys.executable, "-m", "scripts.gpu_check.load_probe", self.model_paths["main"],
                   "--out", str(out), "--timeout", "40", "--gdb", "--bisect"]  # fmt: skip
        self.run("load", [command], result)
        report = out / "probe.json"
        if report.is_file():
            probe = json.loads(report.read_text())
            variants = probe.get("variants", {})
            result.detail["variants"] = {name: [v["returncode"], v["last_stage"]]
                                         for name, v in variants.items()}  # fmt: skip
            if "bisect" in probe:
                result.detail["bisect"] = {k: v for k, v in probe["bisect"].items() if k != "tries"}
            if any(v["returncode"] != 0 for v in variants.values()):
                result.status = "failed"

    def bench(self, result: PhaseResult) -> None:
        out = self.results_dir / "bench.json"
        out.unlink(missing_ok=True)
        command = [sys.executable, "-m", "server", "bench", "--model", self.model_paths["main"],
                   "--n-gpu-layers", self.mode.ngl, *self.mode.bench.split(), "--no-chart",
                   "--out", str(out)]  # fmt: skip
        self.run("bench", [command], result)
        if out.is_file():
            result.detail.update(bench_summary(json.loads(out.read_text())))

    def concurrency(self, result: PhaseResult) -> None:
        commands, outs = [], []
        for streams in self.mode.streams:
            out = self.results_dir / f"concurrency-{streams}.json"
            out.unlink(missing_ok=True)
            outs.append((streams, out))
            flags = ["--model", self.model_paths["main"], "--streams", str(streams)]
            flags += ["--n-gpu-layers", self.mode.ngl, *self.mode.concurrency.split()]
            commands.append(
                [sys.executable, "-m", "scripts.bench.concurrency", *flags, "--out", str(out)]
            )
        self.run("concurrency", commands, result)
        for streams, out in outs:
            if out.is_file():
                result.detail[f"{streams}_streams"] = concurrency_summary(
                    json.loads(out.read_text())
                )

    def speculation(self, result: PhaseResult) -> None:
        main = self.results_dir / "speculation.json"
        trained = self.results_dir / "speculation-trained.json"
        for out in (main, trained):
            out.unlink(missing_ok=True)
        spec = [sys.executable, "-m", "scripts.bench.speculative", "--n-gpu-layers"]
        spec += [self.mode.ngl, *(["--threads", str(os.cpu_count())] if self.mode.gpu else [])]
        synthetic = ["--model", self.model_paths["main"], *self.mode.speculation.split()]
        trained_flags = ["--model", self.model_paths["trained"], "--preset", "trained"]
        trained_flags += ["--trained", "--only", "trained_codex_patch", "--skip-cost"]
        trained_flags += self.mode.trained.split()
        commands = [
            [*spec, *synthetic, "--out", str(main)],
            [*spec, *trained_flags, "--out", str(trained)],
        ]
        self.run("speculation", commands, result)
        for key, out in (("synthetic", main), ("trained", trained)):
            if out.is_file():
                result.detail[key] = speculation_summary(json.loads(out.read_text()))

    def sampling(self, result: PhaseResult) -> None:
        """llama.cpp's backend sampling against the server's host sampler (sampled), and both
        greedy, which must agree token for token."""
        outs = {key: self.results_dir / f"sampling-{key}.json" for key in ("sampled", "greedy")}
        for out in outs.values():
            out.unlink(missing_ok=True)
        base = [sys.executable, "-m", "scripts.bench.backend_sampling", "--n-gpu-layers"]
        base += [self.mode.ngl, "--model", self.model_paths["main"]]
        base += ["--threads", str(os.cpu_count() if self.mode.gpu else 2)]
        commands = [
            [*base, *self.mode.sampling.split(), "--out", str(outs["sampled"])],
            [*base, "--prompt", "64", "--gen", "32", "--rounds", "1", "--temperature", "0",
             "--out", str(outs["greedy"])],
        ]  # fmt: skip
        self.run("sampling", commands, result)
        for key, out in outs.items():
            if out.is_file():
                report = json.loads(out.read_text())
                keys = ("median_tokens_per_s", "backend_vs_host", "greedy_identical", "switch_ms")
                result.detail[key] = {k: report[k] for k in keys if k in report}

    def floor(self, result: PhaseResult) -> None:
        """Where a token's time goes (scripts/bench/token_floor.py): llama-bench, the engine's
        context in a bare Python loop, the same loop sampling, the engine and its steps' split."""
        keys = ("tokens_per_s", "added_per_token", "medians")
        self.script_phase("floor", "scripts.bench.token_floor", self.mode.floor, keys, result)

    def stack(self, result: PhaseResult) -> None:
        """The HTTP stack alone beside `serve` and llama-server (scripts/bench/stack_floor.py):
        each one's time to a first token beyond its prefill, on this machine's CPU."""
        keys = ("beyond_prefill_ms", "differences_ms")
        self.script_phase("stack", "scripts.bench.stack_floor", self.mode.stack, keys, result)

    def ubatch(self, result: PhaseResult) -> None:
        """Prefill tokens/s and compute buffers by llama.cpp's ubatch size (scripts/bench/
        ubatch.py): whether `serve` should evaluate prompts in larger ubatches on this GPU."""
        keys = ("by_ubatch",)
        self.script_phase("ubatch", "scripts.bench.ubatch", self.mode.ubatch, keys, result)

    def script_phase(
        self, name: str, module: str, flags: str, keys: Sequence[str], result: PhaseResult
    ) -> None:
        """A bench script on the main model with the mode's flags; `keys` of its JSON report
        go into the phase's detail."""
        out = self.results_dir / f"{name}.json"
        out.unlink(missing_ok=True)
        command = [sys.executable, "-m", module, "--n-gpu-layers", self.mode.ngl, "--model",
                   self.model_paths["main"], *flags.split(), "--out", str(out)]  # fmt: skip
        self.run(name, [command], result)
        if out.is_file():
            report = json.loads(out.read_text())
            result.detail.update({k: report[k] for k in keys if k in report})

    def tests(self, result: PhaseResult) -> None:
        junit = self.results_dir / "gpu-tests.xml"
        junit.unlink(missing_ok=True)
        command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                   "-o", "addopts=-ra", "--junitxml", str(junit), "tests/gpu"]  # fmt: skip
        env = {"GPT_OSS_REQUIRE_GPU": "1", "GPT_OSS_GPU_MODEL": self.model_paths["main"]}
        self.run("tests", [command], result, env if self.mode.gpu else None)
        if junit.is_file():
            result.detail.update(junit_summary(junit))
        if not self.mode.gpu and result.status == "ok":
            result.detail["note"] = "no GPU here: the GPU tests skip"

    # ------------------------------------------------------------------ the whole run

    def main(self, only: Sequence[str]) -> int:
        self.machine = machine_info(self.mode.gpu)
        self.save()
        want = [p for p in PHASES if not only or p in only]
        self.keep_earlier(want)
        if "setup" in want:
            self.phase("setup", self.setup)
        if "build" in want and not self.prebuilt:
            try:
                self.start_background("build", self.build_commands())
            except Exception as exc:  # no GPU to build for, no nvcc: said in the table
                failed = PhaseResult("build", status="failed")
                failed.detail["error"] = f"{type(exc).__name__}: {exc}"
                self.phases["build"] = failed
        if "models" in want or any(p in want for p in PHASES[3:]):
            self.phase("models", self.models)
        if "build" in self.background:
            self.finish_build()
        self.machine["libstdcxx"] = libstdcxx_linkage(self.lib_dir)
        measuring = (("doctor", self.doctor), ("load", self.load), ("bench", self.bench),
                     ("concurrency", self.concurrency), ("speculation", self.speculation),
                     ("tests", self.tests), ("sampling", self.sampling),
                     ("floor", self.floor), ("stack", self.stack),
                     ("ubatch", self.ubatch))  # fmt: skip
        for name, body in measuring:  # the GPU tests run without the models too
            if name in want and (self.model_paths or name == "tests"):
                self.phase(name, body)
        self.save(final=True)
        not_ok = [r.name for r in self.phases.values() if r.status != "ok"]
        print(self.markdown(), flush=True)
        return 1 if not_ok else 0

    def finish_build(self) -> None:
        """Wait for the build beside the models; on the device, send it back for next time."""
        self.finish_background("build")
        if self.mode.gpu and self.phases["build"].status == "ok" and self.pack:
            try:
                self.pack_build()
            except (OSError, subprocess.CalledProcessError) as exc:  # the measuring goes on
                self.build_packed = {"error": f"{type(exc).__name__}: {exc}"}

    def keep_earlier(self, want: Sequence[str]) -> None:
        """The phases an earlier call on this machine ran and this one does not (`--phases`
        runs the rest after a call that ran out of time): their rows stay in the table."""
        state = self.work / "gpu-check.json"
        if not state.is_file():
            return
        earlier = json.loads(state.read_text())
        if earlier.get("mode") != self.mode_name:
            return
        for row in earlier.get("phases", []):
            if row["name"] not in want:
                result = PhaseResult(**row)
                result.detail["earlier_call"] = True
                self.phases[result.name] = result

    @property
    def mode_name(self) -> str:
        return "gpu" if self.mode.gpu else "cpu rehearsal"

    def save(self, final: bool = False) -> None:
        report = {
            "mode": self.mode_name,
            "llama_cpp": "prebuilt: " + str(self.lib_dir) if self.prebuilt else "built here",
            "build_sent_back": self.build_packed,
            "machine": self.machine,
            "wall_s": round(time.monotonic() - self.started, 1),
            "phases": [vars(r) for r in self.phases.values()],
        }
        text = json.dumps(report, indent=1) + "\n"
        write_atomic(self.out / "gpu-check.json", text)
        write_atomic(self.work / "gpu-check.json", text)
        write_atomic(self.out / "gpu-check.md", self.markdown())
        if final:
            with tarfile.open(self.out / "gpu-check-logs.tar.gz", "w:gz") as tar:
                tar.add(self.logs, arcname="logs")
                tar.add(self.results_dir, arcname="results")

    def markdown(self) -> str:
        return render_markdown(self.mode.gpu, self.machine, list(self.phases.values()),
                               round(time.monotonic() - self.started, 1))  # fmt: skip


# ---------------------------------------------------------------------- helpers


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a child and everything it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def shell_join(command: Sequence[str]) -> str:
    import shlex

    return shlex.join(command)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def platform_flags() -> list[str]:
    flags = []
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"):
        flags += ["--platform", tag]
    return flags


def capture(command: Sequence[str]) -> str:
    try:
        done = subprocess.run(
            list(command), capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def machine_info(gpu: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "system": f"{platform.system()} {platform.machine()}",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "commit": capture(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]) or None,
        # CMake builds with these where set (the first GPU machine's image set other compilers)
        "compilers": {name: os.environ[name] for name in ("CC", "CXX") if name in os.environ},
    }
    gpus = capture(["nvidia-smi", "--query-gpu=name,memory.total,compute_cap,driver_version",
                    "--format=csv,noheader"])  # fmt: skip
    info["gpus"] = [line.strip() for line in gpus.splitlines() if line.strip()]
    root = cuda_root()
    info["cuda_root"] = str(root) if root else None
    release = capture([str(root / "bin" / "nvcc"), "--version"]).splitlines() if root else []
    info["nvcc"] = release[-1] if release else None
    if gpu:
        info["cuda_library_dirs"] = cuda_library_dirs(root)
    return info


def libstdcxx_linkage(bin_dir: Path) -> str | None:
    """How the build's libllama has libstdc++: "shared" (it needs libstdc++.so.6) or "static"
    (its own copy: then it must load before numpy's shared one; docs/gpu.md, "The load-order
    crash"); None without the library or readelf."""
    library = next(iter(sorted(bin_dir.glob("libllama.so*"))), None)
    dynamic = capture(["readelf", "-d", str(library)]) if library else ""
    if "NEEDED" not in dynamic:
        return None
    return "shared" if "libstdc++.so" in dynamic else "static"


def cpu_flags() -> set[str]:
    """The flags of this machine's CPU (/proc/cpuinfo); empty where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cuda_arch_of(gpus: Sequence[str]) -> str:
    """CMAKE_CUDA_ARCHITECTURES for the GPUs nvidia-smi lists ("9.0" -> "90-real")."""
    archs = set()
    for line in gpus:
        cap = line.split(",")[2].strip()
        major, minor = cap.split(".")
        archs.add("120a-real" if major == "12" else f"{major}{minor}-real")
    if not archs:
        raise RuntimeError("nvidia-smi lists no GPU")
    return ";".join(sorted(archs))


def cuda_root() -> Path | None:
    """The CUDA toolkit: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, or above the nvcc on PATH
    (which may be a wrapper script: the root is where bin/nvcc and include/cuda.h are)."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent.parent))
    for candidate in filter(None, candidates):
        root = Path(candidate)
        has_headers = (root / "include" / "cuda.h").is_file() or (root / "targets").is_dir()
        if (root / "bin" / "nvcc").is_file() and has_headers:
            return root.resolve()
    return None


def cuda_library_dirs(root: Path | None) -> list[str]:
    """Where cuBLAS is when the toolkit has none: the python's NVIDIA wheels (nvidia/cu13)."""
    if root is not None and (
        list(root.glob("lib*/libcublas.so*")) or list(root.glob("targets/*/lib/libcublas.so*"))
    ):
        return []
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    bases = list(spec.submodule_search_locations or []) if spec else []
    found: list[str] = []
    for base in bases:
        found += sorted({str(p.parent) for p in Path(base).glob("**/lib/libcublas.so*")})
    return found


def cuda_flags(arch: str | None, machine: dict[str, Any]) -> list[str]:
    """CMake flags of the CUDA build: the toolkit beside nvcc; cuBLAS from the python's NVIDIA
    wheels where the toolkit has none; llama.cpp's legacy memory pool (GGML_CUDA_NO_VMM) where
    there is no libcuda.so to link against (docs/gpu.md: the same choice as the PyPI build)."""
    if not machine.get("cuda_root"):
        raise RuntimeError("no CUDA toolkit (nvcc) found")
    root = Path(machine["cuda_root"])
    flags = [
        "-DGGML_CUDA=ON",
        f"-DCMAKE_CUDA_ARCHITECTURES={arch or cuda_arch_of(machine['gpus'])}",
    ]
    flags += [f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}", f"-DCUDAToolkit_ROOT={root}"]
    includes = []
    for lib_dir in machine.get("cuda_library_dirs", []):
        folder = Path(lib_dir)
        for name, var in (("libcublas.so", "CUDA_cublas_LIBRARY"),
                          ("libcublasLt.so", "CUDA_cublasLt_LIBRARY")):  # fmt: skip
            match = sorted(folder.glob(f"{name}*"))
            if match:
                flags.append(f"-D{var}={match[0]}")
        if (folder.parent / "include").is_dir():
            includes.append(f"-I{folder.parent / 'include'}")
    if includes:
        flags += [
            f"-DCMAKE_CUDA_FLAGS={' '.join(includes)}",
            f"-DCMAKE_CXX_FLAGS={' '.join(includes)}",
        ]
    stubs = [*root.glob("lib*/stubs/libcuda.so"), *root.glob("targets/*/lib/stubs/libcuda.so")]
    if not stubs and not any(Path(d, "libcuda.so").exists() for d in LIBCUDA_DIRS):
        flags.append("-DGGML_CUDA_NO_VMM=ON")
    return flags


# ---------------------------------------------------------------------- summaries


def median(stats: dict[str, Any] | None) -> float | None:
    return None if not stats else stats.get("median")


def bench_summary(report: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, dict[str, float | None]] = {}
    for name, path in report.get("paths", {}).items():
        row: dict[str, float | None] = {}
        for label, metrics in path.get("tests", {}).items():
            row[f"{label} tok/s"] = median(metrics.get("tokens_per_s"))
            if "ttft_ms" in metrics:
                row[f"{label} TTFT ms"] = median(metrics["ttft_ms"])
        if path.get("error"):
            row["error"] = path["error"][:300]
        rows[name] = row
    return {
        "paths": rows,
        "ratios": report.get("ratios"),
        "ms_per_token_over_llama_bench": report.get("ms_per_token_over_llama_bench"),
        "ttft_http_overhead_ms": report.get("ttft_http_overhead_ms"),
        "paired": paired_summary(report),
    }


def paired_summary(report: dict[str, Any]) -> dict[str, Any]:
    """Per paired section (depth, streams): each row's medians and paired ratio with its
    interval, or the section's error."""
    out: dict[str, Any] = {}
    for key in ("depth", "streams"):
        section = report.get(key)
        if not section:
            continue
        if section.get("error"):
            out[key] = {"error": str(section["error"])[:300]}
            continue
        ref = section["reference"]
        out[key] = {"reference": ref, "rows": [
            {key: entry[key], "http": median((entry.get("http") or {}).get("tokens_per_s")),
             ref: median((entry.get(ref) or {}).get("tokens_per_s")),
             "ratio": (entry.get("ratio") or {}).get("median"),
             "interval_95": (entry.get("ratio") or {}).get("interval_95")}
            for entry in section.get("rows", [])
        ]}  # fmt: skip
    return out


def concurrency_summary(report: dict[str, Any]) -> dict[str, Any]:
    keys = ("single_tokens_per_s", "aggregate_tokens_per_s", "speedup")
    paths = {name: {k: path.get(k) for k in keys} for name, path in report.get("paths", {}).items()}
    return {"paths": paths, "ratios": report.get("ratios")}


def speculation_summary(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cost = report.get("verify_cost")
    if cost:
        out["verify_cost"] = cost.get("cost") or cost
    out["workloads"] = {
        name: {k: v for k, v in work.items() if not isinstance(v, (list, dict))}
        for name, work in report.get("workloads", {}).items()
    }
    return out


def junit_summary(path: Path) -> dict[str, Any]:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return {}
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return counts | {"failed": failed}


def readable(value: float | None) -> str:
    """87,960 and 1,553, 55.3, 5.41 (server/bench/report.py's rule; this file imports nothing
    of the server)."""
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{round(value):,}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# phases whose table section is their results as JSON lines: (heading, the detail's keys)
JSON_SECTIONS = {
    "load": ("load: the server's ways of loading the model", ("variants", "bisect")),
    "speculation": ("speculation", ("synthetic", "trained")),
    "sampling": ("sampling: llama.cpp's backend against the host", ("sampled", "greedy")),
    "floor": (
        "floor: where a token's time goes (ms)",
        ("tokens_per_s", "added_per_token", "medians"),
    ),
    "stack": (
        "stack: the HTTP stack alone, serve and llama-server beyond the prefill (ms)",
        ("beyond_prefill_ms", "differences_ms"),
    ),
    "ubatch": ("ubatch: prefill tokens/s and compute buffers (MiB) by size", ("by_ubatch",)),
}


def json_sections(by_name: dict[str, PhaseResult]) -> list[str]:
    lines: list[str] = []
    for phase, (heading, keys) in JSON_SECTIONS.items():
        result = by_name.get(phase)
        if result and result.detail:
            lines += ["", f"## {heading}", ""]
            found = [k for k in keys if k in result.detail]
            lines += [f"- {k}: `{json.dumps(result.detail[k])}`" for k in found]
    return lines


def render_markdown(gpu: bool, machine: dict[str, Any], phases: list[PhaseResult],
                    wall_s: float) -> str:  # fmt: skip
    device = "; ".join(machine.get("gpus") or []) or "no GPU"
    lines = [
        f"# GPU check ({'device' if gpu else 'CPU rehearsal'}): {device}",
        "",
        f"{machine.get('cpus')} CPUs, python {machine.get('python')}, "
        f"{machine.get('nvcc') or 'no nvcc'}, commit {machine.get('commit')}, "
        f"load average at start {machine.get('load_average')}; total {wall_s} s. "
        f"Compilers {machine.get('compilers') or 'CMake defaults'}; libllama's libstdc++ "
        f"{machine.get('libstdcxx') or 'unknown'}.",
        "",
        "| phase | status | wall s | budget s |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r.name} | {r.status}{' (earlier call)' if r.detail.get('earlier_call') else ''} "
        f"| {r.wall_s} | {r.budget_s:.0f} |"
        for r in sorted(phases, key=lambda r: PHASES.index(r.name))
    ]
    by_name = {r.name: r for r in phases}
    bench = by_name.get("bench")
    if bench and bench.detail.get("paths"):
        rows = bench.detail["paths"]
        columns = sorted({c for row in rows.values() for c in row if c != "error"})
        lines += ["", "## bench (medians)", "", "| path | " + " | ".join(columns) + " |",
                  "|" + " --- |" * (len(columns) + 1)]  # fmt: skip
        for name, row in rows.items():
            cells = [readable(row.get(c)) for c in columns]  # type: ignore[arg-type]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", f"ratios: `{json.dumps(bench.detail.get('ratios'))}`",
                  f"ms/token over llama-bench: "
                  f"`{json.dumps(bench.detail.get('ms_per_token_over_llama_bench'))}`"]  # fmt: skip
    for key, section in ((bench.detail.get("paired") or {}) if bench else {}).items():
        if "error" in section:
            lines += ["", f"## bench {key}: failed: {section['error']}"]
            continue
        ref = section["reference"]
        lines += ["", f"## bench {key} (paired medians, tok/s)", "",
                  f"| {key} | http | {ref} | http / {ref} | 95 % interval |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for row in section["rows"]:
            interval = "–".join(f"{v:.3f}" for v in row["interval_95"] or [])
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
            lines.append(f"| {row[key]} | {readable(row['http'])} | {readable(row[ref])} "
                         f"| {ratio} | {interval or '-'} |")  # fmt: skip
    conc = by_name.get("concurrency")
    if conc and any(k.endswith("_streams") for k in conc.detail):
        lines += ["", "## concurrency (decode tok/s)", "",
                  "| streams | path | 1 stream | N streams aggregate | speed-up |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for key, value in conc.detail.items():
            if not key.endswith("_streams"):
                continue
            for name, path in value["paths"].items():
                lines.append(f"| {key.split('_')[0]} | {name} | "
                             f"{readable(path['single_tokens_per_s'])} | "
                             f"{readable(path['aggregate_tokens_per_s'])} | "
                             f"{readable(path['speedup'])} |")  # fmt: skip
    lines += json_sections(by_name)
    tests = by_name.get("tests")
    if tests and "tests" in tests.detail:
        d = tests.detail
        lines += ["", f"## GPU tests: {d['tests']} tests, {d['failures']} failed, "
                  f"{d['errors']} errors, {d['skipped']} skipped"]  # fmt: skip
        lines += [f"- failed: {name}" for name in d.get("failed", [])]
    errors = [(r.name, r.detail.get("error")) for r in phases if r.detail.get("error")]
    if bench:
        paths = bench.detail.get("paths", {})
        errors += [(f"bench {n}", row["error"]) for n, row in paths.items() if row.get("error")]
    if errors:
        lines += ["", "## errors", ""] + [f"- {name}: {error}" for name, error in errors]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cpu", action="store_true", help="the rehearsal on this CPU")
    parser.add_argument("--carry", type=Path, default=CARRY, help="the prepared folder")
    parser.add_argument("--work", type=Path, default=WORK, help="builds, models, logs")
    parser.add_argument("--out", type=Path, default=None, help="default: $OUT or .gpu-check/out")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="deadline of the whole run (540 s; --cpu: 3600)",
    )
    parser.add_argument("--phases", nargs="*", choices=PHASES, default=[])
    parser.add_argument("--cuda-arch", default=None, help="default: the GPUs' own (nvidia-smi)")
    parser.add_argument(
        "--lib-dir",
        type=Path,
        help="no build: llama.cpp's libraries from this folder (an installed llama_cpp/lib), "
        "for a machine too slow to build or another build's numbers",
    )
    parser.add_argument("--bin-dir", type=Path, help="with --lib-dir: llama-bench, llama-server")
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="build even where the carried folder holds a build of this source",
    )
    parser.add_argument(
        "--no-send-build",
        action="store_true",
        help="do not write the build under --out for the next run to carry",
    )
    args = parser.parse_args(argv)
    if not (args.carry / "manifest.json").is_file():
        print("no carried folder: run python -m scripts.gpu_check.prepare first", file=sys.stderr)
        return 2
    mode = CPU if args.cpu else GPU
    out = args.out or Path(os.environ.get("OUT") or ROOT / ".gpu-check" / "out")
    budget = args.budget_s or (540.0 if mode.gpu else 3600.0)
    check = Check(
        mode,
        out,
        budget,
        cuda_arch=args.cuda_arch,
        carry=args.carry.resolve(),
        work=args.work.resolve(),
    )
    check.rebuild = args.rebuild
    check.pack = not args.no_send_build
    if args.lib_dir:
        check.prebuilt = True
        check.lib_dir = args.lib_dir.resolve()
        check.bin_dir = (args.bin_dir or args.lib_dir).resolve()
    return check.main(args.phases)


if __name__ == "__main__":
    sys.exit(main())

"""The GPU check's load probe (scripts/gpu_check/load_probe.py) finds the import after which a
load crashes.

On the first GPU run `serve` died by SIGSEGV in llama.cpp's vocabulary load while the same
load in a bare process passed. The probe bisects serve's import order for the first module that
makes the load crash; here, where nothing crashes, a child is made to die by SIGSEGV once a
chosen module is imported (GPU_CHECK_PROBE_FAULT_AFTER), and the bisection must name it.
"""

from __future__ import annotations

import json
from pathlib import Path

from devkit.models import cached_gguf
from tests.support.repo_python import run_python


def test_the_bisection_names_the_import_after_which_the_load_crashes(tmp_path: Path) -> None:
    model = cached_gguf("tiny")
    done = run_python(
        ["-m", "scripts.gpu_check.load_probe", str(model), "--out", str(tmp_path), "--bisect",
         "--variants", "engine", "engine-after-serve-imports", "vocab-after-serve-imports"],
        timeout=600, env={"GPU_CHECK_PROBE_FAULT_AFTER": "fastapi"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "probe.json").read_text())
    variants = report["variants"]
    assert variants["engine"]["returncode"] == 0
    assert variants["engine"]["last_stage"] == "done"
    assert variants["engine-after-serve-imports"]["returncode"] == -11
    assert variants["vocab-after-serve-imports"]["returncode"] == -11
    bisect = report["bisect"]
    assert bisect["load"] == "vocab"  # the vocabulary alone crashes too: the quicker load
    assert bisect["culprit"].split(".")[0] == "fastapi", bisect
    assert bisect["culprit_alone_crashes"] is True
    assert not any(name.split(".")[0] == "fastapi" for name in bisect["imported_before"])
    # each try's prefix either crashed or not, and the culprit sits between the two closest
    crashing = min(t["prefix"] for t in bisect["tries"] if t["returncode"] == -11)
    passing = max(t["prefix"] for t in bisect["tries"] if t["returncode"] == 0)
    assert crashing == passing + 1

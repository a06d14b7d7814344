"""The JSON report: per path min/median/max of every metric, ratios to raw llama.cpp, overheads."""

from __future__ import annotations

import json
import shlex
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from server.bench.plan import Measurement, PathRun

GIB = 1024**3
RAW_PATHS = ("llama-bench", "llama-server")
QUIET_CPUS = 0.15  # a measurement is "quiet" when other processes kept at most this many busy


def print_json(report: Mapping[str, Any], out: Path | None) -> None:
    """A benchmark script's result: printed as JSON, and written to `out` when one is given."""
    text = json.dumps(report, indent=2)
    if out is not None:
        out.write_text(text + "\n")
    print(text)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def summarize(measurements: Sequence[Measurement]) -> dict[str, dict[str, float]]:
    """Every metric that all measurements of a test have -> its summary."""
    keys = [k for k in measurements[0] if all(k in m for m in measurements)]
    return {key: summary([m[key] for m in measurements]) for key in keys}


def quiet(measurements: Sequence[Measurement]) -> list[Measurement]:
    """The measurements during which other processes kept at most QUIET_CPUS busy."""
    return [m for m in measurements if m.get("other_cpus", 0.0) <= QUIET_CPUS]


def path_report(run: PathRun) -> dict[str, Any]:
    peak = run.peak_rss_bytes
    quiet_tests = {label: quiet(ms) for label, ms in run.tests.items()}
    return {
        "tests": {label: summarize(ms) for label, ms in run.tests.items() if ms},
        "tests_quiet": {label: summarize(ms) for label, ms in quiet_tests.items() if ms},
        "samples": run.tests,
        "peak_rss_bytes": peak,
        "peak_rss_gib": round(peak / GIB, 3) if peak else None,
        "load_s": round(run.load_s, 2) if run.load_s is not None else None,
        "other_processes_cpus": run.other_cores,
        "commands": [shlex.join(command) for command in run.commands],
        "notes": run.notes,
        "error": run.error,
    }


def median_of(
    paths: Mapping[str, Any], path: str, label: str, metric: str, tests: str = "tests"
) -> float | None:
    test = paths.get(path, {}).get(tests, {}).get(label, {})
    value = test.get(metric, {}).get("median")
    return None if value is None else float(value)


def ratios(paths: Mapping[str, Any], tests: str = "tests") -> dict[str, dict[str, float]]:
    """Median tokens/s of each path over each raw llama.cpp path, per test."""
    out: dict[str, dict[str, float]] = {}
    for raw in RAW_PATHS:
        for path in paths:
            if path in (raw, "llama-bench"):
                continue
            per_test = {}
            for label in paths[path].get(tests, {}):
                mine = median_of(paths, path, label, "tokens_per_s", tests)
                ref = median_of(paths, raw, label, "tokens_per_s", tests)
                if mine and ref:
                    per_test[label] = round(mine / ref, 4)
            if per_test:
                out[f"{path}/{raw}"] = per_test
    return out


def server_cost(paths: Mapping[str, Any], tests: str = "tests") -> dict[str, dict[str, float]]:
    """Per path and decode test: ms per token above llama-bench's (1000/tps - 1000/tps_bench).

    llama-bench decodes without sampling or serving: the difference is what a path adds per
    token (sampling, scheduling, streaming), from the median tokens/s of each.
    """
    out: dict[str, dict[str, float]] = {}
    reference = paths.get("llama-bench", {}).get(tests, {})
    for path in paths:
        if path == "llama-bench":
            continue
        per_test = {}
        for label in reference:
            mine = median_of(paths, path, label, "tokens_per_s", tests)
            ref = median_of(paths, "llama-bench", label, "tokens_per_s", tests)
            if label.startswith("tg") and mine and ref:
                per_test[label] = round(1000 / mine - 1000 / ref, 3)
        if per_test:
            out[path] = per_test
    return out


def ttft_http_overhead(paths: Mapping[str, Any]) -> dict[str, Any] | None:
    """The worst median over the prefill sizes of (time to first token - prefill) via HTTP, in ms.

    Taken from the quiet measurements when there are some (`basis`), else from all; None when
    the http path measured no prefill.
    """
    for basis in ("tests_quiet", "tests"):
        labels = [k for k in paths.get("http", {}).get(basis, {}) if k.startswith("pp")]
        values = [median_of(paths, "http", k, "ttft_overhead_ms", basis) for k in labels]
        known = [v for v in values if v is not None]
        if known:
            return {"value": round(max(known), 4), "basis": basis}
    return None


def markdown_table(report: Mapping[str, Any], tests: str = "tests") -> str:
    """Medians per path: tokens/s of every test, time to first token, peak RSS."""
    paths: Mapping[str, Any] = report["paths"]
    labels: list[str] = []
    for path in paths.values():
        labels += [label for label in path.get(tests, {}) if label not in labels]
    labels.sort(key=lambda label: (label[:2] != "pp", int(label[2:])))
    decode = [label for label in labels if label.startswith("tg")]
    cost = server_cost(paths, tests)
    head = ["path", *(f"{label} tok/s" for label in labels)]
    head += [f"{label} ms/token over llama-bench" for label in decode]
    head += ["TTFT ms", "peak RSS GiB"]
    head.append("CPUs busy with other work")
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    first_pp = next((label for label in labels if label.startswith("pp")), "")
    for name, path in paths.items():
        cells = [name]
        cells += [_cell(paths, name, label, "tokens_per_s", tests) for label in labels]
        cells += [_cost_cell(cost, name, label) for label in decode]
        cells.append(_cell(paths, name, first_pp, "ttft_ms", tests))
        cells.append(str(path.get("peak_rss_gib") or "-"))
        cells.append(", ".join(f"{x:.2f}" for x in path.get("other_processes_cpus", [])) or "-")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _cost_cell(cost: Mapping[str, Mapping[str, float]], path: str, label: str) -> str:
    value = cost.get(path, {}).get(label)
    return "-" if value is None else f"{value:+.3f}"


def _cell(paths: Mapping[str, Any], path: str, label: str, metric: str, tests: str) -> str:
    value = median_of(paths, path, label, metric, tests)
    if value is None:
        return "-"
    stats = paths[path][tests][label][metric]
    return f"{readable(value)} ({readable(stats['min'])}–{readable(stats['max'])})"


def readable(value: float) -> str:
    """A rate or a time as people read it: 87,960 and 1,553 (not 8.796e+04), 55.3, 5.41."""
    if abs(value) >= 100:
        return f"{round(value):,}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def pairs_table(report: Mapping[str, Any]) -> str:
    """The paired sections: median tokens/s of each side and the median of the pairs' ratios
    with its bootstrap 95 % interval, per depth and per stream count."""
    tables = []
    for key, title in (("depth", "decode tok/s at depth"), ("streams", "aggregate decode tok/s")):
        section = report.get(key)
        if not section:
            continue
        if section.get("error"):
            tables.append(f"{title}: failed: {section['error']}")
            continue
        ref = section["reference"]
        head = [key, "http", ref, f"http / {ref} (95 % interval)", "pairs"]
        rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for entry in section["rows"]:
            cells = [str(entry[key]), _median(entry["http"]), _median(entry[ref])]
            ratio = entry["ratio"]
            if ratio is None:
                cells += ["-", "-"]
            else:
                low, high = ratio["interval_95"]
                cells += [f"{ratio['median']:.3f} ({low:.3f}–{high:.3f})", str(ratio["pairs"])]
            rows.append("| " + " | ".join(cells) + " |")
        notes = "".join(f"\n{note}" for note in section.get("notes", []))
        tables.append(f"{title}, {section['gen_tokens']} tokens:\n" + "\n".join(rows) + notes)
    return "\n\n".join(tables)


def _median(summary: Mapping[str, Any] | None) -> str:
    if not summary:
        return "-"
    stats = summary["tokens_per_s"]
    return f"{readable(stats['median'])} ({readable(stats['min'])}–{readable(stats['max'])})"

"""The PNG chart: one panel per test (tokens/s), then time to first token and peak memory; below
them the paired sections (decode at depth, aggregate decode of N streams) with their ratios.

Bars are medians, whiskers span min..max, one colour per path. Needs matplotlib (the `bench`
extra); without it the chart is skipped with a warning.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from server.bench.report import readable

log = logging.getLogger(__name__)

COLOURS = {
    "http": "#1f77b4",
    "inprocess": "#2ca02c",
    "llama-bench": "#7f7f7f",
    "llama-server": "#ff7f0e",
}


def panels(report: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(title, test label or '*', metric) of each panel."""
    labels: list[str] = []
    for path in report["paths"].values():
        labels += [label for label in path.get("tests", {}) if label not in labels]
    labels.sort(key=lambda label: (label[:2] != "pp", int(label[2:])))
    found = [(f"{label} tokens/s", label, "tokens_per_s") for label in labels]
    first_pp = next((label for label in labels if label.startswith("pp")), None)
    if first_pp is not None:
        found.append((f"time to first token, {first_pp} (ms)", first_pp, "ttft_ms"))
    found.append(("peak RSS (GiB)", "*", "peak_rss_gib"))
    return found


def bar(path: Mapping[str, Any], label: str, metric: str) -> tuple[float, float, float] | None:
    """(median, below, above) of a metric of a path, or None."""
    if label == "*":
        value = path.get(metric)
        return (float(value), 0.0, 0.0) if value else None
    stats = path.get("tests", {}).get(label, {}).get(metric)
    if not stats:
        return None
    median = float(stats["median"])
    return median, median - float(stats["min"]), float(stats["max"]) - median


def draw_pairs(rates: Any, ratios: Any, section: Mapping[str, Any], key: str) -> None:
    """Two panels of a paired section: the median tokens/s of both sides (whiskers min..max)
    per depth or stream count, and the median ratio with its 95 % interval."""
    ref = section["reference"]
    entries = section["rows"]
    ticks = [str(entry[key]) for entry in entries]
    for name, offset in (("http", -0.2), (ref, 0.2)):
        for x, entry in enumerate(entries):
            stats = (entry.get(name) or {}).get("tokens_per_s")
            if not stats:
                continue
            median = float(stats["median"])
            below, above = median - float(stats["min"]), float(stats["max"]) - median
            label = name if x == 0 else None
            rates.bar(x + offset, median, width=0.4, color=COLOURS.get(name, "#9467bd"),
                      yerr=[[below], [above]], capsize=3, label=label)  # fmt: skip
    title = "decode tok/s at depth" if key == "depth" else "aggregate decode tok/s, streams"
    rates.set_title(title, fontsize=10)
    rates.set_xticks(range(len(ticks)), ticks, fontsize=8)
    rates.legend(fontsize=7)
    for x, entry in enumerate(entries):
        ratio = entry.get("ratio")
        if not ratio:
            continue
        median = float(ratio["median"])
        low, high = (float(v) for v in ratio["interval_95"])
        ratios.errorbar(x, median, yerr=[[median - low], [high - median]], fmt="o",
                        color=COLOURS["http"], capsize=4)  # fmt: skip
        ratios.annotate(f"{median:.3f}", (x, high), ha="center", va="bottom", fontsize=8)
    ratios.axhline(1.0, color="#7f7f7f", linewidth=0.8)
    ratios.set_title(f"http / {ref}, median of pairs, 95 % interval", fontsize=9)
    ratios.set_xticks(range(len(ticks)), ticks, fontsize=8)
    ratios.set_xlabel("depth (tokens)" if key == "depth" else "streams", fontsize=8)


def draw_chart(report: Mapping[str, Any], png_path: Path) -> bool:
    """Draw the chart; False (and a warning) when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        log.warning("matplotlib is not installed (pip install 'gpt-oss-server[bench]'); no chart")
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = panels(report)
    names = list(report["paths"])
    paired = [key for key in ("depth", "streams") if (report.get(key) or {}).get("rows")]
    columns = max(len(layout), 2 * len(paired))
    rows = 2 if paired else 1
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 4.2 * rows), squeeze=False)
    for ax in [*axes[0][len(layout) :], *(axes[1][2 * len(paired) :] if paired else [])]:
        ax.set_visible(False)
    for i, key in enumerate(paired):
        draw_pairs(axes[1][2 * i], axes[1][2 * i + 1], report[key], key)
    for ax, (title, label, metric) in zip(axes[0], layout, strict=False):
        for i, name in enumerate(names):
            value = bar(report["paths"][name], label, metric)
            if value is None:
                continue
            median, below, above = value
            ax.bar(i, median, color=COLOURS.get(name, "#9467bd"), yerr=[[below], [above]],
                   capsize=4)  # fmt: skip
            ax.annotate(readable(median), (i, median), ha="center", va="bottom", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    settings = report["settings"]
    fig.suptitle(
        f"{Path(report['model']['path']).name}: {settings['n_threads']} threads, "
        f"ngl {settings['n_gpu_layers']}, {report['machine']['cpu']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return True

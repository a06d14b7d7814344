"""The PNG chart: one panel per test (tokens/s), then time to first token and peak memory.

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
    fig, axes = plt.subplots(1, len(layout), figsize=(3.2 * len(layout), 4.2), squeeze=False)
    for ax, (title, label, metric) in zip(axes[0], layout, strict=True):
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

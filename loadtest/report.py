"""Figures for the load test and the benchmark: percentiles, per-second timelines, the chart.

Latencies are kept in seconds and reported in milliseconds, rounded to 3 decimals.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtest import ROOT


def checkout_python(checkout: Path) -> str:
    """The Python a benchmark runs ``checkout``'s code in: for this checkout, the interpreter
    the benchmark was started with; for another, its own ``.venv`` Python, else this
    interpreter run in the checkout (``-c`` and ``-m`` put the working folder first on
    ``sys.path``)."""
    venv = checkout / ".venv/bin/python"
    mine = checkout.resolve() == ROOT
    return str(venv) if not mine and venv.exists() else sys.executable


def child_json(command: list[str], cwd: Path) -> dict[str, Any]:
    """Run a benchmark's child process and read the JSON object on its last output line."""
    result = subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True)
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def ms(seconds: float) -> float:
    return round(float(seconds) * 1000.0, 3)


def percentiles(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """``p50 / p95 / p99 / max`` in ms (None when there is no value)."""
    if len(values) == 0:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    arr = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"p50": ms(p50), "p95": ms(p95), "p99": ms(p99), "max": ms(float(np.max(arr)))}


def summary(values: Sequence[float], seconds: float) -> dict[str, Any]:
    """Count, rate over ``seconds`` and percentiles of a list of latencies."""
    out: dict[str, Any] = {"count": len(values)}
    out["rps"] = round(len(values) / seconds, 1) if seconds > 0 else 0.0
    out.update(percentiles(values))
    return out


def timeline(
    samples: Iterable[tuple[float, float]], seconds: float, bucket: float = 1.0
) -> list[dict[str, Any]]:
    """Per ``bucket`` of ``(t_end, latency)`` samples: count, rps, p50 and p99 (ms)."""
    buckets = max(1, int(np.ceil(seconds / bucket)))
    grouped: list[list[float]] = [[] for _ in range(buckets)]
    for t, latency in samples:
        k = int(t // bucket)
        if 0 <= k < buckets:
            grouped[k].append(latency)
    rows = []
    for k, values in enumerate(grouped):
        row: dict[str, Any] = {"t": round(k * bucket, 3), "count": len(values)}
        row["rps"] = round(len(values) / bucket, 1)
        pct = percentiles(values)
        row["p50"], row["p99"] = pct["p50"], pct["p99"]
        rows.append(row)
    return rows


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain fixed-width text table."""
    cells = [[str(h) for h in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                               enumerate(zip(row, widths, strict=True))))  # fmt: skip
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")


def chart(
    path: Path,
    agents: list[dict[str, Any]],
    deliveries: list[dict[str, Any]],
    title: str,
) -> None:
    """PNG: agent latency p50/p99 per second (top) and throughput per second (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True)
    t = [row["t"] for row in agents]
    top.plot(t, [row["p50"] or np.nan for row in agents], label="agents p50")
    top.plot(t, [row["p99"] or np.nan for row in agents], label="agents p99")
    td = [row["t"] for row in deliveries]
    top.plot(td, [row["p99"] or np.nan for row in deliveries], ":", label="webhook ack p99")
    top.set_ylabel("latency (ms)")
    top.set_ylim(bottom=0)  # from zero: a flat run must look flat
    top.grid(True, alpha=0.3)
    # Legends sit above the axes, never over a line.
    top.legend(loc="lower left", bbox_to_anchor=(0, 1.01), ncol=3, frameon=False)
    bottom.plot(t, [row["rps"] for row in agents], label="agent requests/s")
    twin = bottom.twinx()
    twin.plot(td, [row["rps"] for row in deliveries], color="tab:red", label="deliveries/s")
    bottom.set_ylabel("agent requests/s")
    twin.set_ylabel("deliveries/s", color="tab:red")
    bottom.set_ylim(bottom=0)
    twin.set_ylim(bottom=0)
    bottom.set_xlabel("seconds since start of the timed phase")
    bottom.grid(True, alpha=0.3)
    lines = bottom.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    bottom.legend(
        lines[0] + more[0], lines[1] + more[1],
        loc="lower left", bbox_to_anchor=(0, 1.01), ncol=2, frameon=False,
    )  # fmt: skip
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

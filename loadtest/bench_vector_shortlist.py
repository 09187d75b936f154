"""The vector search's cost with and without the tied rows at the shortlist's cut-off, side by
side: this checkout's ``kbgraph.graphalgo.nearest.nearest`` against another copy of that
module (``--baseline``, e.g. main's), called alternately on the same rows and queries, so the
machine's noise hits both alike. Rows: random unit vectors (d = 256; their sign codes tie at
the cut-off as real ones do) and, separately, a case of 4,200 identical ones among them (the
old code cut those by row).

    git show main:kbgraph/graphalgo/nearest.py > main-vectors.py
    .venv/bin/python -m loadtest.bench_vector_shortlist --baseline main-vectors.py

Last line: JSON with each side's median (µs), the ratio this/baseline and the rows this
re-ranks, per case."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from kbgraph.graphalgo import nearest as ours
from loadtest.bench_algorithms import unit_vectors

DIM = 256
TIED = 4_200


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # numba's cache finds the module by name
    spec.loader.exec_module(module)
    return module


def side_by_side(
    sides: dict[str, ModuleType], rows: np.ndarray, queries: np.ndarray, rounds: int
) -> dict[str, Any]:
    q8, scale, codes = ours.quantize(rows)
    mask = np.ones(len(rows), np.uint8)
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for module in sides.values():
        module.nearest(q8, scale, codes, mask, queries[0], limit=50)  # compiled, warm
    order = list(sides.items())
    for i in range(rounds):
        query = queries[i % len(queries)]
        for name, module in order if i % 2 else order[::-1]:  # each first in half the rounds
            t = time.perf_counter_ns()
            module.nearest(q8, scale, codes, mask, query, limit=50)
            samples[name].append((time.perf_counter_ns() - t) / 1000.0)
    medians: dict[str, float] = {name: round(float(np.median(s)), 1) for name, s in samples.items()}
    medians["ratio"] = round(medians["this"] / medians["baseline"], 3)
    medians["reranked_rows"] = reranked(codes, queries[: min(rounds, len(queries))])
    return medians


def reranked(codes: np.ndarray, queries: np.ndarray) -> float:
    """Rows this checkout re-ranks a query, on average: every row within the Hamming distance
    of the ``SHORTLIST``-th nearest (the baseline re-ranks exactly ``SHORTLIST``)."""
    counts = []
    for code in ours.sign_codes(queries):
        distance = np.bitwise_count(codes ^ code).sum(axis=1)
        cut = np.partition(distance, ours.SHORTLIST - 1)[ours.SHORTLIST - 1]
        counts.append(int((distance <= cut).sum()))
    return round(float(np.mean(counts)), 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loadtest.bench_vector_shortlist", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--baseline", required=True, type=Path, help="another vectors.py")
    ap.add_argument("--sizes", default="100000,1000000", help="comma list of row counts")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args(argv)
    sides = {"this": ours, "baseline": load(args.baseline)}
    queries = unit_vectors(64, DIM, seed=2)
    figures: dict[str, dict[str, Any]] = {}
    for n in [int(size) for size in args.sizes.split(",")]:
        rows = unit_vectors(n, DIM, seed=1)
        figures[f"random_{n}"] = side_by_side(sides, rows, queries, args.rounds)
        rows[:TIED] = queries[0]  # thousands of one text, and the query is that text
        figures[f"tied_{TIED}_of_{n}"] = side_by_side(sides, rows, queries[:1], args.rounds)
        print(n, figures[f"random_{n}"], figures[f"tied_{TIED}_of_{n}"], flush=True)
    print(json.dumps({"kind": "vector_shortlist", "dim": DIM, "median_us": figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

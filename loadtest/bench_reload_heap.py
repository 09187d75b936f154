"""The cyclic collector after a reload of the projections, with and without the heap settled.

A ``kbgraph serve`` worker settles its heap once it is ready and again after each reload of its
projections (``kbgraph.service.Service.settle``: one full collection, then ``gc.freeze()``).
This measures, in this one process, what the second settle costs and buys. A store of
``--concepts`` concepts (``bench_restart``'s synthetic KB, mentions on, no vectors) is filled,
its projection loaded and the heap settled as a worker's at start-up. Then, ``--rounds``
times, a reload left as it was before (``plain``) and a reload settled after it (``settled``),
each followed by ``--collections`` full collections (``gc.collect()``) timed: what every full
collection pauses every thread for from then on. The settle's own collection is the one pause
a reload adds. ``--source checkpoint`` (the default): the reloads start from a checkpoint
written after the first build, as a worker's does when another wrote one and cut the log;
``store``: they build from the store. The last line is one JSON object with the medians.

    .venv/bin/python -m loadtest.bench_reload_heap [--concepts 200000] [--rounds 3]
        [--collections 3] [--source checkpoint|store]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kbgraph.projection import Projections, warm_up
from kbgraph.service import settle_heap
from kbgraph.store import Store
from loadtest.bench_restart import fill


def timed(fn: Callable[[], object]) -> float:
    """``fn()``'s wall time in ms."""
    start = time.perf_counter()
    fn()
    return round((time.perf_counter() - start) * 1e3, 1)


def reload_round(p: Projections, settle: bool, collections: int) -> dict[str, Any]:
    """One reload, settled after it or not, then ``collections`` full collections timed."""
    gc.collect()  # what the round before left, collected before the reload is timed
    out: dict[str, Any] = {"reload_ms": timed(p.reload)}
    if settle:
        out["settle_ms"] = timed(settle_heap)
    out["tracked"] = len(gc.get_objects())  # the containers it walks (a column's list: one)
    out["collect_ms"] = [timed(gc.collect) for _ in range(collections)]
    return out


def measure(store: Store, folder: Path | None, rounds: int, collections: int) -> dict[str, Any]:
    """The projection of ``store`` loaded (a checkpoint written in ``folder``, if one) and
    settled, then ``rounds`` rounds of a plain and a settled reload; the medians."""
    p = Projections(store, checkpoints=folder, log_retain=0)
    p.load()
    if folder is not None:
        p.write_checkpoint()
    start_settle_ms = timed(settle_heap)
    print(json.dumps({"start_settle_ms": start_settle_ms}), flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "settled": []}
    for _ in range(rounds):
        for kind in ("plain", "settled"):
            figures = reload_round(p, kind == "settled", collections)
            assert (p.loaded_from is not None) is (folder is not None)
            runs[kind].append(figures)
            print(json.dumps({kind: figures}), flush=True)
    out: dict[str, Any] = {}
    for kind, each in runs.items():
        collect = statistics.median(t for run in each for t in run["collect_ms"])
        out[f"{kind}_collect_ms"] = round(collect, 1)
        out[f"{kind}_tracked"] = statistics.median(run["tracked"] for run in each)
    out["settle_ms"] = round(statistics.median(run["settle_ms"] for run in runs["settled"]), 1)
    out["start_settle_ms"] = start_settle_ms
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_reload_heap", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--concepts", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--collections", type=int, default=3)
    parser.add_argument("--source", choices=["checkpoint", "store"], default="checkpoint")
    args = parser.parse_args()
    warm_up()
    summary: dict[str, Any] = {"concepts": args.concepts, "source": args.source}
    with (
        tempfile.TemporaryDirectory(prefix="kbgraph-reload-heap-") as tmp,
        Store(Path(tmp) / "kb.db") as store,
    ):
        fill_s = fill(store, args.concepts)
        print(json.dumps({"filled": args.concepts, "seconds": round(fill_s, 1)}), flush=True)
        folder = Path(tmp) / "checkpoints" if args.source == "checkpoint" else None
        summary |= measure(store, folder, args.rounds, args.collections)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

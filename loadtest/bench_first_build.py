"""First start without a checkpoint, side by side: this checkout against a peer checkout.

Each run is a fresh process of one checkout (its own ``.venv``) that builds every projection
from a copy of one filled store (``bench_restart --keep-filled`` makes one; the store schema
must be the same in both) with no checkpoint folder: wall seconds, CPU seconds (the machine
is shared, so CPU is the steadier figure), and the peak resident memory of the process. Runs
alternate peer / this ``--rounds`` times; the last line is one JSON object with the medians,
this over peer, and the aims of issue 26 (first start at 1M concepts <= 15 s, <= 1.2 GB).

    .venv/bin/python -m loadtest.bench_first_build --filled STORE --peer CHECKOUT [--rounds 1]
        [--mentions off]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest import ROOT
from loadtest.report import child_json

AIMS = {"ready_s": 15.0, "peak_rss_mb": 1200.0}

CHILD = """
import json, resource, sys, time
from pathlib import Path
from kbgraph.projection import Projections, warm_up
from kbgraph.store import Store
warm_up()
store = Store(Path(sys.argv[1]))
mentions = sys.argv[2] == "on"
p = Projections(store, checkpoints=None, log_retain=0, mentions=lambda kb: mentions)
wall, cpu = time.perf_counter(), time.process_time()
p.load()
out = {"ready_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out["concepts"] = sum(len(p.get(k).nodes) for k in p.names())
store.close()
print(json.dumps(out))
"""


def run(checkout: Path, filled: Path, mentions: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kbgraph-first-") as tmp:
        db = Path(tmp) / "kb.db"
        shutil.copyfile(filled, db)
        return child_json(
            [str(checkout / ".venv/bin/python"), "-c", CHILD, str(db), mentions], checkout
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_first_build", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--filled", type=Path, required=True, help="a filled store to copy")
    parser.add_argument(
        "--peer", type=Path, required=True, help="a checkout to compare with (with its .venv)"
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--mentions",
        choices=["on", "off"],
        default="on",
        help="keep mention edges (the default; off: the build without their scan)",
    )
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"peer": [], "this": []}
    for _ in range(args.rounds):
        for name, checkout in (("peer", args.peer), ("this", ROOT)):
            start = time.perf_counter()
            runs[name].append(run(checkout, args.filled, args.mentions))
            print(name, json.dumps(runs[name][-1]), f"({time.perf_counter() - start:.1f} s)")
    med = {
        name: {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]}
        for name, rs in runs.items()
    }
    ratio = {k: round(med["this"][k] / med["peer"][k], 3) for k in ("ready_s", "cpu_s",
                                                                    "peak_rss_mb")}  # fmt: skip
    met = {k: med["this"][k] <= aim for k, aim in AIMS.items()}
    print(f"{'':8}{'ready s':>10}{'CPU s':>10}{'peak MB':>10}")
    for name in ("peer", "this"):
        m = med[name]
        print(f"{name:8}{m['ready_s']:>10}{m['cpu_s']:>10}{m['peak_rss_mb']:>10}")
    print(json.dumps({"peer": med["peer"], "this": med["this"], "this_over_peer": ratio,
                      "rounds": args.rounds, "mentions": args.mentions, "aims": AIMS,
                      "met": met}))  # fmt: skip


if __name__ == "__main__":
    main()

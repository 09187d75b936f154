"""Disk benchmark: a KB rewritten ten times and then compacted, against the same state written once.

Two stores of the synthetic KB of ``bench_projection`` (``--concepts`` ids, 8 random out-links
each, a two-word title and text), filled through ``Store.append`` in 1,000-event deliveries:

- once: every concept upserted once;
- rewritten: every concept upserted ``--rewrites`` times (each time with new links and a new
  title), then a checkpoint and the log cut it allows (``Projections.write_checkpoint``, the
  default ``log_retain`` of 10,000 records and ``dedupe_keys`` of 1,000,000 per KB).

Sizes are the SQLite file with its WAL after a truncating WAL checkpoint; the checkpoint file is
reported beside them. The last line is one JSON object; the aim (issue 15) is the rewritten
store within 2x of the one written once.

    .venv/bin/python -m loadtest.bench_disk [--concepts 100000] [--rewrites 10]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from kbgraph.projection import Projections
from kbgraph.store import Store
from loadtest.bench_projection import cid, synthetic_links
from loadtest.bench_restart import DELIVERY, KB, upsert

AIM = 2.0


def write(store: Store, n: int, rounds: int) -> None:
    for r in range(rounds):
        dst = synthetic_links(n + r)  # other links each round
        for first in range(0, n, DELIVERY):
            rows = dst[first : first + DELIVERY].tolist()
            store.append(
                KB,
                [
                    upsert(first + k, r + 1, sorted({cid(j % n) for j in row}))
                    for k, row in enumerate(rows)
                ],
            )


def truncate_wal(store: Store) -> None:
    """Move the WAL into the main file, so that the file's size is all there is."""
    with store.reading() as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def size(db: Path) -> int:
    return sum(f.stat().st_size for f in db.parent.glob(db.name + "*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_disk", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--concepts", type=int, default=100_000)
    parser.add_argument("--rewrites", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kbgraph-disk-") as tmp:
        once, rewritten = Path(tmp) / "once" / "kb.db", Path(tmp) / "rewritten" / "kb.db"
        start = time.perf_counter()
        with Store(once) as store:
            write(store, args.concepts, 1)
            truncate_wal(store)
        once_bytes = size(once)
        with Store(rewritten) as store:
            write(store, args.concepts, args.rewrites)
            truncate_wal(store)
            before_bytes = size(rewritten)
            p = Projections(store, checkpoints=rewritten.parent / "checkpoints")
            p.load()
            t0 = time.perf_counter()
            path = p.write_checkpoint()
            compaction_s = time.perf_counter() - t0
            assert path is not None
            truncate_wal(store)
            after_bytes = size(rewritten)
            checkpoint_bytes = path.stat().st_size
        mb = 2**20
        print(
            json.dumps(
                {
                    "concepts": args.concepts,
                    "rewrites": args.rewrites,
                    "written_once_mb": round(once_bytes / mb, 1),
                    "rewritten_before_compaction_mb": round(before_bytes / mb, 1),
                    "rewritten_after_compaction_mb": round(after_bytes / mb, 1),
                    "checkpoint_file_mb": round(checkpoint_bytes / mb, 1),
                    "checkpoint_and_cut_s": round(compaction_s, 2),
                    "ratio_after_to_once": round(after_bytes / once_bytes, 2),
                    "seconds": round(time.perf_counter() - start, 1),
                    "aim": AIM,
                    "met": after_bytes / once_bytes <= AIM,
                }
            )
        )


if __name__ == "__main__":
    main()

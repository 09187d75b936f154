"""Restart benchmark: how soon a process is ready after a restart, with and without a checkpoint.

A real store is filled with the synthetic KB of ``bench_projection`` (ids over 9 collections,
8 random out-links each, a two-word title and text) through ``Store.append`` in 1,000-event
deliveries. Then, each in a fresh process (so the figures are one process's, imports and
kernel loading excluded):

1. first build: ``Projections.load`` with no checkpoint (the store read and the build), its
   time and resident memory; then ``write_checkpoint`` (time, file size).
2. after ``--tail`` more events reach the log, a restart: ``Projections.load`` from the
   checkpoint and the log after it, its time and resident memory; then a search and a
   follow of one more delivery, to show the loaded arrays serve and take patches, and of one
   changing a text (with mentions, it walks the name trie the checkpoint carries; from a
   checkpoint without one, format 2 and before, the first such builds it).

``--tail-texts N``: the last N events of the tail change their concept's text (a restart from a
checkpoint without the name trie builds it while it applies them, before it is ready).
``--peer CHECKOUT``: the same phases with that checkout's code (its ``.venv``, else this
Python) on a copy of the same filled store, after this checkout's; both sides' figures are
printed.

The last line is one JSON object with the figures and the aims of issue 15 (ready <= 3 s and
<= 800 MB RSS after a restart from a checkpoint at 1M concepts), met true/false (this side's).

    .venv/bin/python -m loadtest.bench_restart [--concepts 1000000] [--tail 10000]
        [--keep-filled FILE | --filled FILE]   (fill once, then reuse a copy)
        [--mentions on|off]   (the KB's mention edges kept, as by default, or not)
        [--tail-texts 0] [--peer CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil

from kbgraph.events import ConceptUpserted, Event, UpsertData
from kbgraph.projection import Projections, warm_up
from kbgraph.store import Store
from loadtest import ROOT
from loadtest.bench_projection import LINKS, TYPES, WORDS, cid, synthetic_links
from loadtest.report import checkout_python, child_json

KB = "bench"
DELIVERY = 1_000
AIMS = {"restart_ready_s": 3.0, "restart_rss_mb": 800.0}


def upsert(i: int, version: int, links: list[str]) -> Event:
    data = UpsertData(
        version=version,
        title=f"{WORDS[i % 10]} {i}",
        type=TYPES[i % len(TYPES)],
        status="active",
        text=f"{WORDS[(i * 7) % 10]} {WORDS[(i * 3) % 10]}",
        links=links,
    )
    return ConceptUpserted(
        specversion="1.0", id=f"r{version}-{i}", source="bench", subject=cid(i), data=data
    )


def fill(store: Store, n: int) -> float:
    dst = synthetic_links(n)
    start = time.perf_counter()
    for first in range(0, n, DELIVERY):
        rows = dst[first : first + DELIVERY].tolist()
        batch = [upsert(first + k, 1, sorted({cid(j) for j in row})) for k, row in enumerate(rows)]
        store.append(KB, batch)
    return time.perf_counter() - start


def rss_mb() -> float:
    return round(float(psutil.Process().memory_info().rss) / 2**20, 1)


def child(db: Path, folder: Path, phase: str, mentions: bool) -> dict[str, Any]:
    """One phase in this (fresh) process: load, then checkpoint (first) or use (restart)."""
    warm_up()
    base = rss_mb()
    store = Store(db)
    p = Projections(store, checkpoints=folder, log_retain=0, mentions=lambda kb: mentions)
    start = time.perf_counter()
    p.load()
    while p.follow_once():
        pass
    ready = time.perf_counter() - start
    out: dict[str, Any] = {
        "ready_s": round(ready, 3),
        "rss_mb": rss_mb(),
        "rss_added_mb": round(rss_mb() - base, 1),
        "from_checkpoint": p.loaded_from is not None,
        "gid": p.gid,
    }
    if phase == "first":
        start = time.perf_counter()
        path = p.write_checkpoint()
        out["checkpoint_write_s"] = round(time.perf_counter() - start, 3)
        out["checkpoint_mb"] = round(path.stat().st_size / 2**20, 1) if path else None
    else:
        kb = p.get(KB)
        assert kb is not None
        with kb.read() as snap:
            nodes, _ = snap.index.search(WORDS[3], snap.view(None).mask)
            out["search_hits"] = len(nodes)
        store.append(KB, [upsert(0, 10**6, [cid(1), cid(2)])])
        start = time.perf_counter()
        while p.follow_once():
            pass
        out["follow_after_restart_ms"] = round((time.perf_counter() - start) * 1e3, 2)
        changed = upsert(1, 10**6, [cid(2)])  # a new text: with mentions, walks the name trie
        text = msgspec.structs.replace(changed.data, text="a text changed after the restart")
        store.append(KB, [msgspec.structs.replace(changed, data=text)])
        start = time.perf_counter()
        while p.follow_once():
            pass
        out["text_change_after_restart_ms"] = round((time.perf_counter() - start) * 1e3, 2)
        out["rss_after_use_mb"] = rss_mb()
    store.close()
    return out


def run_child(checkout: Path, db: Path, folder: Path, phase: str, mentions: str) -> dict[str, Any]:
    python = checkout_python(checkout)
    command = [python, "-m", "loadtest.bench_restart", "--child", phase, "--mentions", mentions]
    return child_json([*command, "--db", str(db), "--folder", str(folder)], checkout)


def side(checkout: Path, db: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The first build and the restart after the tail, with ``checkout``'s code on ``db``."""
    folder = db.parent / f"{db.stem}.checkpoints"
    first = run_child(checkout, db, folder, "first", args.mentions)
    print(json.dumps({"checkout": str(checkout), "first_build": first}), flush=True)
    with Store(db) as store:  # the log goes on past the checkpoint
        dst = synthetic_links(args.concepts)
        for start in range(0, args.tail, DELIVERY):
            batch = []
            for i in range(start, min(args.tail, start + DELIVERY)):
                u = (i * 7919) % args.concepts
                links = sorted({cid(j) for j in dst[u].tolist()[: LINKS - 1]})
                event = upsert(u, 2, links)
                if i >= args.tail - args.tail_texts:
                    text = msgspec.structs.replace(event.data, text=f"a tail text {i}")
                    event = msgspec.structs.replace(event, data=text)
                batch.append(event)
            store.append(KB, batch)
    restart = run_child(checkout, db, folder, "restart", args.mentions)
    print(json.dumps({"checkout": str(checkout), "restart": restart}), flush=True)
    return {"first_build": first, "restart": restart}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_restart", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--concepts", type=int, default=1_000_000)
    parser.add_argument("--tail", type=int, default=10_000)
    parser.add_argument("--filled", type=Path, help="start from a copy of this filled store")
    parser.add_argument("--keep-filled", type=Path, help="save the filled store here")
    parser.add_argument(
        "--mentions",
        choices=["on", "off"],
        default="on",
        help="keep mention edges, as a KB does by default (on), or not (off)",
    )
    parser.add_argument(
        "--tail-texts", type=int, default=0, help="events of the tail that change a text"
    )
    parser.add_argument("--peer", type=Path, help="a checkout to run beside this one")
    parser.add_argument("--child", choices=["first", "restart"])
    parser.add_argument("--db", type=Path)
    parser.add_argument("--folder", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.db, args.folder, args.child, args.mentions == "on")))
        return
    with tempfile.TemporaryDirectory(prefix="kbgraph-restart-") as tmp:
        db = Path(tmp) / "kb.db"
        if args.filled is not None:  # a copy of a store filled before (filling takes minutes)
            shutil.copyfile(args.filled, db)
        else:
            with Store(db) as store:
                fill_s = fill(store, args.concepts)
            print(json.dumps({"filled": args.concepts, "seconds": round(fill_s, 1)}), flush=True)
            if args.keep_filled is not None:
                shutil.copyfile(db, args.keep_filled)
        peer_db = Path(tmp) / "peer.db"
        if args.peer is not None:
            shutil.copyfile(db, peer_db)
        this = side(ROOT, db, args)
        peer = side(args.peer, peer_db, args) if args.peer is not None else None
        first, restart = this["first_build"], this["restart"]
        figures = {
            "restart_ready_s": restart["ready_s"],
            "restart_rss_mb": restart["rss_mb"],
        }
        print(
            json.dumps(
                {
                    "concepts": args.concepts,
                    "tail_events": args.tail,
                    "tail_texts": args.tail_texts,
                    "mentions": args.mentions,
                    "first_build": first,
                    "restart": restart,
                    "aims": AIMS,
                    "met": {k: figures[k] <= AIMS[k] for k in AIMS},
                    "peer": peer,
                }
            )
        )


if __name__ == "__main__":
    main()

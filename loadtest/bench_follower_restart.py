"""The follower after a restart from a checkpoint, side by side with a peer checkout.

A process that starts from a checkpoint finds ids and search keys through the checkpoint's
hashed columns (``KeyIndex``) instead of dicts; this measures what that costs the follower.
``bench_ingest``'s concepts (a title, 40 words of text, 4 links, a tag), in 500-event
deliveries: ``--base`` deliveries stored and followed, a checkpoint written, ``--batches``
more stored; then the follower's CPU (its thread's time) per event to apply those, as a
process restarted from the checkpoint follows them (``restarted``) and as the process that
built its projection from the store does (``built``), mentions on, no vectors. Each
checkout runs in a child process of its own (the peer: ``--peer CHECKOUT``, its ``.venv``
or this Python with the peer first on the path), alternating ``--rounds`` times; the last
line is one JSON object with the medians and this over peer.

    .venv/bin/python -m loadtest.bench_follower_restart --peer CHECKOUT [--rounds 2]
        [--base 20] [--batches 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from loadtest import ROOT
from loadtest.report import checkout_python, child_json

CHILD = r"""
import hashlib, json, sys, tempfile, time
from pathlib import Path
from kbgraph.http.binding import decode_events
from kbgraph.projection import Projections, warm_up
from kbgraph.store import Store, WebhookMessage
from loadtest.bench_ingest import SECRET, Concepts
from tests import webhook_client as wc

base, batches = int(sys.argv[1]), int(sys.argv[2])
warm_up()
concepts = Concepts("r", 1)

def deliver(store, count):
    for _ in range(count):
        body, headers = wc.delivery(SECRET, [concepts.next() for _ in range(500)])
        message = WebhookMessage(headers["webhook-id"], hashlib.sha256(body).digest())
        store.append("bench", decode_events(body, headers), message=message)

def follow(p):
    t = time.thread_time()
    while p.follow_once():
        pass
    return (time.thread_time() - t) / (batches * 500) * 1e6

with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp) / "checkpoints"
    store = Store(Path(tmp) / "bench.db")
    deliver(store, base)
    built = Projections(store, checkpoints=folder)
    built.load()
    while built.follow_once():
        pass
    built.write_checkpoint()
    deliver(store, batches)
    restarted = Projections(store, checkpoints=folder)
    restarted.load()
    assert restarted.loaded_from is not None
    out = {"restarted": round(follow(restarted), 1), "built": round(follow(built), 1)}
    assert restarted.seq("bench") == built.seq("bench") == (base + batches) * 500
    store.close()
print(json.dumps(out))
"""


def run(checkout: Path, base: int, batches: int) -> dict[str, Any]:
    python = checkout_python(checkout)
    return child_json([python, "-c", CHILD, str(base), str(batches)], checkout)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_follower_restart", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--peer", type=Path, required=True, help="a checkout to compare with (with its .venv)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", type=int, default=20, help="500-event deliveries before")
    parser.add_argument("--batches", type=int, default=20, help="500-event deliveries after")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"peer": [], "this": []}
    for _ in range(args.rounds):
        for name, checkout in (("peer", args.peer), ("this", ROOT)):
            runs[name].append(run(checkout, args.base, args.batches))
            print(name, json.dumps(runs[name][-1]), flush=True)
    med = {
        name: {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]}
        for name, rs in runs.items()
    }
    ratio = {k: round(med["this"][k] / med["peer"][k], 3) for k in med["this"]}
    print(f"{'follower µs an event':24}{'peer':>10}{'this':>10}")
    for k in med["this"]:
        print(f"{k:24}{med['peer'][k]:>10}{med['this'][k]:>10}")
    figures = {"peer": med["peer"], "this": med["this"], "this_over_peer": ratio}
    sizes = {"rounds": args.rounds, "base": args.base, "batches": args.batches}
    print(json.dumps({**figures, **sizes}))


if __name__ == "__main__":
    main()

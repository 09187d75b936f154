"""The write path stage by stage, in one process, side by side with a peer checkout.

``bench_ingest``'s deliveries (its ``Concepts``: a title, 40 words of text, 4 links, a tag;
signed) go through each stage of a delivery's way in, timed apart, without HTTP:

- ``verify``: the webhook signature (``SignatureVerifier.verify``);
- ``decode``: the content mode and the events (``decode_events``);
- ``store``: ``Store.append`` until durable (WAL, synchronous=FULL: the fsync included).
  500-event deliveries one after another; single-event deliveries from 64 concurrent
  callers on one event loop (``append_async``, as the server calls it), so group commit
  shares each fsync (``deliveries_per_commit``: how many did); ``store_cpu`` is the
  process's CPU time over the same calls;
- ``follower``: the projection following the log to the end (``Projections.follow_once``),
  with the server's default embedder (``--embeddings none``: without); of it ``read`` (the
  log read and decoded, ``Store.read_log``), ``index`` (``SearchIndex.put``: analysing the
  text, unless the log carried its analysis, and putting its postings), ``vectors`` (the
  follower's own settling, ``Filler.settle``, and installing carried vectors,
  ``Vectors.install_carried``), of which ``embed`` (the model's calls in the follower), and
  ``patches``, the rest (the graph's patches, the batch's bookkeeping);
  ``follower_texts``: the texts the model embedded in the follower (0 where the store
  carries them), ``store_embed``: the store's analyser thread's model calls (CPU).

Figures are µs per event (per delivery for single deliveries): CPU time of the thread doing
the stage (the machine is shared, and CPU time is what one process's GIL is short of), but
``store``, the wall time to durable. Each checkout runs in a child
process of its own (a peer: ``--peer CHECKOUT``, its ``.venv`` or this Python with the peer
first on the path), alternating ``--rounds`` times; the last line is one JSON object with the
medians, this over peer, and the aims (``met``: the follower ≤ 60 µs an event and 0 texts
embedded in it, the store alone ≥ 50,000 events/s in 500-event deliveries and ≥ 3,000 single
deliveries/s; in process, without HTTP: ``bench_ingest`` measures those over HTTP).

    .venv/bin/python -m loadtest.bench_write_stages --peer CHECKOUT [--rounds 2] [--embeddings none]
        [--heap 2000000]
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
import asyncio, json, sys, tempfile, time
from pathlib import Path
from kbgraph.http.binding import decode_events
from kbgraph.config import EmbeddingsConfig
from kbgraph.embeddings.providers import make_embedder
from kbgraph.events import SignatureVerifier
from kbgraph.projection import Projections, warm_up
from kbgraph.search import SearchIndex
from kbgraph.store import Store, WebhookMessage
from loadtest.bench_ingest import SECRET, Concepts
from tests import webhook_client as wc
import hashlib, threading
try:  # a checkout before the store carried the local model's vectors has none
    from kbgraph.embeddings.carried import Carrier
    from kbgraph.projection.vectors import Vectors
except ImportError:
    Carrier = Vectors = None

batches, singles, provider = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
heap = [[i] for i in range(int(sys.argv[4]))]  # long-lived containers, as a big KB's lists
SPENT = ("index", "embed", "read", "vectors", "follower_texts", "store_embed")
spent = dict.fromkeys(SPENT, 0.0)

clock = time.thread_time
main_thread = threading.main_thread()

def timed(name, fn):
    def call(*args, **kw):
        t = clock()
        try:
            return fn(*args, **kw)
        finally:
            spent[name] += clock() - t
    return call

if Vectors is not None:
    Vectors.install_carried = timed("vectors", Vectors.install_carried)

class TimedIndex(SearchIndex):
    def put(self, *args, **kw):
        t = clock()
        super().put(*args, **kw)
        spent["index"] += clock() - t

embedder = make_embedder(EmbeddingsConfig(provider=provider))
if embedder is not None:
    real = embedder.embed
    def embed(texts, _real=real):
        here = threading.current_thread() is main_thread
        t = clock()
        try:
            return _real(texts)
        finally:
            spent["embed" if here else "store_embed"] += clock() - t
            if here:
                spent["follower_texts"] += len(texts)
    embedder.embed = embed
carrier = None
if Carrier is not None and embedder is not None and not embedder.remote:
    carrier = Carrier(embedder, EmbeddingsConfig().max_chars)
verifier = SignatureVerifier([SECRET])
warm_up()

def deliveries(prefix, count, size):
    c = Concepts(prefix, 1)
    out = []
    for _ in range(count):
        payload = [c.next() for _ in range(size)] if size > 1 else c.next()
        body, headers = wc.delivery(SECRET, payload)
        out.append((body, headers))
    return out

def run(prefix, count, size):
    figures = {}
    items = deliveries(prefix, count, size)
    t = clock()
    for body, headers in items:
        assert verifier.verify(body, headers)
    figures["verify"] = clock() - t
    t = clock()
    decoded = [decode_events(body, headers) for body, headers in items]
    figures["decode"] = clock() - t
    messages = [WebhookMessage(h["webhook-id"], hashlib.sha256(b).digest()) for b, h in items]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "stages.db", **({"carrier": carrier} if carrier else {}))
        store.read_log = timed("read", store.read_log)
        groups = [0]
        real_commit = store._commit_group
        def counting(conn, group, _real=real_commit):
            groups[0] += 1
            return _real(conn, group)
        store._commit_group = counting
        store.append("warm", decoded[0][:1])
        p = Projections(store, index_factory=TimedIndex, embedder=embedder)
        p.load()
        p.follow_once()
        if p.filler is not None:
            p.filler.settle = timed("vectors", p.filler.settle)
        spent.update(dict.fromkeys(SPENT, 0.0))
        groups[0] = 0
        t, cpu = time.perf_counter(), time.process_time()
        if size > 1:
            for events, message in zip(decoded, messages):
                store.append("bench", events, message=message)
        else:
            async def caller(k):
                for i in range(k, len(decoded), 64):
                    await store.append_async("bench", decoded[i], message=messages[i])
            async def drive():
                await asyncio.gather(*(caller(k) for k in range(64)))
            asyncio.run(drive())
        figures["store"] = time.perf_counter() - t
        figures["store_cpu"] = time.process_time() - cpu
        figures["store_embed"] = spent["store_embed"]
        spent.update(dict.fromkeys(SPENT, 0.0))
        t = clock()
        while p.follow_once():
            pass
        figures["follower"] = clock() - t
        for part in ("read", "index", "vectors", "embed"):
            figures[part] = spent[part]
        figures["patches"] = figures["follower"] - spent["read"] - spent["index"] - spent["vectors"]
        assert p.seq("bench") == count * size, p.seq("bench")
        store.close()
    per = count * size if size > 1 else count
    out = {k: round(v / per * 1e6, 1) for k, v in figures.items()}
    out["deliveries_per_commit"] = round(count / max(1, groups[0]), 1)
    out["follower_texts"] = spent["follower_texts"]
    return out

out = {"batch_us_per_event": run("b", batches, 500), "single_us_per_delivery": run("s", singles, 1)}
print(json.dumps(out))
"""


def run(checkout: Path, batches: int, singles: int, provider: str, heap: int) -> dict[str, Any]:
    python = checkout_python(checkout)
    return child_json(
        [python, "-c", CHILD, str(batches), str(singles), provider, str(heap)], checkout
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_write_stages", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--peer", type=Path, required=True, help="a checkout to compare with (with its .venv)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20, help="500-event deliveries")
    parser.add_argument("--singles", type=int, default=4000, help="single-event deliveries")
    parser.add_argument(
        "--embeddings",
        default="default",
        choices=["default", "local", "none"],
        help="[embeddings] provider of the follower (none: the follower without vectors)",
    )
    parser.add_argument(
        "--heap",
        type=int,
        default=0,
        help="long-lived lists held by the process (the cyclic GC walks them as a big KB's)",
    )
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"peer": [], "this": []}
    for _ in range(args.rounds):
        for name, checkout in (("peer", args.peer), ("this", ROOT)):
            runs[name].append(run(checkout, args.batches, args.singles, args.embeddings, args.heap))
            print(name, json.dumps(runs[name][-1]), flush=True)
    med: dict[str, dict[str, dict[str, float]]] = {}
    for name, rs in runs.items():
        med[name] = {
            part: {k: round(statistics.median(r[part][k] for r in rs), 1) for k in rs[0][part]}
            for part in rs[0]
        }
    ratio = {
        part: {
            k: round(med["this"][part][k] / med["peer"][part][k], 3)
            for k in med["this"][part]
            if med["peer"][part].get(k)
        }
        for part in med["this"]
    }
    print(f"{'':26}{'peer':>10}{'this':>10}")
    for part in med["this"]:
        for k in med["this"][part]:
            print(f"{part[:6]} {k:19}{med['peer'][part].get(k, '-'):>10}{med['this'][part][k]:>10}")
    batch, single = med["this"]["batch_us_per_event"], med["this"]["single_us_per_delivery"]
    met = {
        "follower_us_per_event_le_60": batch["follower"] <= 60,
        "follower_texts_0": batch["follower_texts"] == 0 and single["follower_texts"] == 0,
        "store_events_per_s_ge_50000": 1e6 / batch["store"] >= 50_000,
        "store_single_deliveries_per_s_ge_3000": 1e6 / single["store"] >= 3_000,
    }
    print(json.dumps({"peer": med["peer"], "this": med["this"], "this_over_peer": ratio,
                      "rounds": args.rounds, "met": met}))  # fmt: skip


if __name__ == "__main__":
    main()

"""Projection benchmark: apply rate, start-up build, memory, and ingest-to-visible lag.

1. At 1,000, 100,000 and 1,000,000 concepts (ids ``infra/c0000123`` over 9 collections, 8
   random out-links each, mean undirected degree ~15, a two-word title and text, generated
   directly as a ``KBState``): the start-up build time (``KBProjection.build``, search index
   included), the resident memory it adds (psutil RSS delta, snapshot freed), and the rate at
   which a stream of realistic events is applied to the built projection (single-event
   deliveries through ``KBProjection.apply``, two visibility masks cached and patched). The
   stream (``event_stream``) is the same mix of work at every size: 40% upserts changing
   links, half of them changing the content too (so re-indexing it), 20% link adds, 15%
   link removes, 10% deletes, 10% re-creates, 5% new concepts; deterministic per size.
2. Lag from an acknowledged delivery to the event being visible to queries, p50/p99:
   - in-process: ``Store.append`` returning (then ``kick`` as the webhook handler does) to
     the follower having applied it;
   - second process: ``Store.append`` returning here to a second process, following the same
     SQLite file, having applied it (CLOCK_MONOTONIC is shared by processes);
   - over HTTP: a real ``kbgraph serve`` with 1 and with 2 workers; the webhook's 200
     (its ``seq``) to a status query with ``X-Min-Seq: seq`` on a fresh connection (so with 2
     workers it lands on either) answering with ``X-KB-Seq >= seq``; includes that query's
     round trip.

The machine is shared: the apply-rate aim compares the best quarter of each stream (the one
least disturbed by other processes); the overall rate and the CPU time per event (the
applying thread's, less moved by other processes) are reported too. The last line printed
is one JSON object with every figure and the aims (1M apply rate at least half the 1k rate;
p99 lag under 10 ms in one process and under 50 ms across workers) with met true/false.
Bounded well under 5 minutes.

With ``--peer CHECKOUT`` only part 1 runs, for this checkout and the peer side by side (each
size in a child process of its own, alternating peer / this ``--rounds`` times; the peer runs
its own ``.venv``, else this Python with the peer first on the path). Both apply the stream
of THIS module (loaded from its file), only the ``kbgraph`` is the checkout's; the last line
then holds both and ``this_over_peer`` of each apply rate.

    .venv/bin/python -m loadtest.bench_projection [--sizes 1000,100000,1000000] [--events 20000]
        [--peer CHECKOUT --rounds 1]
"""

from __future__ import annotations

import argparse
import functools
import gc
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

# loadtest.ROOT, kept here: this file also runs in a peer's child (``SIZE_CHILD``), where
# ``loadtest`` is the peer's package.
ROOT = Path(__file__).resolve().parent.parent

from kbgraph.access import Rule, canonical  # noqa: E402
from kbgraph.events import (  # noqa: E402
    ConceptDeleted,
    ConceptUpserted,
    DeleteData,
    Event,
    LinkAdded,
    LinkData,
    LinkRemoved,
    UpsertData,
)
from kbgraph.projection import KBProjection, Projections, warm_up  # noqa: E402
from kbgraph.search import SearchIndex  # noqa: E402
from kbgraph.store import ConceptState, KBState, LogRecord, Store  # noqa: E402

COLLECTIONS = ("infra", "network", "storage", "apps", "security", "ops", "data", "docs", "team")
TYPES = ("Runbook", "Note", "Service", "Host")
# loadtest.synthetic's first ten words, kept here: with --peer this module runs against the
# peer's kbgraph and must not import another checkout's loadtest.
WORDS = ("dns", "backup", "router", "cluster", "vpn", "certificate", "disk", "ingress",
         "monitoring", "firewall")  # fmt: skip
LINKS = 8
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ADMIN = "bench-admin-token-local"
RSS = psutil.Process()


def cid(i: int) -> str:
    return f"{COLLECTIONS[i % len(COLLECTIONS)]}/c{i:07d}"


def synthetic_links(n: int) -> np.ndarray:
    """dst[u] = u's 8 random out-links (never itself), reproducible per size."""
    rng = np.random.default_rng(n)
    dst = rng.integers(0, n - 1, size=(n, LINKS), dtype=np.int32)
    dst += dst >= np.arange(n, dtype=np.int32)[:, None]
    return dst


def synthetic_state(n: int, dst: np.ndarray) -> KBState:
    ids = [cid(i) for i in range(n)]
    concepts = []
    for i, row in enumerate(dst.tolist()):
        title, text = content_of(i)
        concepts.append(
            ConceptState(
                id=ids[i],
                version=1,
                title=title,
                type=TYPES[i % len(TYPES)],
                status="active",
                tags=[],
                text=text,
                links=sorted({ids[j] for j in row}),
            )
        )
    concepts.sort(key=lambda c: c.id)
    return KBState(seq=1, concepts=concepts)


def content_of(i: int) -> tuple[str, str]:
    """The title and text ``synthetic_state`` gives concept i."""
    return f"{WORDS[i % 10]} {i}", f"{WORDS[(i * 7) % 10]} {WORDS[(i * 3) % 10]}"


def event_stream(n: int, count: int, dst: np.ndarray) -> tuple[list[Event], dict[str, float]]:
    """The stream applied to the synthetic KB, and its mix (what share of the events
    re-index a concept).

    The same mix of work per event at every size (only which concepts it touches differs),
    deterministic per size (``random.Random(n)``), every version above the state's 1:

    - 40%: an upsert of a live concept with one or two of its links changed; half of these
      (decided by a coin, not by whether the concept was seen before) also change its content
      (title and text drawn from ``WORDS`` again, never the content it has), the other half
      repeat the content it has, so the search index re-indexes the same share at 1k, where
      each concept is rewritten ~8 times, as at 1M, where most are rewritten once;
    - 20% a link added to a random target, 15% a declared link removed;
    - 10% a delete, 10% a re-create of a deleted concept (new links and content), 5% a new
      concept (ids from n up; new links and content). Rolls landing on a deleted concept
      for an event that needs a live one are drawn again.
    """
    rng = random.Random(n)
    version = 10
    current: dict[int, set[int]] = {}
    content: dict[int, tuple[str, str]] = {}
    deleted: list[int] = []
    is_deleted: set[int] = set()
    next_new = n
    out: list[Event] = []
    reindex = 0

    def links_of(u: int) -> set[int]:
        links = current.get(u)
        if links is None:
            links = current[u] = set(dst[u].tolist()) if u < n else set()
        return links

    def new_content(u: int) -> tuple[str, str]:
        had = content.get(u) or (content_of(u) if u < n else None)
        while True:
            a, b, c = rng.randrange(10), rng.randrange(10), rng.randrange(10)
            got = f"{WORDS[a]} {u}", f"{WORDS[b]} {WORDS[c]}"
            if got != had:
                content[u] = got
                return got

    def env(u: int) -> dict[str, Any]:
        return {"specversion": "1.0", "id": f"b{len(out)}", "source": "bench", "subject": cid(u)}

    def upsert(u: int, change: bool) -> ConceptUpserted:
        nonlocal reindex
        reindex += change
        title, text = new_content(u) if change else content.get(u) or content_of(u)
        links = [cid(t) for t in sorted(links_of(u))]
        data = UpsertData(version=version, title=title, type=TYPES[u % 4], text=text, links=links)
        return ConceptUpserted(**env(u), data=data)

    while len(out) < count:
        version += 1
        roll = rng.random()
        u = rng.randrange(n)
        if roll < 0.95 and u in is_deleted:
            continue
        if roll < 0.40:
            links = links_of(u)
            for _ in range(rng.randint(1, 2)):
                if links:
                    links.discard(rng.choice(sorted(links)))
                links.add(rng.randrange(n))
            links.discard(u)
            out.append(upsert(u, rng.random() < 0.5))
        elif roll < 0.60:
            t = rng.randrange(n)
            links_of(u).add(t)
            out.append(LinkAdded(**env(u), data=LinkData(version=version, target=cid(t))))
        elif roll < 0.75:
            links = links_of(u)
            t = rng.choice(sorted(links)) if links else rng.randrange(n)
            links.discard(t)
            out.append(LinkRemoved(**env(u), data=LinkData(version=version, target=cid(t))))
        elif roll < 0.85:
            deleted.append(u)
            is_deleted.add(u)
            current[u] = set()
            out.append(ConceptDeleted(**env(u), data=DeleteData(version=version)))
        elif roll < 0.95:
            if deleted:
                u = deleted.pop(rng.randrange(len(deleted)))
                is_deleted.discard(u)
                current[u] = {rng.randrange(n) for _ in range(LINKS)} - {u}
                out.append(upsert(u, True))
        else:
            u = next_new
            next_new += 1
            current[u] = {rng.randrange(n) for _ in range(LINKS)}
            out.append(upsert(u, True))
    upserts = sum(isinstance(e, ConceptUpserted) for e in out)
    mix = {"upserts": round(upserts / len(out), 3), "reindexed": round(reindex / len(out), 3)}
    return out, mix


class TimedIndex(SearchIndex):
    """The real search index, timing its ``put`` calls (its share of the build)."""

    spent = 0.0

    def put_many(self, docs: Any) -> None:
        start = time.perf_counter()
        super().put_many(docs)
        TimedIndex.spent += time.perf_counter() - start

    def put_columns(self, n: int, titles: Any, texts: Any, aliases: Any, tags: Any) -> None:
        start = time.perf_counter()  # a first build's since 12-07 (put_many's before)
        super().put_columns(n, titles, texts, aliases, tags)
        TimedIndex.spent += time.perf_counter() - start


def bench_size(n: int, events: int) -> dict[str, Any]:
    gc.collect()
    warm_up()  # as Projections.load does: no kernel compile or cache load in the timings
    rss0 = RSS.memory_info().rss
    dst = synthetic_links(n)
    state = synthetic_state(n, dst)
    kb = KBProjection("bench", index_factory=TimedIndex)
    TimedIndex.spent = 0.0
    t0 = time.perf_counter()
    kb.build(state)
    build = time.perf_counter() - t0
    index_build = TimedIndex.spent
    del state
    gc.collect()
    rss = RSS.memory_info().rss - rss0
    with kb.read() as snap:
        admin = snap.view(None)
        degree = float(admin.deg.sum()) / max(1, snap.counts(admin)[0])
        for rules in (
            canonical([Rule(frozenset({"infra", "network"}), frozenset())]),
            canonical([Rule(frozenset(), frozenset({"Runbook"}))]),
        ):
            snap.view(rules)  # cached: every event below patches it
    stream, mix = event_stream(n, events, dst)
    records = [[LogRecord(i + 1, "bench", i + 2, e, True)] for i, e in enumerate(stream)]
    chunks = []  # (events, seconds) per quarter of the stream
    quarter = max(1, len(records) // 4)
    cpu = time.thread_time()
    for start in range(0, len(records), quarter):
        rest = records[start : start + quarter]
        t0 = time.perf_counter()
        while rest:
            rest = rest[kb.apply(rest) :]
        chunks.append((min(quarter, len(records) - start), time.perf_counter() - t0))
    cpu = time.thread_time() - cpu
    elapsed = sum(seconds for _, seconds in chunks)
    best = max(events / seconds for events, seconds in chunks)
    result = {
        "concepts": n,
        "mean_degree": round(degree, 2),
        "build_s": round(build, 3),
        "build_search_index_s": round(index_build, 3),
        "rss_mb": round(rss / 2**20, 1),
        "events": len(stream),
        "stream_shares": mix,
        "apply_events_per_s": round(len(stream) / elapsed),
        "apply_us_per_event": round(elapsed / len(stream) * 1e6, 1),
        "apply_cpu_us_per_event": round(cpu / len(stream) * 1e6, 1),
        "apply_events_per_s_best_quarter": round(best),
        "apply_events_per_s_quarters": [round(events / seconds) for events, seconds in chunks],
    }
    print(json.dumps(result), flush=True)
    del kb, records, stream, dst
    gc.collect()
    return result


def percentile_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "n": 0}
    p50, p99 = np.percentile(np.array(values) * 1000, [50, 99])
    return {"p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3), "n": len(values)}


def reached(applied: dict[int, float], seq: int) -> bool:
    return max(applied, default=0) >= seq


def delivery(i: int) -> list[Event]:
    data = UpsertData(version=1, title=f"lag {i}", links=[f"lag/c{i - 1}", f"lag/c{i // 2}"])
    return [
        ConceptUpserted(
            specversion="1.0", id=f"lag{i}", source="bench", subject=f"lag/c{i}", data=data
        )
    ]


def lag_in_process(folder: Path, count: int) -> dict[str, Any]:
    with Store(folder / "inproc.db") as store:
        store.append("lag", delivery(0))
        p = Projections(store)
        p.start()
        applied: dict[int, float] = {}
        cond = threading.Condition()

        def listener(kb: str, seq: int) -> None:
            with cond:
                applied[seq] = time.monotonic()
                cond.notify_all()

        p.add_listener(listener)
        lags = []
        for i in range(1, count + 1):
            seq = store.append("lag", delivery(i)).seq
            acked = time.monotonic()
            p.kick()
            with cond:
                cond.wait_for(functools.partial(reached, applied, seq), timeout=5)
                done = next((t for s, t in applied.items() if s >= seq), None)
            if done is not None:
                lags.append(max(0.0, done - acked))
            time.sleep(0.002)
        p.stop()
    return percentile_ms(lags)


FOLLOWER = r"""
import sys, time
from kbgraph.projection import Projections
from kbgraph.store import Store
store = Store(sys.argv[1])
p = Projections(store)
p.add_listener(lambda kb, seq: print(seq, time.monotonic(), flush=True))
p.start()
print("ready", flush=True)
sys.stdin.read()
p.stop()
store.close()
"""


def lag_second_process(folder: Path, count: int) -> dict[str, Any]:
    path = folder / "twoproc.db"
    with Store(path) as store:
        store.append("lag", delivery(0))
        child = subprocess.Popen(
            [sys.executable, "-c", FOLLOWER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            acked: dict[int, float] = {}
            for i in range(1, count + 1):
                seq = store.append("lag", delivery(i)).seq
                acked[seq] = time.monotonic()
                time.sleep(0.01)
            time.sleep(0.2)
            out, _ = child.communicate("", timeout=30)
        finally:
            child.kill()
    seen: dict[int, float] = {}
    for line in out.splitlines():
        seq_text, at = line.split()
        seen[int(seq_text)] = float(at)
    lags = []
    for seq, sent in acked.items():
        done = next((seen[s] for s in sorted(seen) if s >= seq), None)
        if done is not None:
            lags.append(max(0.0, done - sent))
    return percentile_ms(lags)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def lag_http(folder: Path, workers: int, count: int) -> dict[str, Any]:
    import httpx

    from tests import webhook_client as wc

    config = folder / f"serve{workers}.toml"
    config.write_text(
        f'[store]\npath = "serve{workers}.db"\n[webhooks]\nsecrets = ["{SECRET}"]\n'
        f'[[tokens]]\nname = "admin"\ntoken = "{ADMIN}"\nadmin = true\n'
    )
    port = free_port()
    command = [sys.executable, "-m", "kbgraph", "serve", "--config", str(config)]
    command += ["--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                return {"error": "kbgraph serve did not start"}
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        lags = []
        wrong = 0
        auth = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=base, timeout=10) as hooks:
            for i in range(count + 5):
                event = wc.upsert(f"lag/c{i}", 1, title=f"lag {i}", links=[f"lag/c{i - 1}"])
                body, headers = wc.delivery(SECRET, event)
                answer = hooks.post("/v1/kbs/lag/events", content=body, headers=headers)
                acked = time.monotonic()
                seq = answer.json()["seq"]
                fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                fresh.request(  # a new connection: with 2 workers it may land on either
                    "GET", "/v1/kbs/lag/status", headers={**auth, "X-Min-Seq": str(seq)}
                )
                got = fresh.getresponse()
                got.read()
                fresh.close()
                visible = time.monotonic()
                if got.status != 200 or int(got.getheader("x-kb-seq", "0")) < seq:
                    wrong += 1
                elif i >= 5:  # warm-up
                    lags.append(visible - acked)
                time.sleep(0.005)
        return {**percentile_ms(lags), "not_visible": wrong}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


# Run with the checkout as the working directory (so first on the path: its kbgraph), this
# module loaded from its file (so this checkout's stream, whichever kbgraph applies it).
SIZE_CHILD = """
import importlib.util, json, sys
from pathlib import Path
import kbgraph
spec = importlib.util.spec_from_file_location("bench_projection_stream", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
result = bench.bench_size(int(sys.argv[2]), int(sys.argv[3]))
print(json.dumps({**result, "kbgraph": str(Path(kbgraph.__file__).resolve().parents[1])}))
"""


def side_by_side(args: argparse.Namespace) -> None:
    """Part 1 for this checkout and ``args.peer``, each size in a fresh child process."""
    from statistics import median

    from loadtest.report import checkout_python, child_json

    started = time.monotonic()
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {"peer": {}, "this": {}}
    for _ in range(args.rounds):
        for size in (int(s) for s in args.sizes.split(",")):
            for name, checkout in (("peer", args.peer), ("this", ROOT)):
                python = checkout_python(checkout)
                command = [python, "-c", SIZE_CHILD, __file__, str(size), str(args.events)]
                got = child_json(command, checkout)
                assert got["kbgraph"] == str(Path(checkout).resolve()), got["kbgraph"]
                runs[name].setdefault(size, []).append(got)
                print(name, json.dumps(got), flush=True)
    keys = ("apply_events_per_s", "apply_events_per_s_best_quarter", "apply_cpu_us_per_event",
            "build_s", "rss_mb")  # fmt: skip
    med = {
        name: {size: {k: median(r[k] for r in rs) for k in keys} for size, rs in by.items()}
        for name, by in runs.items()
    }
    ratio = {
        size: {k: round(med["this"][size][k] / med["peer"][size][k], 3) for k in keys}
        for size in med["this"]
    }
    sizes = sorted(med["this"])
    aims: dict[str, Any] = {}
    if len(sizes) > 1:
        rate = "apply_events_per_s_best_quarter"
        big_over_small = {
            name: round(med[name][sizes[-1]][rate] / med[name][sizes[0]][rate], 3) for name in med
        }
        cpu = "apply_cpu_us_per_event"  # the same ratio in CPU time: small over big
        cpu_ratio = {
            name: round(med[name][sizes[0]][cpu] / med[name][sizes[-1]][cpu], 3) for name in med
        }
        aims[f"apply_rate_{sizes[-1]}_at_least_half_of_{sizes[0]}"] = {
            "value": big_over_small["this"],
            "peer": big_over_small["peer"],
            "met": big_over_small["this"] >= 0.5,
            "cpu_value": cpu_ratio["this"],
            "cpu_peer": cpu_ratio["peer"],
        }
    report = {"this": med["this"], "peer": med["peer"], "this_over_peer": ratio, "aims": aims,
              "rounds": args.rounds, "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    print(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_projection", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--lag-samples", type=int, default=300)
    parser.add_argument("--peer", type=Path, help="a checkout to compare part 1 with")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (with --peer)")
    args = parser.parse_args()
    if args.peer:
        side_by_side(args)
        return
    started = time.monotonic()
    sizes = [bench_size(int(s), args.events) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lag = {
            "in_process": lag_in_process(folder, args.lag_samples),
            "second_process": lag_second_process(folder, args.lag_samples),
            "http_1_worker": lag_http(folder, 1, args.lag_samples),
            "http_2_workers": lag_http(folder, 2, args.lag_samples),
        }
    for name, figures in lag.items():
        print(json.dumps({name: figures}), flush=True)
    by_size = {s["concepts"]: s for s in sizes}
    small, big = by_size.get(1000), by_size.get(1_000_000)

    def under(figures: dict[str, Any], limit: float) -> bool:
        return figures.get("p99_ms") is not None and figures["p99_ms"] < limit

    aims = {
        "apply_rate_1M_at_least_half_of_1k": {
            "met": small is not None
            and big is not None
            and big["apply_events_per_s_best_quarter"]
            >= 0.5 * small["apply_events_per_s_best_quarter"]
        },
        "lag_p99_under_10ms_one_process": {
            "met": under(lag["in_process"], 10) and under(lag["http_1_worker"], 10)
        },
        "lag_p99_under_50ms_across_workers": {
            "met": under(lag["second_process"], 50) and under(lag["http_2_workers"], 50)
        },
    }
    print(
        json.dumps(
            {
                "sizes": sizes,
                "lag": lag,
                "aims": aims,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()

"""An empty JetStream node ready from a snapshot, stage by stage, without the stream's load.

``bench_cluster --phases stream`` makes its snapshot by sending every concept through the
stream (10 minutes at 1M). Here the store is filled through the store's own API instead, in
the node's config (the local model's vectors made once by the store, as a node's are): the
concepts of ``bench_ingest.Concepts`` in 1,000-event deliveries, the projection following
them as a node's does (the vectors installed from the log's rows), then a checkpoint written,
as a node that has run a while has one. Kept
with ``--keep-filled DIR`` and reused with ``--filled DIR`` (filling 1M takes minutes).

Each checkout first writes the filled store's checkpoint again with its own code (a copy
loaded and its checkpoint written, in a process of that checkout's), so that the snapshot
ships the checkpoint format that checkout's nodes write (a node A that had run a while would
have one of its own); the seconds and the file's format and bytes are in the JSON.

Then, per run (each checkout in turn with ``--peer``, alternating, ``--rounds`` times), on a
fresh 3-server NATS cluster on loopback (TLS, accounts: ``tests.nats_cluster``):

1. node A serves a copy of the filled store (that checkpoint loaded), takes ``--deliveries``
   single-event deliveries through the stream (``--tail texts``: new concepts with texts;
   ``links``: links added, no text changed), publishes a snapshot at its last position
   (store and checkpoint) and trims the stream below it; then A stops, so that B is timed
   alone on the machine;
2. an empty node B starts: the seconds from its process start to ``/readyz`` 200, and when
   each line of its log came (``--log-level info``): the restore (and its stages where the
   node logs them), the projection loaded from the checkpoint or built, the server up; and
   the machine's 1-minute load average as B starts and once it is ready (on a shared
   machine, other work shows in every figure), and the resident memory of B's processes;
3. once B is ready, two concepts' texts are changed through B, one after the other: for each,
   the seconds from its delivery sent to B's concept read answering the new text (the first
   walks the KB's name trie for the text's mentions: built then, unless the checkpoint
   carried it or the log past the checkpoint already built it), and B's memory after them.

The last line is one JSON object: per checkout the median ready seconds and each run's stage
times, the snapshot's bytes, the aim (<= 30 s at 1M) and this over the peer.

    .venv/bin/python -m loadtest.bench_snapshot_start [--concepts 1000000]
        [--keep-filled DIR | --filled DIR] [--peer CHECKOUT] [--rounds 1]
        [--deliveries 20] [--tail texts|links]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from kbgraph.config import parse_config
from kbgraph.embeddings.providers import make_embedder
from kbgraph.events import decode_delivery
from kbgraph.projection import Projections
from kbgraph.store.opening import open_store
from loadtest import ROOT
from loadtest.bench_ingest import (
    ADMIN,
    SECRET,
    Concepts,
    free_port,
    start_server,
    stop_server,
)
from loadtest.report import checkout_python
from tests import webhook_client as wc
from tests.nats_cluster import STREAM, NatsCluster

KB = "bench"
DELIVERY = 1_000
STORE = "bench.db"  # start_server's store path, in the node's folder
AIM_SECONDS = 30.0  # issue 47, at 1M concepts
AIM_CONCEPTS = 1_000_000
WAIT_SECONDS = 900.0  # A's snapshot published by then, or the run fails
NOISE = "eof_received"  # asyncio's, on every TLS connection's close
# what B's log says, and the stage each line ends
FETCHED = re.compile(r"fetched and unpacked as they came in ([\d.]+) s")
STAGES = {
    "restored": re.compile(r"store restored from snapshot"),
    "projection": re.compile(r"projection of \d+ KB\(s\)"),
    "serving": re.compile(r"Application startup complete"),
}


def fill(folder: Path, concepts: int) -> dict[str, float]:
    """``concepts`` upserts into ``folder/STORE`` as a node's config opens it, its projection
    following the log as a node's does (the vectors the store made installed from the log's
    rows), then a checkpoint; the seconds of each step."""
    folder.mkdir(parents=True, exist_ok=True)
    config = parse_config(f'[store]\npath = "{STORE}"\n', base_dir=folder)
    embedder = make_embedder(config.embeddings)
    store = open_store(config, embedder=embedder)
    projections = Projections(
        store,
        checkpoints=config.store.checkpoint_folder,
        log_retain=config.store.log_retain_events,
        embedder=embedder,
        vector_max_chars=config.embeddings.max_chars,
    )
    projections.load()
    source = Concepts("load", 1)
    started = time.perf_counter()
    for first in range(0, concepts, DELIVERY):
        batch = [source.next() for _ in range(min(DELIVERY, concepts - first))]
        store.append(KB, decode_delivery(wc.encode(batch), "application/json"))
        while projections.follow_once():
            pass
    figures = {"fill_s": round(time.perf_counter() - started, 1)}
    started = time.perf_counter()
    projections.write_checkpoint()
    figures["checkpoint_s"] = round(time.perf_counter() - started, 1)
    store.close()
    return figures


# A checkout's checkpoint of a filled copy, with its own code (run as ``python -c`` in the
# checkout, the folder and the store's name its arguments): the seconds to load and to write,
# the file's format and size.
REWRITE = """
import json, re, sys, time
from pathlib import Path
from kbgraph.config import parse_config
from kbgraph.embeddings.providers import make_embedder
from kbgraph.projection import Projections
from kbgraph.store.opening import open_store
config = parse_config(f'[store]\\npath = "{sys.argv[2]}"\\n', base_dir=Path(sys.argv[1]))
embedder = make_embedder(config.embeddings)
store = open_store(config, embedder=embedder)
projections = Projections(
    store, checkpoints=config.store.checkpoint_folder, log_retain=config.store.log_retain_events,
    embedder=embedder, vector_max_chars=config.embeddings.max_chars,
)
started = time.perf_counter()
projections.load()
loaded = time.perf_counter() - started
started = time.perf_counter()
path = projections.write_checkpoint(0)
written = time.perf_counter() - started
store.close()
head = path.read_bytes()[:200].decode(errors="replace")
print(json.dumps({"load_s": round(loaded, 1), "write_s": round(written, 1),
                  "format": int(re.search(r'"format":(\\d+)', head).group(1)),
                  "bytes": path.stat().st_size, "name": path.name}))
"""


def rewrite_checkpoint(checkout: Path, filled: Path, folder: Path) -> dict[str, Any]:
    """``filled`` copied to ``folder`` and its checkpoint written again by ``checkout``'s code."""
    shutil.copytree(filled, folder)
    python = checkout_python(checkout)
    done = subprocess.run(
        [python, "-c", REWRITE, str(folder), STORE], cwd=checkout, capture_output=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: checkpoint not written: {done.stderr.decode()[-2000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return figures


def rss_mb(proc: subprocess.Popen[bytes]) -> float:
    """The resident memory of ``proc`` and its children (``kbgraph serve`` runs the app in one)."""
    root = psutil.Process(proc.pid)
    total = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    return round(float(total) / 2**20, 1)


def text_change(port: int, n: int) -> float:
    """Seconds from a delivery changing concept ``load/c{n}``'s text, sent to the node at
    ``port``, to its concept read answering the new text (every 10 ms)."""
    subject = f"load/c{n}"
    text = f"a text changed after the start, number {n}"
    event = wc.event("upserted", subject, 2, source="bench://kb", event_id=f"change-{n}",
                     title=f"Changed {n}", type="Runbook", text=text)  # fmt: skip
    body, headers = wc.delivery(SECRET, event)
    url = f"http://127.0.0.1:{port}/v1/kbs/{KB}"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(timeout=120) as client:
        started = time.monotonic()
        answer = client.post(f"{url}/events", content=body, headers=headers)
        if answer.status_code != 200:
            raise SystemExit(f"node B: {answer.status_code} {answer.text[:200]}")
        deadline = started + WAIT_SECONDS
        while time.monotonic() < deadline:
            read = client.get(f"{url}/concepts/{subject}", headers=admin)
            if read.status_code == 200 and read.json().get("text") == text:
                return round(time.monotonic() - started, 3)
            time.sleep(0.01)
    raise SystemExit(f"node B never answered {subject}'s new text")


async def snapshot_at(cluster: NatsCluster, position: int) -> tuple[int, int] | None:
    """(bytes, stream's first sequence) once a snapshot at ``position`` is published and the
    stream trimmed past it, else None."""
    nc = await cluster.connect()
    try:
        js = nc.jetstream(timeout=10)
        first = int((await js.stream_info(STREAM)).state.first_seq)
        try:
            found = await (await js.object_store(f"{STREAM}-snapshots")).list(ignore_deletes=True)
        except Exception:  # no bucket yet
            return None
        for info in found:
            if int((info.headers or {}).get("Kbgraph-Position", 0)) >= position and first > 1:
                return int(info.size), first
        return None
    finally:
        await nc.close()


def send(port: int, count: int, kind: str) -> None:
    """``count`` single-event deliveries to the node at ``port``: new concepts, each with a
    text (``kind`` "texts"), or links added between filled ones (no text, "links")."""
    source = Concepts("run", 2)
    with httpx.Client(timeout=60) as client:
        for n in range(count):
            event = (
                source.next()
                if kind == "texts"
                else wc.event("link.added", f"load/c{100 + n}", 2, source="bench://kb",
                              event_id=f"link-{n}", target=f"load/c{200 + n}")
            )  # fmt: skip
            body, headers = wc.delivery(SECRET, event)
            answer = client.post(f"http://127.0.0.1:{port}/v1/kbs/{KB}/events", content=body,
                                 headers=headers)  # fmt: skip
            if answer.status_code != 200:
                raise SystemExit(f"node A: {answer.status_code} {answer.text[:200]}")


class Tail(threading.Thread):
    """The lines of a growing log file, each with the seconds since ``started`` it came at."""

    def __init__(self, path: Path, started: float) -> None:
        super().__init__(daemon=True)
        self.path, self.started = path, started
        self.lines: list[tuple[float, str]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.path.exists() and not self.done.is_set():
            time.sleep(0.02)
        with open(self.path, errors="replace") as f:
            while True:
                line = f.readline()
                if line:
                    self.lines.append((round(time.monotonic() - self.started, 2), line.rstrip()))
                elif self.done.wait(0.02):
                    return


def run_once(
    checkout: Path, filled: Path, root: Path, deliveries: int, kind: str
) -> dict[str, Any]:
    """One cluster, node A's snapshot, node B from it (see the module's docstring)."""
    cluster = NatsCluster(root / "nats", 3)
    nodes = []
    try:
        cluster.start()
        a = root / "a"
        shutil.copytree(filled, a)
        port_a = free_port()
        # one snapshot, after the deliveries (a snapshot of 1M takes A a while)
        every = "snapshot_every_seconds = 10\nsnapshots_keep = 1\n"
        a_config = cluster.log_toml(STREAM) + every
        nodes.append(start_server(a, port_a, a_config, checkout, ready_seconds=WAIT_SECONDS))
        send(port_a, deliveries, kind)
        deadline = time.monotonic() + WAIT_SECONDS
        snapshot = None
        while snapshot is None:
            if time.monotonic() > deadline:
                raise SystemExit("node A published no snapshot at its last position in time")
            time.sleep(0.5)
            snapshot = asyncio.run(snapshot_at(cluster, deliveries))
        stop_server(nodes.pop())
        shutil.rmtree(a)
        output = root / "b.log"
        load = [os.getloadavg()[0]]
        started = time.monotonic()
        tail = Tail(output, started)
        tail.start()
        b_config = cluster.log_toml(STREAM)
        port_b = free_port()
        nodes.append(
            start_server(
                root / "b", port_b, b_config, checkout,
                log_level="info", output=output, ready_seconds=WAIT_SECONDS,
            )
        )  # fmt: skip
        ready = round(time.monotonic() - started, 2)
        load.append(os.getloadavg()[0])
        rss = [rss_mb(nodes[-1])]
        changes = [text_change(port_b, n) for n in (5, 6)]
        rss.append(rss_mb(nodes[-1]))
        time.sleep(0.2)
        tail.done.set()
        tail.join()
        stages = {}
        for name, pattern in STAGES.items():
            stages[name] = next((t for t, line in tail.lines if pattern.search(line)), None)
        fetched = next((m for _, line in tail.lines if (m := FETCHED.search(line))), None)
        return {
            "ready_s": ready,
            "stages_s": stages,
            "fetch_s": None if fetched is None else float(fetched.group(1)),
            "snapshot_bytes": snapshot[0],
            "rss_mb": {"ready": rss[0], "after_text_changes": rss[1]},
            "text_changes_s": changes,
            "load_1m": [round(x, 2) for x in load],
            "log": [f"{t:7.2f} {line[:300]}" for t, line in tail.lines if NOISE not in line],
        }
    finally:
        for proc in nodes:
            stop_server(proc)
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_snapshot_start", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--concepts", type=int, default=100_000)
    parser.add_argument("--filled", type=Path, help="a folder --keep-filled made before")
    parser.add_argument("--keep-filled", type=Path, help="fill into this folder and keep it")
    parser.add_argument("--peer", type=Path, help="a checkout to run side by side (its .venv)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--deliveries", type=int, default=20, help="through A before its snapshot")
    parser.add_argument(
        "--tail",
        choices=["texts", "links"],
        default="texts",
        help="A's deliveries: new concepts with texts, or links added (B's log past the "
        "checkpoint then changes no text)",
    )
    args = parser.parse_args()
    figures: dict[str, Any] = {
        "concepts": args.concepts,
        "cores": os.cpu_count(),
        "tail": args.tail,
    }
    with tempfile.TemporaryDirectory(prefix="kbgraph-bench-snapstart-") as folder:
        root = Path(folder)
        filled = args.filled
        if filled is None:
            filled = args.keep_filled or root / "filled"
            figures["fill"] = fill(filled, args.concepts)
            print("filled:", figures["fill"], flush=True)
        checkouts = {"this": ROOT} | ({"peer": args.peer.resolve()} if args.peer else {})
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in checkouts}
        rewritten: dict[str, dict[str, Any]] = {}
        for name, checkout in checkouts.items():
            rewritten[name] = rewrite_checkpoint(checkout, filled, root / f"filled-{name}")
            print(f"{name}: checkpoint written again: {rewritten[name]}", flush=True)
        for n in range(args.rounds):
            for name in checkouts:  # this, then the peer
                run_root = root / f"{name}-{n}"
                run = run_once(
                    checkouts[name], root / f"filled-{name}", run_root, args.deliveries, args.tail
                )
                shutil.rmtree(run_root, ignore_errors=True)
                runs[name].append(run)
                print(f"{name}: ready in {run['ready_s']} s, stages {run['stages_s']}", flush=True)
                for line in run.pop("log"):
                    print("   ", line, flush=True)
    for name, done in runs.items():
        figures[name] = {
            "checkpoint": rewritten[name],
            "ready_s": round(statistics.median(r["ready_s"] for r in done), 2),
            "runs": done,
        }
    if "peer" in figures:
        ratio = figures["this"]["ready_s"] / figures["peer"]["ready_s"]
        figures["this_over_peer"] = round(ratio, 2)
    at_scale = args.concepts >= AIM_CONCEPTS  # the aim is a 1M node's (null below)
    met = figures["this"]["ready_s"] <= AIM_SECONDS if at_scale else None
    figures["aims"] = {"ready_le_30s_at_1m": met}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

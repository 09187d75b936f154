"""Vectors off the paths of events and questions, computed once (issue 35's aims), measured from
outside against a test provider that counts what it is asked (``loadtest.embed_provider``).

``python -m loadtest.bench_spine [--deliveries 40] [--delay 1.0] [--concepts 120]``:

1. ``readable``: ``serve`` with ``[embeddings] provider = "openai"`` (``batch = 16``) at a provider
   answering each request after ``--delay`` seconds; one signed single-event delivery at a time,
   then ``GET`` of its concept with ``X-Min-Seq``: seconds from the POST to the answer, p50/p99
   (aim p99 <= 50 ms).
2. ``workers``: ``serve --workers 2`` on a fresh store, ``--concepts`` concepts in one delivery,
   until ``/status`` says the vectors are complete: the texts the provider was asked (aim: one
   per concept).
3. ``restart``: the service stopped, its checkpoints removed, started again (``--workers 2``)
   until complete: the texts asked again (aim 0).
4. ``cluster`` (``--cluster``): three nodes of ``serve --workers 2`` over a 3-server NATS
   JetStream cluster (``tests.nats_cluster``), ``--concepts`` concepts created then
   ``--changes`` of them changed, deliveries spread over the nodes, until every node says
   complete: the texts the provider was asked per concept change (aim 1), and whether every
   node's store holds the same vector rows.
5. ``cluster_local`` (``--cluster``): the same over the local model, three nodes in one process
   (``loadtest/cluster_model.py``) whose models count what they run: the texts per change
   for the cluster (aim 1: only the process that took a delivery runs it), per node, the
   stream's bytes per event, the same rows everywhere; and a node's CPU per upsert, running
   the model against taking the vector its message shipped.

``--skip-single`` runs the cluster phases alone, ``--local-model-only`` of them
``cluster_local``. ``--peer CHECKOUT`` runs the same phases
against another checkout's server (its ``.venv``) first, side by side. The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from loadtest import ROOT, kbgen
from loadtest.attacks import delivery, upsert
from loadtest.embed_provider import CountingProvider
from loadtest.service import HOST, Credentials, ServiceProcess, write_config

KB = "spine"


def config(
    folder: Path, creds: Credentials, provider: CountingProvider, log_toml: str = ""
) -> Path:
    path = write_config(folder, creds, KB, log_toml)
    with path.open("a") as out:
        out.write(f'\n[embeddings]\nprovider = "openai"\nurl = "{provider.url}"\nbatch = 16\n')
    return path


def post(client: httpx.Client, signer: kbgen.Signer, events: list[dict[str, Any]]) -> int:
    headers, body = delivery(signer, events)
    answer = client.post(f"/v1/kbs/{KB}/events", headers=headers, content=body)
    answer.raise_for_status()
    return int(answer.json()["seq"])


def status(client: httpx.Client, creds: Credentials) -> dict[str, Any]:
    answer = client.get(f"/v1/kbs/{KB}/status", headers={"Authorization": f"Bearer {creds.admin}"})
    return answer.json() if answer.status_code == 200 else {}


def until_complete(client: httpx.Client, creds: Credentials, timeout: float = 300) -> float:
    """Seconds until ``/status`` says complete on fresh connections (each worker asked)."""
    start = time.monotonic()
    streak = 0
    while streak < 6:
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"vectors not complete after {timeout} s")
        with httpx.Client(base_url=str(client.base_url)) as fresh:
            streak = streak + 1 if status(fresh, creds).get("vectors") == "complete" else 0
        time.sleep(0.05)
    return time.monotonic() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def readable(folder: Path, deliveries: int, delay: float, root: Path | None) -> dict[str, Any]:
    provider = CountingProvider(delay)
    provider.start()
    creds = Credentials()
    service = ServiceProcess(config(folder, creds, provider), root=root)
    service.start()
    try:
        asyncio.run(service.wait_ready())
        signer = kbgen.Signer(creds.secret)
        auth = {"Authorization": f"Bearer {creds.admin}"}
        seconds = []
        refused = 0  # GETs not answered 200 (a 503 while the follower waited for the provider)
        with httpx.Client(base_url=f"http://{HOST}:{service.port}", timeout=30) as client:
            for i in range(deliveries):
                concept = f"infra/note-{i}-{uuid.uuid4().hex[:6]}"
                started = time.perf_counter()
                seq = post(client, signer, [upsert(concept, f"text of note {i}", f"note {i}")])
                got = client.get(
                    f"/v1/kbs/{KB}/concepts/{concept}", headers={**auth, "X-Min-Seq": str(seq)}
                )
                seconds.append(time.perf_counter() - started)
                refused += got.status_code != 200
            search = client.get(f"/v1/kbs/{KB}/search?q=note", headers=auth).json()
        return {
            "deliveries": deliveries,
            "provider_delay_s": delay,
            "p50_ms": round(1000 * statistics.median(seconds), 1),
            "p99_ms": round(1000 * percentile(seconds, 0.99), 1),
            "max_ms": round(1000 * max(seconds), 1),
            "not_200": refused,
            "search_mode_while_slow": search.get("mode"),
        }
    finally:
        service.stop()
        provider.stop()


def workers_and_restart(
    folder: Path, concepts: int, delay: float, root: Path | None
) -> dict[str, Any]:
    provider = CountingProvider(delay)
    provider.start()
    creds = Credentials()
    path = config(folder, creds, provider)
    service = ServiceProcess(path, workers=2, root=root)
    service.start()
    try:
        asyncio.run(service.wait_ready())
        signer = kbgen.Signer(creds.secret)
        base = f"http://{HOST}:{service.port}"
        with httpx.Client(base_url=base, timeout=60) as client:
            events = [upsert(f"infra/c{i}", f"concept {i} text", f"c{i}") for i in range(concepts)]
            post(client, signer, events)
            filled = until_complete(client, creds)
        embedded = provider.texts
        service.stop()
        shutil.rmtree(folder / "kbgraph.db.checkpoints", ignore_errors=True)
        again = ServiceProcess(path, workers=2, port=service.port, root=root)
        again.start()
        service = again
        asyncio.run(again.wait_ready())
        with httpx.Client(base_url=base, timeout=60) as client:
            refilled = until_complete(client, creds)
        return {
            "concepts": concepts,
            "texts_embedded": embedded,
            "fill_s": round(filled, 2),
            "restart_without_checkpoints_texts_embedded": provider.texts - embedded,
            "restart_fill_s": round(refilled, 2),
        }
    finally:
        service.stop()
        provider.stop()


def vector_rows(store: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(store)) as conn:
        return conn.execute("SELECT * FROM vector ORDER BY kb, model, concept").fetchall()


def cluster(folder: Path, concepts: int, changes: int, root: Path | None) -> dict[str, Any]:
    from tests.nats_cluster import STREAM, NatsCluster  # the benchmark's own servers

    provider = CountingProvider()
    provider.start()
    nats = NatsCluster(folder / "nats", 3)
    services: list[ServiceProcess] = []
    try:
        nats.start()
        creds = Credentials()
        for i in range(3):
            (folder / f"node{i}").mkdir()
            path = config(folder / f"node{i}", creds, provider, nats.log_toml(STREAM))
            services.append(ServiceProcess(path, workers=2, root=root))
            services[-1].start()
        for service in services:
            asyncio.run(service.wait_ready(180))
        signer = kbgen.Signer(creds.secret)
        clients = [httpx.Client(base_url=f"http://{HOST}:{s.port}", timeout=60) for s in services]
        started = time.monotonic()
        for i in range(concepts):  # deliveries of 10, spread over the nodes
            if i % 10 == 0:
                batch = [
                    upsert(f"infra/c{j}", f"concept {j} text", f"c{j}")
                    for j in range(i, min(concepts, i + 10))
                ]
                post(clients[(i // 10) % 3], signer, batch)
        for client in clients:
            until_complete(client, creds)
        for i in range(0, changes, 10):
            batch = [
                upsert(f"infra/c{j}", f"concept {j} changed", f"c{j}")
                for j in range(i, min(changes, i + 10))
            ]
            for event in batch:
                event["data"]["version"] = 2
            post(clients[(i // 10) % 3], signer, batch)
        time.sleep(1.0)  # the changes applied everywhere before "complete" is believed
        for client in clients:
            until_complete(client, creds)
        filled = time.monotonic() - started
        for client in clients:
            client.close()
        rows = [vector_rows(folder / f"node{i}" / "kbgraph.db") for i in range(3)]
        return {
            "nodes": 3,
            "workers_per_node": 2,
            "concept_changes": concepts + changes,
            "texts_embedded": provider.texts,
            "provider_requests": provider.requests,
            "embed_calls_per_change": round(provider.texts / (concepts + changes), 2),
            "same_rows_on_every_node": all(r == rows[0] for r in rows),
            "rows_per_node": [len(r) for r in rows],
            "fill_s": round(filled, 2),
        }
    finally:
        for service in services:
            service.stop()
        nats.stop()
        provider.stop()


def cluster_local(folder: Path, concepts: int, changes: int, root: Path | None) -> dict[str, Any]:
    """The local model's phase: ``loadtest/cluster_model.py`` (copied, so that it runs on the
    measured checkout's code alone) with that checkout's Python over a 3-server cluster; then
    the stream's messages and bytes per event."""
    from tests.nats_cluster import STREAM, NatsCluster

    nats = NatsCluster(folder / "nats", 3)
    try:
        nats.start()
        (folder / "log.toml").write_text(nats.log_toml(STREAM))
        script = folder / "cluster_model.py"
        shutil.copy(ROOT / "loadtest" / "cluster_model.py", script)
        python = str(root / ".venv" / "bin" / "python") if root else sys.executable
        command = [python, str(script), "--folder", str(folder), "--log", str(folder / "log.toml")]
        command += ["--concepts", str(concepts), "--changes", str(changes)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode:
            raise RuntimeError(f"cluster_model.py failed: {done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])

        async def stream_state() -> Any:
            nc = await nats.connect()
            try:
                return (await nc.jetstream(timeout=5).stream_info(STREAM)).state
            finally:
                await nc.close()

        state = asyncio.run(stream_state())
        result["stream_messages"] = int(state.messages)
        result["stream_bytes_per_event"] = round(int(state.bytes) / result["concept_changes"], 1)
        return result
    finally:
        nats.stop()


def landing_cpu(texts: int = 2000) -> dict[str, float]:
    """CPU µs per 40-word upsert on a node: running the local model (its word cache warm)
    against taking the vector its message shipped (``kbgraph.embeddings.shipped``)."""
    from kbgraph.embeddings.carried import Carrier
    from kbgraph.embeddings.local import LocalEmbedder
    from kbgraph.embeddings.shipped import carried, ship
    from loadtest.cluster_model import concept

    rng = random.Random(3)
    events = [concept(i, 1, rng) for i in range(texts)]
    carrier = Carrier(LocalEmbedder(), 4000)
    sent = ship(carrier, events)  # warms the word cache, as a running node's is
    assert sent is not None
    data = [e.data for e in events]
    best = {"model": math.inf, "shipped": math.inf}
    for _ in range(3):
        began = time.process_time()
        carrier.vectors(data)
        best["model"] = min(best["model"], time.process_time() - began)
        began = time.process_time()
        carried(carrier, data, sent.vectors)
        best["shipped"] = min(best["shipped"], time.process_time() - began)
    return {k: round(v / texts * 1e6, 1) for k, v in best.items()}


def measure(tmp: Path, args: argparse.Namespace, root: Path | None) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if not args.skip_single:
        first, second = tmp / "readable", tmp / "workers"
        first.mkdir()
        second.mkdir()
        result["readable"] = readable(first, args.deliveries, args.delay, root)
        result["workers"] = workers_and_restart(second, args.concepts, args.delay, root)
    if args.cluster or args.skip_single:
        (tmp / "cluster").mkdir()
        if not args.local_model_only:
            result["cluster"] = cluster(tmp / "cluster", args.concepts, args.changes, root)
        (tmp / "cluster_local").mkdir()
        result["cluster_local"] = cluster_local(
            tmp / "cluster_local", args.concepts, args.changes, root
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_spine", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--deliveries", type=int, default=40)
    parser.add_argument("--delay", type=float, default=1.0, help="the provider's seconds")
    parser.add_argument("--concepts", type=int, default=120)
    parser.add_argument("--changes", type=int, default=30, help="concepts changed (--cluster)")
    parser.add_argument("--cluster", action="store_true", help="the 3-node phase too")
    parser.add_argument("--skip-single", action="store_true", help="the cluster phase alone")
    parser.add_argument(
        "--local-model-only", action="store_true", help="of the cluster phases, cluster_local"
    )
    parser.add_argument("--peer", type=Path, help="a checkout to measure too (its .venv)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-spine-") as tmp:
        peer = None
        if args.peer is not None:
            (Path(tmp) / "peer").mkdir()
            peer = measure(Path(tmp) / "peer", args, args.peer.resolve())
        (Path(tmp) / "this").mkdir()
        result = measure(Path(tmp) / "this", args, None)
    aims: dict[str, bool] = {}
    if "readable" in result:
        readable_part, workers_part = result["readable"], result["workers"]
        restarted = workers_part["restart_without_checkpoints_texts_embedded"]
        aims["readable_p99_le_50ms"] = (
            readable_part["p99_ms"] <= 50 and not readable_part["not_200"]
        )
        aims["workers_texts_embedded_eq_concepts"] = workers_part["texts_embedded"] == args.concepts
        aims["restart_embeds_nothing"] = restarted == 0
    if "cluster" in result:
        part = result["cluster"]
        aims["cluster_one_embed_per_change"] = part["embed_calls_per_change"] == 1
        aims["cluster_same_rows_everywhere"] = part["same_rows_on_every_node"]
    if "cluster_local" in result:
        part = result["cluster_local"]
        result["cluster_local"]["node_cpu_us_per_event"] = landing_cpu()
        aims["cluster_local_model_once_per_change"] = part["embed_calls_per_change"] == 1
        # the model runs only where a delivery was taken: every other node 0 times
        aims["cluster_local_other_nodes_run_model_0_times"] = (
            part["texts_embedded_per_node"] == part["events_taken_per_node"]
        )
        aims["cluster_local_same_rows_everywhere"] = part["same_rows_on_every_node"]
    result["aims"] = aims
    if peer is not None:
        result["peer"] = peer
    print(json.dumps(result))
    return 0 if all(result["aims"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

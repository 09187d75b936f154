"""A JetStream cluster that runs for months: stream bytes with trimming, an empty node ready
from a snapshot, and agent req/s by nodes and workers per node (issue 25).

1. A 3-server NATS cluster on loopback (TLS, accounts: ``tests.nats_cluster``) and node A with
   ``snapshot_every_seconds`` set; A takes ``--concepts`` concepts in 500-event deliveries.
2. Writes go on for ``--seconds`` at ``--rate`` single-event deliveries/s while the stream's
   bytes and messages are sampled every 2 s: with trimming they stay bounded by what came in
   since the last snapshots, not by the history (the load's bytes are trimmed away too).
3. An empty node B starts: the time from its process start to ``/readyz`` 200 (it restores the
   newest snapshot, loads its checkpoint, follows the stream's rest).

4. Agent req/s with 1, 2 and 3 nodes of 1 and 2 workers each: ``python -m loadtest --jetstream
   --nodes N --workers W`` per pair (its own NATS cluster, agents and paced writers at once,
   zero-loss checked), with the CPU cores each process group used (``nodes``: every node's
   serve process, workers and applier; ``nats``; ``client``: the load generator; ``other``:
   the rest of the machine) so a reader sees what bounded each figure.

The faults under load are ``python -m loadtest --nodes 3 --faults`` (not here). ``--phases``
picks the parts (``stream``: 1-3, ``rps``: 4). The last line is one JSON object. Everything
shares this machine: on a machine of few cores the nodes, NATS and the client compete, and
the CPU figures say so.

    .venv/bin/python -m loadtest.bench_cluster [--concepts 100000] [--seconds 60] [--rate 50]
        [--phases stream,rps] [--rps-seconds 15] [--nodes 1,2,3] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest import ROOT
from loadtest.bench_ingest import SECRET, Concepts, free_port, start_server, stop_server
from tests import webhook_client as wc
from tests.nats_cluster import STREAM, NatsCluster

BATCH = 500


async def load(port: int, concepts: int, connections: int = 4) -> float:
    """``concepts`` upserts in ``BATCH``-event deliveries; the seconds it took."""
    source = Concepts("load", 1)
    batches = [
        [source.next() for _ in range(min(BATCH, concepts - i))] for i in range(0, concepts, BATCH)
    ]
    url = f"http://127.0.0.1:{port}/v1/kbs/bench/events"
    started = time.perf_counter()

    async def worker(mine: list[list[dict[str, Any]]]) -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            for events in mine:
                body, headers = wc.delivery(SECRET, events)
                answer = await client.post(url, content=body, headers=headers)
                if answer.status_code != 200:
                    raise SystemExit(f"load: {answer.status_code} {answer.text[:200]}")

    await asyncio.gather(*(worker(batches[n::connections]) for n in range(connections)))
    return time.perf_counter() - started


async def stream_state(cluster: NatsCluster) -> tuple[int, int, int]:
    """(bytes, messages, first sequence) the stream holds now."""
    nc = await cluster.connect()
    try:
        state = (await nc.jetstream(timeout=10).stream_info(STREAM)).state
        return int(state.bytes), int(state.messages), int(state.first_seq)
    finally:
        await nc.close()


async def write_and_sample(
    port: int, cluster: NatsCluster, seconds: float, rate: float
) -> list[dict[str, int]]:
    """Single-event deliveries at ``rate``/s for ``seconds``; the stream sampled every 2 s."""
    source = Concepts("run", 2)
    url = f"http://127.0.0.1:{port}/v1/kbs/bench/events"
    samples: list[dict[str, int]] = []
    stop = asyncio.Event()

    async def writer() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            sent, started = 0, time.monotonic()
            while not stop.is_set():
                body, headers = wc.delivery(SECRET, source.next())
                await client.post(url, content=body, headers=headers)
                sent += 1
                await asyncio.sleep(max(0.0, started + sent / rate - time.monotonic()))

    task = asyncio.create_task(writer())
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        size, messages, first = await stream_state(cluster)
        samples.append(
            {
                "t": round(time.monotonic() - started),
                "bytes": size,
                "messages": messages,
                "first": first,
            }
        )
        await asyncio.sleep(2.0)
    stop.set()
    await task
    return samples


async def snapshot_sizes(cluster: NatsCluster) -> list[int]:
    nc = await cluster.connect()
    try:
        obs = await nc.jetstream(timeout=10).object_store(f"{STREAM}-snapshots")
        return [int(info.size) for info in await obs.list(ignore_deletes=True)]
    finally:
        await nc.close()


def agent_rps(nodes: int, workers: int, seconds: float, agents: int, out: Path) -> dict[str, Any]:
    """One ``python -m loadtest`` run over JetStream: its req/s, CPU and checks."""
    command = [
        sys.executable, "-m", "loadtest", "--jetstream", "--nodes", str(nodes),
        "--workers", str(workers), "--seconds", str(seconds), "--agents", str(agents),
        "--no-progress", "--no-chart", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    try:
        headline = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"nodes": nodes, "workers": workers, "failed": done.stderr[-2000:]}
    return {
        "nodes": nodes,
        "workers": workers,
        "agents_rps": headline["agents_rps"],
        "write_rate": headline["write_rate"],
        "cpu_cores": headline.get("cpu_cores"),
        "ack_ms": headline.get("ack_ms"),
        "zero_loss": headline.get("zero_loss"),
        "no_5xx": headline.get("no_5xx"),
        "exit": done.returncode,
    }


def rps_phase(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    runs = []
    for nodes in args.nodes:
        for workers in args.workers:
            row = agent_rps(nodes, workers, args.rps_seconds, args.agents, root / "rps")
            runs.append(row)
            print(
                f"{nodes} node(s) x {workers} worker(s): {row.get('agents_rps')} agent req/s,"
                f" cpu {row.get('cpu_cores')}, exit {row.get('exit')}",
                flush=True,
            )
    by = {(r["nodes"], r["workers"]): r.get("agents_rps") for r in runs}
    ratios = {}
    for nodes in args.nodes:
        base, more = by.get((nodes, 1)), by.get((nodes, 2))
        if base and more:
            ratios[f"{nodes}_nodes_2_workers_vs_1"] = round(more / base, 2)
    for workers in args.workers:
        base = by.get((1, workers))
        for nodes in args.nodes[1:]:
            more = by.get((nodes, workers))
            if base and more:
                ratios[f"{nodes}_vs_1_nodes_{workers}_workers"] = round(more / base, 2)
    return {"runs": runs, "ratios": ratios, "seconds": args.rps_seconds, "agents": args.agents}


def stream_phase(args: argparse.Namespace, root: Path, figures: dict[str, Any]) -> None:
    """Phases 1-3: load, writes sampled, an empty node ready from a snapshot."""
    log = f"snapshot_every_seconds = {args.snapshot_every}\nsnapshots_keep = 2\n"
    cluster = NatsCluster(root / "nats", 3)
    nodes = []
    try:
        cluster.start()
        port_a = free_port()
        nodes.append(start_server(root / "a", port_a, cluster.log_toml(STREAM) + log))
        seconds = asyncio.run(load(port_a, args.concepts))
        figures["load_seconds"] = round(seconds, 1)
        loaded = asyncio.run(stream_state(cluster))
        figures["stream_after_load"] = {"bytes": loaded[0], "messages": loaded[1]}
        print("loaded:", figures["load_seconds"], "s; stream", loaded, flush=True)
        samples = asyncio.run(write_and_sample(port_a, cluster, args.seconds, args.rate))
        half = len(samples) // 2
        figures["stream_during_writes"] = {
            "samples": samples,
            "max_bytes_first_half": max(s["bytes"] for s in samples[:half]),
            "max_bytes_second_half": max(s["bytes"] for s in samples[half:]),
            "rate_per_s": args.rate,
            "seconds": args.seconds,
        }
        print("stream while writing:", [(s["t"], s["bytes"], s["first"]) for s in samples])
        port_b = free_port()
        started = time.monotonic()
        nodes.append(start_server(root / "b", port_b, cluster.log_toml(STREAM)))
        figures["empty_node_ready_seconds"] = round(time.monotonic() - started, 1)
        figures["snapshot_bytes"] = asyncio.run(snapshot_sizes(cluster))
        print("empty node B ready from a snapshot in", figures["empty_node_ready_seconds"], "s")
    finally:
        for proc in nodes:
            stop_server(proc)
        cluster.stop()


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--concepts", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=60.0, help="the write phase, sampled")
    parser.add_argument("--rate", type=float, default=50.0, help="deliveries/s in that phase")
    parser.add_argument("--snapshot-every", type=float, default=10.0)
    parser.add_argument("--phases", default="stream,rps", help="stream (1-3), rps (4)")
    parser.add_argument("--rps-seconds", type=float, default=15.0, help="each req/s run")
    parser.add_argument("--agents", type=int, default=8, help="agent clients in each run")
    parser.add_argument("--nodes", type=_ints, default=[1, 2, 3], help="e.g. 1,2,3")
    parser.add_argument("--workers", type=_ints, default=[1, 2], help="e.g. 1,2")
    args = parser.parse_args()
    phases = set(args.phases.split(","))
    figures: dict[str, Any] = {"concepts": args.concepts, "cores": os.cpu_count()}
    aims: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="kbgraph-bench-cluster-") as folder:
        root = Path(folder)
        if "stream" in phases:
            stream_phase(args, root, figures)
            during = figures["stream_during_writes"]
            aims["stream_bytes_flat"] = (
                during["max_bytes_second_half"] <= 1.5 * during["max_bytes_first_half"]
            )
            aims["empty_node_ready_le_30s"] = figures["empty_node_ready_seconds"] <= 30.0
        if "rps" in phases:
            figures["agent_rps"] = rps_phase(args, root)
            runs = figures["agent_rps"]["runs"]
            aims["rps_runs_lose_nothing_no_5xx"] = all(
                r.get("zero_loss") and r.get("no_5xx") for r in runs
            )
    figures["aims"] = aims
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

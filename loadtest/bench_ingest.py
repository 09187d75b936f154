"""Webhook ingest throughput over real HTTP, durable (WAL, synchronous=FULL).

Starts a real ``kbgraph serve`` (1 worker, loopback, temp dir) and drives it with concurrent
keep-alive connections on raw asyncio sockets (signed deliveries, built in this process):

1. single-event deliveries: deliveries/s and p50/p99 acknowledgement latency; beside the
   connections, one probe writes a delivery to another KB, then reads its concept with
   ``X-Min-Seq`` (the seq of its 200): p50/p99 of that read (a read after a write, under load;
   ``--no-read-probe`` leaves it out: its requests keep the follower's hold off);
2. 500-event deliveries: events/s and p50/p99 acknowledgement latency.

Each phase also reports the CPU a delivery (an event, batched) of the server process, all its
threads, and of this client, over the measured window: on a shared machine the CPU a delivery
moves far less than the rate, and the client's shows whether it, on the same cores, is the
bottleneck.

Every 200 counted is durable (the store answers after the fsynced group commit). The last line
printed is one JSON object with the figures, the aims (>= 3,000 single deliveries/s,
>= 50,000 events/s batched) and whether each was met. Bounded to well under 2 minutes.

With ``--peer CHECKOUT`` the same phases run against a server of that checkout (its
``.venv``, else this Python with the checkout first on the path), alternating peer / this
``--rounds`` times, each on a fresh store; the JSON then holds both medians and
``this_over_peer``.

    .venv/bin/python -m loadtest.bench_ingest [--seconds 8] [--connections 64] [--peer CHECKOUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from loadtest import ROOT
from loadtest.report import checkout_python
from tests import webhook_client as wc

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ADMIN = "bench-admin-token-local"
AIM_SINGLE = 3_000.0  # issue 15
AIM_EVENTS = 50_000.0
PROBE_KB = "probe"  # the read-after-write probe's KB (the bench's own holds what was sent)
BATCH = 500
WORDS = ("dns", "backup", "router", "cluster", "vpn", "certificate", "disk", "ingress",
         "monitoring", "firewall", "database", "mail", "proxy", "storage", "upgrade",
         "incident", "kernel", "gateway", "replica", "failover", "schedule", "runbook",
         "owner")  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(
    folder: Path,
    port: int,
    extra_config: str = "",
    checkout: Path = ROOT,
    *,
    log_level: str = "warning",
    output: Path | None = None,
    ready_seconds: float = 120.0,
) -> subprocess.Popen[bytes]:
    """A ``kbgraph serve`` of ``checkout`` in ``folder`` (its config there, with
    ``extra_config`` appended), returned once ``/readyz`` answers 200: projection built, and
    over JetStream caught up. Its log goes to ``output`` when given."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "kbgraph.toml"
    config.write_text(
        f'[store]\npath = "bench.db"\n[webhooks]\nsecrets = ["{SECRET}"]\n'
        f'[[tokens]]\nname = "admin"\ntoken = "{ADMIN}"\nadmin = true\n' + extra_config
    )
    python = checkout_python(checkout)
    command = [python, "-m", "kbgraph", "serve", "--config", str(config)]
    command += ["--port", str(port), "--log-level", log_level]
    sink = None if output is None else open(output, "wb")  # noqa: SIM115 (the child's)
    proc = subprocess.Popen(command, cwd=checkout, start_new_session=True, stdout=sink, stderr=sink)
    if sink is not None:
        sink.close()  # the child holds its own copy
    deadline = time.monotonic() + ready_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("kbgraph serve exited during start-up")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("kbgraph serve did not become ready")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Concepts:
    """Realistic-looking upserts: a title, ~300 characters of text, 4 links, a tag."""

    def __init__(self, prefix: str, seed: int) -> None:
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.count = 0

    def next(self) -> dict[str, Any]:
        rng, i = self.rng, self.count
        self.count += 1
        text = " ".join(rng.choice(WORDS) for _ in range(40))
        links = [f"{self.prefix}/c{rng.randrange(max(1, i + 50))}" for _ in range(4)]
        return wc.event(
            "upserted",
            f"{self.prefix}/c{i}",
            1,
            source="bench://kb",
            event_id=f"{self.prefix}-{i}",
            title=f"{rng.choice(WORDS).title()} {rng.choice(WORDS)} {i}",
            type="Runbook",
            tags=[rng.choice(WORDS)],
            text=text,
            links=links,
        )


def request_bytes(port: int, payload: Any) -> bytes:
    body, headers = wc.delivery(SECRET, payload)
    return wc.raw_request("/v1/kbs/bench/events", f"127.0.0.1:{port}", body, headers)


async def one_connection(
    port: int,
    make: Callable[[], bytes],
    stop_at: float,
    measure_from: float,
    latencies: list[float],
    counts: list[int],
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < stop_at:
            request = make()
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            done = time.perf_counter()
            if status != 200:
                raise SystemExit(f"unexpected status {status}: {head!r}")
            if started >= measure_from:
                latencies.append(done - started)
                counts[0] += 1
    finally:
        writer.close()


async def read_after_write(
    port: int, stop_at: float, measure_from: float, latencies: list[float]
) -> None:
    """The probe: a delivery to the KB ``PROBE_KB``, then its concept read with ``X-Min-Seq``
    (the seq of the 200), over and over; the reads' seconds in ``latencies``."""
    probe = Concepts("probe", 7)
    auth = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        while time.perf_counter() < stop_at:
            event = probe.next()
            body, headers = wc.delivery(SECRET, event)
            posted = await client.post(f"/v1/kbs/{PROBE_KB}/events", content=body, headers=headers)
            if posted.status_code != 200:
                raise SystemExit(f"probe: unexpected status {posted.status_code}")
            started = time.perf_counter()
            got = await client.get(
                f"/v1/kbs/{PROBE_KB}/concepts/{event['subject']}",
                headers={**auth, "X-Min-Seq": str(posted.json()["seq"])},
            )
            if got.status_code != 200:
                raise SystemExit(f"probe: the read answered {got.status_code}")
            if started >= measure_from:
                latencies.append(time.perf_counter() - started)


def process_cpu(pid: int) -> float:
    """Seconds of CPU (user and system, every thread) process ``pid`` has used (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def phase(
    port: int,
    make: Callable[[], bytes],
    connections: int,
    warmup: float,
    seconds: float,
    server_pid: int,
    probe: list[float] | None = None,
) -> tuple[float, float, float, float, float]:
    """(deliveries/s, p50 ms, p99 ms, server CPU µs a delivery, client CPU µs a delivery) over
    the measured window, after the warm-up; with ``probe``, the read-after-write probe runs
    beside the connections, its reads' seconds put there."""
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds
    latencies: list[float] = []
    counts = [0]
    cpu_from: list[float] = []

    async def cpu_at_start() -> None:
        await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
        cpu_from.extend((process_cpu(server_pid), time.process_time()))

    probing = [] if probe is None else [read_after_write(port, stop_at, measure_from, probe)]
    await asyncio.gather(
        cpu_at_start(),
        *probing,
        *(
            one_connection(port, make, stop_at, measure_from, latencies, counts)
            for _ in range(connections)
        ),
    )
    elapsed = max(1e-9, time.perf_counter() - measure_from)
    done = max(1, counts[0])
    server_us = (process_cpu(server_pid) - cpu_from[0]) / done * 1e6
    client_us = (time.process_time() - cpu_from[1]) / done * 1e6
    return (
        counts[0] / elapsed,
        percentile_ms(latencies, 0.50),
        percentile_ms(latencies, 0.99),
        round(server_us, 1),
        round(client_us, 1),
    )


def percentile_ms(seconds: list[float], p: float) -> float:
    if not seconds:
        return 0.0
    ordered = sorted(seconds)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)


def ingest_phases(
    port: int,
    connections: int,
    batch_connections: int,
    seconds: float,
    server_pid: int,
    seed: int = 1,
    read_probe: bool = False,
) -> tuple[dict[str, Any], int]:
    """Single-event deliveries (with ``read_probe``, the read-after-write probe beside them),
    then 500-event ones, each phase ``seconds`` long; returns (figures, events sent: what the
    KB ``bench`` must hold after both)."""
    single = Concepts(f"single{seed}", seed)
    # pre-build the single deliveries so the client stays light
    prebuilt = [request_bytes(port, single.next()) for _ in range(30_000)]
    position = iter(prebuilt)

    def make_single() -> bytes:
        try:
            return next(position)
        except StopIteration:
            return request_bytes(port, single.next())

    batches = Concepts(f"batch{seed}", seed + 1)

    def make_batch() -> bytes:
        return request_bytes(port, [batches.next() for _ in range(BATCH)])

    reads: list[float] = []
    s_rate, s_p50, s_p99, s_cpu, s_client = asyncio.run(
        phase(
            port, make_single, connections, 1.0, seconds, server_pid, reads if read_probe else None
        )
    )
    b_rate, b_p50, b_p99, b_cpu, b_client = asyncio.run(
        phase(port, make_batch, batch_connections, 1.0, seconds, server_pid)
    )
    # every delivery built was sent, but for the pre-built ones left over
    sent = single.count + batches.count - sum(1 for _ in position)
    figures = {
        "single_deliveries_per_s": round(s_rate),
        "single_p50_ms": s_p50,
        "single_p99_ms": s_p99,
        "single_server_cpu_us": s_cpu,
        "single_client_cpu_us": s_client,
        "read_after_write_p50_ms": percentile_ms(reads, 0.50),
        "read_after_write_p99_ms": percentile_ms(reads, 0.99),
        "batch_events_per_s": round(b_rate * BATCH),
        "batch_p50_ms": b_p50,
        "batch_p99_ms": b_p99,
        "batch_server_cpu_us_per_event": round(b_cpu / BATCH, 1),
        "batch_client_cpu_us_per_event": round(b_client / BATCH, 1),
    }
    return figures, sent


def measure(checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both phases against a fresh server of ``checkout``: its figures."""
    with tempfile.TemporaryDirectory(prefix="kbgraph-bench-") as folder:
        port = free_port()
        proc = start_server(Path(folder), port, checkout=checkout)
        try:
            phases, sent = ingest_phases(
                port,
                args.connections,
                args.batch_connections,
                args.seconds,
                proc.pid,
                read_probe=args.read_probe,
            )
        finally:
            stop_server(proc)
        db = sqlite3.connect(Path(folder) / "bench.db")
        journal = db.execute("PRAGMA journal_mode").fetchone()[0]
        stored = db.execute("SELECT seq FROM kb WHERE name = 'bench'").fetchone()[0]
        db.close()
    return {**phases, "journal_mode": journal, "stored_events_match_sent": stored == sent}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_ingest", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per phase")
    parser.add_argument("--connections", type=int, default=64, help="single-event phase")
    parser.add_argument("--batch-connections", type=int, default=8)
    parser.add_argument("--peer", type=Path, help="a checkout to compare with, side by side")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (with --peer)")
    parser.add_argument(
        "--read-probe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the read-after-write probe beside the single deliveries (its X-Min-Seq requests"
        " keep the follower's hold off: --no-read-probe measures a stream of writes alone)",
    )
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    print("durability: WAL journal, synchronous=FULL (each group commit fsynced)")
    sides = [("peer", args.peer), ("this", ROOT)] if args.peer else [("this", ROOT)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in sides}
    for _ in range(args.rounds if args.peer else 1):
        for name, checkout in sides:
            runs[name].append(measure(checkout, args))
            got = runs[name][-1]
            probe = (
                f"; a read after a write, X-Min-Seq: p50 {got['read_after_write_p50_ms']} ms"
                f" p99 {got['read_after_write_p99_ms']} ms"
                if args.read_probe
                else ""
            )
            print(
                f"{name}: single-event deliveries {got['single_deliveries_per_s']:,}/s"
                f"  p50 {got['single_p50_ms']} ms  p99 {got['single_p99_ms']} ms"
                f" ({args.connections} connections; CPU µs a delivery: server"
                f" {got['single_server_cpu_us']}, client {got['single_client_cpu_us']}{probe});"
                f" {BATCH}-event deliveries {got['batch_events_per_s']:,} events/s"
                f"  p50 {got['batch_p50_ms']} ms  p99 {got['batch_p99_ms']} ms"
                f" ({args.batch_connections} connections; CPU µs an event: server"
                f" {got['batch_server_cpu_us_per_event']},"
                f" client {got['batch_client_cpu_us_per_event']})",
                flush=True,
            )
    numbers = ("single_deliveries_per_s", "single_p50_ms", "single_p99_ms",
               "single_server_cpu_us", "single_client_cpu_us",
               "read_after_write_p50_ms", "read_after_write_p99_ms",
               "batch_events_per_s", "batch_p50_ms", "batch_p99_ms",
               "batch_server_cpu_us_per_event", "batch_client_cpu_us_per_event")  # fmt: skip
    med = {
        name: {k: statistics.median(r[k] for r in rs) for k in numbers} for name, rs in runs.items()
    }
    this = med["this"]
    figures: dict[str, Any] = {
        "durability": f"journal_mode={runs['this'][-1]['journal_mode']}, synchronous=FULL",
        **{k: round(v) if k.endswith("_per_s") else v for k, v in this.items()},
        "batch_size": BATCH,
        "stored_events_match_sent": all(r["stored_events_match_sent"] for r in runs["this"]),
        "connections": {"single": args.connections, "batch": args.batch_connections},
        "measured_seconds_per_phase": args.seconds,
    }
    if args.peer:
        figures["peer"] = med["peer"]
        figures["rounds"] = args.rounds
        figures["this_over_peer"] = {
            k: round(this[k] / med["peer"][k], 3) for k in numbers if med["peer"][k]
        }
    figures["aims"] = {"single_deliveries_per_s": AIM_SINGLE, "batch_events_per_s": AIM_EVENTS}
    figures["met"] = {
        "single_deliveries_per_s": this["single_deliveries_per_s"] >= AIM_SINGLE,
        "batch_events_per_s": this["batch_events_per_s"] >= AIM_EVENTS,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

"""Single-event deliveries per second in each CloudEvents content mode, side by side.

One real ``kbgraph serve`` (1 worker, loopback, durable: WAL, synchronous=FULL) takes signed
one-event deliveries in structured mode (``application/cloudevents+json``), in binary mode
(``ce-*`` headers, the data as an ``application/json`` body) and as a one-event batch, phase
after phase, several rounds alternating, so the machine's drift hits every mode alike. The
aim: binary mode at least 0.9x structured. The last line printed is one JSON object.

    .venv/bin/python -m loadtest.bench_ingest_modes [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from loadtest.bench_ingest import SECRET, Concepts, free_port, phase, start_server
from tests import webhook_client as wc

MODES = ("structured", "binary", "batch")
AIM_BINARY_RATIO = 0.9


def maker(port: int, mode: str) -> Callable[[], bytes]:
    concepts = Concepts(f"m-{mode}", seed=7)
    host = f"127.0.0.1:{port}"

    def make() -> bytes:
        event = concepts.next()
        if mode == "binary":
            body = wc.encode(event["data"])
            headers = wc.signed_headers(SECRET, body, "application/json")
            for name in ("specversion", "id", "source", "type", "subject"):
                headers[f"ce-{name}"] = quote(event[name], safe="/:")
        else:
            payload = [event] if mode == "batch" else event
            body, headers = wc.delivery(SECRET, payload)
        return wc.raw_request("/v1/kbs/bench/events", host, body, headers)

    return make


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_ingest_modes", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per phase")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the three modes")
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    p50: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start_server(Path(tmp), port)
        try:
            makers = {mode: maker(port, mode) for mode in MODES}
            for round_ in range(args.rounds):
                for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                    rate, median, *_ = asyncio.run(
                        phase(port, makers[mode], args.connections, 1.0, args.seconds, proc.pid)
                    )
                    rates[mode].append(rate)
                    p50[mode].append(median)
                    print(f"round {round_} {mode:10s} {rate:8.0f}/s p50 {median} ms", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    median_rate = {mode: round(statistics.median(rates[mode])) for mode in MODES}
    ratio = round(median_rate["binary"] / median_rate["structured"], 3)
    report: dict[str, Any] = {
        "kind": "bench_ingest_modes",
        "durability": "journal_mode=wal, synchronous=FULL",
        "deliveries_per_s": median_rate,
        "rounds": {mode: [round(r) for r in rates[mode]] for mode in MODES},
        "p50_ms": {mode: statistics.median(p50[mode]) for mode in MODES},
        "binary_over_structured": ratio,
        "batch_over_structured": round(median_rate["batch"] / median_rate["structured"], 3),
        "aims": {"binary_ge_0_9x_structured": {"value": ratio, "met": ratio >= AIM_BINARY_RATIO}},
    }
    print(json.dumps(report, separators=(",", ":")))
    sys.exit(0)


if __name__ == "__main__":
    main()

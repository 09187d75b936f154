"""Abuse (issue 10): does one hostile client hurt the others?

``python -m loadtest.abuse`` starts a real ``kbgraph serve`` (1 worker, the default limits,
a webhook secret, an admin and a narrowed token) on loopback, loads a small KB, and then:

- measures ``/healthz`` latency (answered on the event loop, so it shows any blocking) from a
  separate process with no attack;
- runs each attack for ``--seconds`` while that probe and a well-behaved client (status,
  search and graph_context with the narrowed token, reconnecting as a browser would) keep
  going: a 100 MB agent body, a 100 MB header, 2,000 idle sockets, 40 slow 15 MB uploads to
  the events endpoint (plausible signature headers, one byte held back), a flood of signed
  deliveries creating new KBs, a snippet bomb (a concept with 1 MiB of text without a word
  break, 200-term queries), and (issue 28) trickled bodies (1,000 deliveries with made-up
  signature headers sending a byte a second, while signed deliveries must still pass), MCP
  streams (1,000 ``GET /mcp`` from the narrowed token, held open), a word flood
  (``graph_context`` queries of 20,000 distinct words each) and a ``link_suggest`` name bomb
  (a visible 60 KB note, hidden concepts with aliases of 1 to 200 words).

Per attack: the probe's p50/p99, the server's RSS growth (peak during the attack over the RSS
before it), and the well-behaved client's failures (and, for trickled bodies, the signed
deliveries' failures). Aims: p99 <= 50 ms, RSS growth <= 200 MB,
no failure. Bounded: every attack stops after ``--seconds``; loopback only. The LAST line is
one JSON object. The attacks themselves: ``loadtest.attacks``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing as mp
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import psutil

from loadtest import kbgen, report
from loadtest.attacks import ATTACKS, MB, NAME_BOMB_NOTE, NAME_WORDS, SNIPPET_KB, delivery, upsert
from loadtest.service import HOST, KB, Credentials, ServiceProcess, write_config

P99_AIM_MS: Final = 50.0
RSS_AIM_MB: Final = 200.0


# --- the probe and the well-behaved client (a separate process) ------------------------------


def _probe_main(port: int, token: str, stop: Any, out: Any) -> None:
    """Time /healthz on one keep-alive connection every 10 ms; meanwhile a polite client.

    Runs for the whole benchmark; every record carries its ``time.monotonic()`` (system-wide
    on Linux), so the parent cuts the records into the windows of its attacks.
    """
    failures: list[tuple[float, str]] = []
    polite_done: list[float] = []

    def polite() -> None:
        queries = [
            ("GET", f"/v1/kbs/{KB}/status", None),
            ("GET", f"/v1/kbs/{KB}/search?q=dns+backup&limit=5", None),
            ("POST", f"/v1/kbs/{KB}/tools/graph_context", b'{"query": "dns backup"}'),
        ]
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=10.0) as client:
            i = 0
            while not stop.is_set():
                method, path, body = queries[i % len(queries)]
                i += 1
                try:
                    answer = client.request(method, path, content=body, headers=headers)
                    if answer.status_code != 200:
                        failures.append(
                            (time.monotonic(), f"{path}: {answer.status_code} {answer.text[:80]}")
                        )
                except httpx.HTTPError as exc:
                    failures.append((time.monotonic(), f"{path}: {type(exc).__name__} {exc}"))
                polite_done.append(time.monotonic())
                time.sleep(0.02)

    thread = threading.Thread(target=polite, daemon=True)
    thread.start()
    latencies: list[tuple[float, float]] = []
    conn: http.client.HTTPConnection | None = None
    while not stop.is_set():
        started = time.perf_counter()
        try:
            if conn is None:
                conn = http.client.HTTPConnection(HOST, port, timeout=10.0)
            conn.request("GET", "/healthz")
            answer = conn.getresponse()
            answer.read()
            if answer.status != 200:
                failures.append((time.monotonic(), f"/healthz: {answer.status}"))
        except (OSError, http.client.HTTPException) as exc:
            failures.append((time.monotonic(), f"/healthz: {type(exc).__name__}"))
            conn = None
            continue
        latencies.append((time.monotonic(), time.perf_counter() - started))
        time.sleep(0.01)
    thread.join(15)
    out.put({"latencies": latencies, "failures": failures, "polite": polite_done})


class Probe:
    """The probe process: started once, stopped once; ``window`` cuts its records."""

    def __init__(self, port: int, token: str) -> None:
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.out = ctx.Queue()
        self.proc = ctx.Process(target=_probe_main, args=(port, token, self.stop, self.out))
        self.proc.start()
        self.records: dict[str, Any] = {}

    def finish(self) -> None:
        self.stop.set()
        self.records = self.out.get(timeout=120)
        self.proc.join(30)

    def window(self, start: float, end: float) -> dict[str, Any]:
        inside = [lat for at, lat in self.records["latencies"] if start <= at <= end]
        failures = [what for at, what in self.records["failures"] if start <= at <= end]
        polite = sum(start <= at <= end for at in self.records["polite"])
        return {"latencies": inside, "failures": failures, "polite": polite}


class RssSampler:
    """The server's peak RSS while a block runs (sampled every 50 ms)."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.before = self.process.memory_info().rss
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- the run ---------------------------------------------------------------------------------


def seed(port: int, creds: Credentials) -> None:
    """A small KB for the polite client, and the snippet bomb's KB (1 MiB without a break)."""
    signer = kbgen.Signer(creds.secret)
    words = ["dns", "backup", "router", "vpn", "disk"]
    events = [upsert(f"infra/c{i}", text=" ".join(words[j % 5] for j in range(i, i + 30)))
              for i in range(200)]  # fmt: skip
    bomb = [upsert(f"x/{n}", text="a" * MB) for n in range(4)]
    # the name bomb: a visible 60 KB note, and hidden concepts (collection "hidden") whose
    # aliases are runs of 1 to 200 of its words
    note = " ".join(NAME_WORDS[i % len(NAME_WORDS)] for i in range(60_000 // 5))
    events.append(upsert(NAME_BOMB_NOTE, text=note))
    for k in range(4):
        event = upsert(f"hidden/names-{k}")
        event["data"]["aliases"] = [" ".join(NAME_WORDS[k : k + n])
                                    for n in range(k * 50 + 1, k * 50 + 51)]  # fmt: skip
        events.append(event)
    with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=60.0) as client:
        for kb, batch in ((KB, events), (SNIPPET_KB, bomb)):
            headers, body = delivery(signer, batch)
            answer = client.post(f"/v1/kbs/{kb}/events", content=body, headers=headers)
            answer.raise_for_status()
            seq = answer.json()["seq"]
            auth = {"Authorization": f"Bearer {creds.admin}", "X-Min-Seq": str(seq)}
            client.get(f"/v1/kbs/{kb}/status", headers=auth).raise_for_status()


def attack_window(
    service: ServiceProcess, creds: Credentials, name: str, seconds: float
) -> tuple[float, float, dict[str, Any], float]:
    """Run one attack (or nothing): its window, its detail and the server's RSS growth."""
    assert service.proc is not None
    attack = ATTACKS.get(name)
    with RssSampler(service.proc.pid) as rss:
        start = time.monotonic()
        if attack is None:
            time.sleep(seconds)
            detail: dict[str, Any] = {}
        else:
            detail = attack(service.port, creds, seconds)
        end = time.monotonic()
    return start, end, detail, round((rss.peak - rss.before) / MB, 1)


def summarise(got: dict[str, Any], detail: dict[str, Any], rss_growth: float) -> dict[str, Any]:
    quantiles = report.percentiles(got["latencies"])
    return {
        "healthz_p50_ms": quantiles["p50"],
        "healthz_p99_ms": quantiles["p99"],
        "healthz_max_ms": quantiles["max"],
        "probes": len(got["latencies"]),
        "rss_growth_mb": rss_growth,
        "polite_requests": got["polite"],
        "failures": len(got["failures"]),
        "failure_examples": got["failures"][:3],
        "attack": detail,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    creds = Credentials()
    with tempfile.TemporaryDirectory(prefix="kbgraph-abuse-") as tmp:
        service = ServiceProcess(write_config(Path(tmp), creds))
        service.start()
        try:
            asyncio.run(service.wait_ready())
            seed(service.port, creds)
            probe = Probe(service.port, creds.agent)
            windows = {}
            try:
                time.sleep(3.0)  # the probe process is up and measuring
                for name in ["no_attack", *args.attacks]:
                    windows[name] = attack_window(service, creds, name, args.seconds)
                    print(f"{name}: {windows[name][2]}", file=sys.stderr)
                    time.sleep(1.0)  # let the server settle between attacks
            finally:
                probe.finish()
        finally:
            service.stop()
    return {
        name: summarise(probe.window(start, end), detail, rss)
        for name, (start, end, detail, rss) in windows.items()
    }


def figures(results: dict[str, Any]) -> dict[str, Any]:
    aims = {}
    for name, row in results.items():
        if name == "no_attack":
            continue
        p99 = row["healthz_p99_ms"]
        aims[name] = {
            "p99_within_50ms": p99 is not None and p99 <= P99_AIM_MS,
            "rss_growth_within_200mb": row["rss_growth_mb"] <= RSS_AIM_MB,
            "no_failed_polite_request": (
                row["failures"] == 0 and not row["attack"].get("polite_failures", 0)
            ),
        }
    return {
        "kind": "abuse",
        "server": "kbgraph serve, 1 worker, default limits",
        "results": results,
        "aims": aims,
        "all_aims_met": all(all(a.values()) for a in aims.values()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.abuse", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="per attack")
    parser.add_argument("--attacks", nargs="*", default=list(ATTACKS), choices=list(ATTACKS))
    args = parser.parse_args(argv)
    out = figures(run(args))
    rows = [
        [name, row["healthz_p50_ms"], row["healthz_p99_ms"], row["rss_growth_mb"],
         row["polite_requests"], row["failures"]]
        for name, row in out["results"].items()
    ]  # fmt: skip
    print(report.table(rows, ["attack", "p50 ms", "p99 ms", "RSS +MB", "polite req", "failed"]))
    for name, aims in out["aims"].items():
        missed = [aim for aim, met in aims.items() if not met]
        print(f"aim {name}: {'met' if not missed else 'NOT met: ' + ', '.join(missed)}")
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

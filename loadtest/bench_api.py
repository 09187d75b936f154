"""Benchmark (issue 5): the agent tools over real HTTP beside a bare Starlette endpoint.

``python -m loadtest.bench_api`` starts ``kbgraph serve`` (uvicorn, 1 worker, uvloop +
httptools) on the seed's 1,000-concept KB loaded with Zipf text through signed webhooks, and a
bare Starlette app (one route answering a small JSON) served by uvicorn with the same loop and
HTTP settings. Each target gets, with the same raw-asyncio keep-alive client:

- a latency pass: 1 connection, requests back to back (p50 / p95 / p99);
- a throughput pass: ``--connections`` (16) connections back to back (requests/s, p50 / p99).

Targets: bare, graph_context with a query, graph_context with ids, link_suggest, graph_path,
search (admin token; every answer must be a 200). Aims: graph_context p50 within 3x of the
bare endpoint's p50, and from one worker process at least 3,000 graph_context requests/s with a
query and 4,000 with ids.
Prints a table; the LAST line is one JSON object with every figure, the ratios and the aims.
Loopback only; bounded (well under 3 minutes).

``--peer ROOT`` (issue 24) instead runs three servers side by side on the same KB: this code
with vectors on (``[embeddings] provider = "local"``), this code with vectors off (``"none"``)
and the checkout at ROOT (its own ``.venv``, e.g. the main branch) as it is; the latency pass of
graph_context with a query, graph_context with ids and search is run on each in turn, ``--rounds``
times, and the p50s compared (median over the rounds). Aim: graph_context with a query, vectors
on, p50 <= 1.3x the peer's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadtest import kbgen, report
from loadtest.crowd import deliver
from loadtest.driver import run_loop
from loadtest.httpload import Pool, build_request, closed_loop
from loadtest.model import Model
from loadtest.recorder import Recorder
from loadtest.service import HOST, KB, Credentials, ServiceProcess, free_port, write_config

P50_AIM_RATIO: Final = 3.0
RPS_AIMS: Final = {"graph_context_query": 3000.0, "graph_context_ids": 4000.0}  # issue 15
TARGETS: Final = (
    "bare",
    "graph_context_query",
    "graph_context_ids",
    "link_suggest",
    "graph_path",
    "search",
)
_encode = msgspec.json.Encoder().encode


# --- the bare endpoint -----------------------------------------------------------------------


async def bare(request: Request) -> JSONResponse:
    """Read the body and answer a small JSON: the floor of a Starlette + uvicorn request."""
    await request.body()
    return JSONResponse({"status": "ok", "count": 0})


bare_app = Starlette(routes=[Route("/bare", bare, methods=["GET", "POST"])])


class BareProcess(ServiceProcess):
    """``uvicorn loadtest.bench_api:bare_app`` with kbgraph's settings (uvloop, httptools)."""

    ready_path = "/bare"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "uvicorn", "loadtest.bench_api:bare_app",
            "--host", HOST, "--port", str(self.port), "--workers", "1",
            "--loop", "uvloop", "--http", "httptools", "--no-access-log",
            "--log-level", "warning",
        ]  # fmt: skip


# --- requests --------------------------------------------------------------------------------


def requests_for(
    target: str, port: int, concepts: list[dict[str, Any]], token: str, seed: int, count: int = 256
) -> list[bytes]:
    """``count`` varied, pre-built requests for a target (cycled by the client)."""
    rng = random.Random(seed * 101 + TARGETS.index(target))
    ids = [c["id"] for c in concepts]
    queries = kbgen.queries(400, seed)
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    out = []
    for _ in range(count):
        if target == "search":
            q = urllib.parse.quote(rng.choice(queries), safe="")
            path = f"/v1/kbs/{KB}/search?q={q}&limit=10"
            out.append(build_request("GET", path, HOST, port, headers))
            continue
        body: dict[str, Any]
        if target in ("bare", "graph_context_query"):
            body = {"query": rng.choice(queries)}
        elif target == "graph_context_ids":
            body = {"ids": rng.sample(ids, rng.randint(1, 3))}
        elif target == "link_suggest":
            body = {"id": rng.choice(ids)}
        else:
            body = {"source": rng.choice(ids), "target": rng.choice(ids)}
        tool = "graph_context" if target.startswith("graph_context") else target
        path = "/bare" if target == "bare" else f"/v1/kbs/{KB}/tools/{tool}"
        out.append(build_request("POST", path, HOST, port, headers, _encode(body)))
    return out


# --- the benchmark ---------------------------------------------------------------------------


async def measure(
    port: int,
    requests: Sequence[bytes],
    connections: int,
    latency_seconds: float,
    seconds: float,
) -> dict[str, Any]:
    """Warm-up, latency pass (1 connection), throughput pass (``connections``)."""
    await closed_loop(HOST, port, requests, 2, min(0.5, seconds), max_requests=500)
    lat = await closed_loop(HOST, port, requests, 1, latency_seconds, max_requests=5000)
    thr = await closed_loop(HOST, port, requests, connections, seconds)
    bad = {
        str(s): n
        for s, n in sorted({**lat.statuses, **_merge(lat.statuses, thr.statuses)}.items())
        if s != 200
    }
    return {
        "latency": {"connections": 1, **report.summary(lat.latencies, lat.elapsed)},
        "throughput": {
            "connections": connections,
            **report.summary(thr.latencies, thr.elapsed),
        },
        "non_200": bad,
        "client_errors": lat.errors + thr.errors,
    }


def _merge(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


@contextlib.asynccontextmanager
async def loaded_service(
    tmp: Path, n: int, seed: int
) -> AsyncIterator[tuple[ServiceProcess, BareProcess, Credentials, list[Any]]]:
    """A ``kbgraph serve`` holding the generated KB (every delivery acknowledged and visible),
    and a bare Starlette endpoint beside it; both stopped on exit."""
    creds = Credentials()
    service = ServiceProcess(write_config(tmp, creds), workers=1)
    bare_dir = tmp / "bare"
    bare_dir.mkdir()
    bare_proc = BareProcess(bare_dir / "none.toml", port=free_port())
    concepts = kbgen.make_kb("seed", n, seed)
    service.start()
    bare_proc.start()
    try:
        await service.wait_ready()
        await bare_proc.wait_ready()
        pool = Pool(HOST, service.port, 1)
        signer = kbgen.Signer(creds.secret)
        model, rec = Model(), Recorder()
        loaded = 0
        for delivery in kbgen.initial_load(concepts):
            if await deliver(pool, signer, delivery, model, rec, "load") is not None:
                loaded += len(delivery.events)
        # wait until the projection shows every concept
        status = await pool.request(
            "GET",
            f"/v1/kbs/{KB}/status",
            {"authorization": f"Bearer {creds.admin}", "x-min-seq": str(rec.max_seq)},
        )
        await pool.close()
        if status.status != 200 or loaded != len(concepts):
            raise RuntimeError(f"KB not loaded: {status.status} {status.body[:200]!r}")
        yield service, bare_proc, creds, concepts
    finally:
        service.stop()
        bare_proc.stop()


async def bench_async(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with loaded_service(tmp, args.n, args.seed) as (service, bare_proc, creds, concepts):
        for target in TARGETS:
            port = bare_proc.port if target == "bare" else service.port
            requests = requests_for(target, port, concepts, creds.admin, args.seed)
            results[target] = await measure(
                port, requests, args.connections, args.latency_seconds, args.seconds
            )
            print(f"  measured {target}", file=sys.stderr, flush=True)
    return figures(args, results)


def figures(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    bare_p50 = results["bare"]["latency"]["p50"] or 0.0
    ratios = {}
    for target in TARGETS[1:]:
        p50 = results[target]["latency"]["p50"]
        ratios[f"{target}_p50_over_bare"] = round(p50 / bare_p50, 2) if bare_p50 else None
    aims = {}
    for target in ("graph_context_query", "graph_context_ids"):
        ratio = ratios[f"{target}_p50_over_bare"]
        aims[f"{target}_p50_within_{P50_AIM_RATIO:g}x_bare"] = {
            "value": ratio,
            "met": bool(ratio is not None and ratio <= P50_AIM_RATIO),
        }
        rps, aim = results[target]["throughput"]["rps"], RPS_AIMS[target]
        aims[f"{target}_rps_at_least_{aim:g}"] = {"value": rps, "met": bool(rps >= aim)}
    errors = {t: r["non_200"] for t, r in results.items() if r["non_200"] or r["client_errors"]}
    return {
        "kind": "bench_api",
        "kb": f"seed-{args.n}",
        "server": "kbgraph serve, uvicorn 1 worker, uvloop + httptools",
        "client": f"raw asyncio keep-alive, latency 1 connection, throughput "
        f"{args.connections} connections",
        "cpus": os.cpu_count(),
        "targets": {
            t: {
                "p50_ms": r["latency"]["p50"],
                "p95_ms": r["latency"]["p95"],
                "p99_ms": r["latency"]["p99"],
                "rps": r["throughput"]["rps"],
                "loaded_p50_ms": r["throughput"]["p50"],
                "loaded_p99_ms": r["throughput"]["p99"],
                "requests": r["latency"]["count"] + r["throughput"]["count"],
            }
            for t, r in results.items()
        },
        "ratios": ratios,
        "aims": aims,
        "all_aims_met": all(a["met"] for a in aims.values()),
        "errors": errors,
    }


def print_table(out: dict[str, Any]) -> None:
    rows = []
    for target, row in out["targets"].items():
        ratio = out["ratios"].get(f"{target}_p50_over_bare")
        rows.append(
            [target, row["p50_ms"], row["p95_ms"], row["p99_ms"], "1.0" if target == "bare"
             else ratio, row["rps"], row["loaded_p50_ms"], row["loaded_p99_ms"]]
        )  # fmt: skip
    header = ["target", "p50 ms", "p95 ms", "p99 ms", "p50/bare", "req/s", "p50@load"]
    print(report.table(rows, [*header, "p99@load"]))
    for name, aim in out["aims"].items():
        print(f"aim {name}: {aim['value']} -> {'met' if aim['met'] else 'NOT met'}")
    if out["errors"]:
        print(f"non-200 answers or client errors: {out['errors']}")


PEER_AIM_RATIO: Final = 1.3
SIDE_TARGETS: Final = ("graph_context_query", "graph_context_ids", "search")


async def load(service: ServiceProcess, creds: Credentials, concepts: list[Any]) -> None:
    await service.wait_ready()
    pool = Pool(HOST, service.port, 1)
    signer = kbgen.Signer(creds.secret)
    model, rec = Model(), Recorder()
    for delivery in kbgen.initial_load(concepts):
        await deliver(pool, signer, delivery, model, rec, "load")
    headers = {"authorization": f"Bearer {creds.admin}", "x-min-seq": str(rec.max_seq)}
    status = await pool.request("GET", f"/v1/kbs/{KB}/status", headers)
    await pool.close()
    if status.status != 200:
        raise RuntimeError(f"KB not loaded: {status.status} {status.body[:200]!r}")


async def side_by_side(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    creds = Credentials()
    concepts = kbgen.make_kb("seed", args.n, args.seed)
    services: dict[str, ServiceProcess] = {}
    for name, section, root in (
        ("vectors_on", '[embeddings]\nprovider = "local"\n', None),
        ("vectors_off", '[embeddings]\nprovider = "none"\n', None),
        ("peer", "", args.peer),
    ):
        folder = tmp / name
        folder.mkdir()
        config = write_config(folder, creds)
        config.write_text(config.read_text() + "\n" + section)
        services[name] = ServiceProcess(config, workers=1, root=root)
    try:
        for service in services.values():
            service.start()
        for service in services.values():
            await load(service, creds, concepts)
        p50s: dict[str, dict[str, list[float]]] = {
            t: {n: [] for n in services} for t in SIDE_TARGETS
        }
        for _ in range(args.rounds):
            for target in SIDE_TARGETS:
                for name, service in services.items():
                    requests = requests_for(target, service.port, concepts, creds.admin, args.seed)
                    await closed_loop(HOST, service.port, requests, 1, 0.3, max_requests=300)
                    lat = await closed_loop(
                        HOST, service.port, requests, 1, args.latency_seconds, max_requests=5000
                    )
                    if set(lat.statuses) != {200}:
                        raise RuntimeError(f"{name} {target}: {lat.statuses}")
                    p50s[target][name].append(report.summary(lat.latencies, lat.elapsed)["p50"])
            print("  round done", file=sys.stderr, flush=True)
    finally:
        for service in services.values():
            service.stop()
    median = {t: {n: sorted(v)[len(v) // 2] for n, v in row.items()} for t, row in p50s.items()}
    ratios = {
        f"{t}_{n}_over_peer": round(median[t][n] / median[t]["peer"], 2)
        for t in SIDE_TARGETS
        for n in ("vectors_on", "vectors_off")
    }
    for t in SIDE_TARGETS:  # the same code with and without vectors: what vectors cost
        ratios[f"{t}_vectors_on_over_off"] = round(
            median[t]["vectors_on"] / median[t]["vectors_off"], 2
        )
    value = ratios["graph_context_query_vectors_on_over_peer"]
    return {
        "kind": "bench_api_side_by_side",
        "kb": f"seed-{args.n}",
        "peer": str(args.peer),
        "rounds": args.rounds,
        "p50_ms": median,
        "p50_ms_each_round": p50s,
        "ratios": ratios,
        "aims": {
            f"graph_context_query_vectors_on_p50_within_{PEER_AIM_RATIO:g}x_peer": {
                "value": value,
                "met": value <= PEER_AIM_RATIO,
            }
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_api", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=16, help="throughput pass")
    parser.add_argument("--seconds", type=float, default=4.0, help="throughput pass length")
    parser.add_argument("--latency-seconds", type=float, default=2.0, help="latency pass")
    parser.add_argument("--n", type=int, default=1000, help="concepts in the seed KB")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--peer", type=Path, help="a checkout to compare with, side by side")
    parser.add_argument("--rounds", type=int, default=3, help="side by side: rounds")
    args = parser.parse_args(argv)
    args.seconds = min(args.seconds, 15.0)  # bounded: 6 targets stay well under 3 minutes
    args.latency_seconds = min(args.latency_seconds, 5.0)
    if args.peer is not None:
        with tempfile.TemporaryDirectory(prefix="kbgraph-bench-") as tmp:
            side = run_loop(side_by_side(args, Path(tmp)))
        for target, row in side["p50_ms"].items():
            print(f"{target:22} " + "  ".join(f"{n} {v} ms" for n, v in row.items()))
        print(json.dumps(side, separators=(",", ":")))
        return 0
    with tempfile.TemporaryDirectory(prefix="kbgraph-bench-") as tmp:
        out = run_loop(bench_async(args, Path(tmp)))
    print_table(out)
    print(json.dumps(out, separators=(",", ":")))
    return 0 if not out["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())

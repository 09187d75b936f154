"""Benchmark (issue 12): graph_context over MCP beside the same call over plain HTTP.

``python -m loadtest.bench_mcp`` starts ``kbgraph serve`` (1 worker) on the seed's 1,000-concept
KB (as ``bench_api`` does) and a bare Starlette endpoint, then measures with the same raw
keep-alive client, in one run: the bare endpoint, ``POST /v1/kbs/{kb}/tools/graph_context``,
and the MCP ``tools/call`` of ``graph_context`` on ``/v1/kbs/{kb}/mcp`` (stateless JSON-RPC,
JSON answers), with the same queries. Every MCP answer must be a result that is no tool error.
Aim: MCP p50 within 1.5x of HTTP's. The LAST line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from loadtest import kbgen, report
from loadtest.bench_api import loaded_service
from loadtest.driver import run_loop
from loadtest.httpload import Response, build_request, closed_loop
from loadtest.service import HOST, KB

P50_AIM_RATIO: Final = 1.5
TARGETS: Final = ("bare", "http", "mcp")
_encode = msgspec.json.Encoder().encode


def requests_for(target: str, port: int, token: str, seed: int, count: int = 256) -> list[bytes]:
    """The same ``count`` graph_context queries, as each target takes them."""
    rng = random.Random(seed)
    queries = kbgen.queries(400, seed)
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    out = []
    for i in range(count):
        arguments = {"query": rng.choice(queries)}
        if target == "mcp":
            body = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                    "params": {"name": "graph_context", "arguments": arguments}}  # fmt: skip
            mcp_headers = {**headers, "accept": "application/json, text/event-stream",
                           "mcp-protocol-version": "2025-06-18"}  # fmt: skip
            path = f"/v1/kbs/{KB}/mcp"
            out.append(build_request("POST", path, HOST, port, mcp_headers, _encode(body)))
        else:
            path = "/bare" if target == "bare" else f"/v1/kbs/{KB}/tools/graph_context"
            out.append(build_request("POST", path, HOST, port, headers, _encode(arguments)))
    return out


def tool_result(response: Response) -> bool:
    """An MCP answer counts only as a JSON-RPC result that is not a tool error."""
    try:
        answer = msgspec.json.decode(response.body)
    except msgspec.DecodeError:
        return False
    result = answer.get("result") if isinstance(answer, dict) else None
    return isinstance(result, dict) and not result.get("isError") and "structuredContent" in result


async def measure(
    port: int, requests: Sequence[bytes], args: argparse.Namespace, check: Any
) -> dict[str, Any]:
    await closed_loop(HOST, port, requests, 2, 0.5, max_requests=500, check=check)
    lat = await closed_loop(
        HOST, port, requests, 1, args.latency_seconds, max_requests=5000, check=check
    )
    thr = await closed_loop(HOST, port, requests, args.connections, args.seconds, check=check)
    bad = {str(s): n for s, n in {**lat.statuses, **thr.statuses}.items() if s != 200}
    return {
        "latency": report.summary(lat.latencies, lat.elapsed),
        "throughput": report.summary(thr.latencies, thr.elapsed),
        "bad": bad,
        "client_errors": lat.errors + thr.errors,
    }


async def bench_async(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with loaded_service(tmp, args.n, args.seed) as (service, bare_proc, creds, _):
        for target in TARGETS:
            port = bare_proc.port if target == "bare" else service.port
            requests = requests_for(target, port, creds.admin, args.seed)
            check = tool_result if target == "mcp" else None
            results[target] = await measure(port, requests, args, check)
            print(f"  measured {target}", file=sys.stderr, flush=True)
    return figures(args, results)


def figures(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    p50 = {t: results[t]["latency"]["p50"] for t in TARGETS}
    rps = {t: results[t]["throughput"]["rps"] for t in TARGETS}
    ratio = round(p50["mcp"] / p50["http"], 2) if p50["http"] else None
    errors = {t: r["bad"] for t, r in results.items() if r["bad"] or r["client_errors"]}
    return {
        "kind": "bench_mcp",
        "kb": f"seed-{args.n}",
        "server": "kbgraph serve, uvicorn 1 worker, uvloop + httptools",
        "client": f"raw asyncio keep-alive, latency 1 connection, throughput "
        f"{args.connections} connections",
        "cpus": os.cpu_count(),
        "p50_ms": p50,
        "p99_ms": {t: results[t]["latency"]["p99"] for t in TARGETS},
        "rps": rps,
        "mcp_over_http_p50": ratio,
        "mcp_over_http_rps": round(rps["mcp"] / rps["http"], 2) if rps["http"] else None,
        "aims": {
            f"mcp_p50_within_{P50_AIM_RATIO:g}x_http": {
                "value": ratio,
                "met": bool(ratio is not None and ratio <= P50_AIM_RATIO),
            }
        },
        "errors": errors,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_mcp", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=16, help="throughput pass")
    parser.add_argument("--seconds", type=float, default=4.0, help="throughput pass length")
    parser.add_argument("--latency-seconds", type=float, default=3.0, help="latency pass")
    parser.add_argument("--n", type=int, default=1000, help="concepts in the seed KB")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kbgraph-bench-mcp-") as tmp:
        out = run_loop(bench_async(args, Path(tmp)))
    rows = [[t, out["p50_ms"][t], out["p99_ms"][t], out["rps"][t]] for t in TARGETS]
    print(report.table(rows, ["target", "p50 ms", "p99 ms", "req/s"]))
    for name, aim in out["aims"].items():
        print(f"aim {name}: {aim['value']} -> {'met' if aim['met'] else 'NOT met'}")
    print(json.dumps(out, separators=(",", ":")))
    return 0 if not out["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The explorer page's cost beside a bare endpoint's, over HTTP on one ``kbgraph serve``.

Times, with one keep-alive connection after a warm-up, the page (``GET /ui``), its script and
style, the vendored Cytoscape.js (~440 KB) and ``/healthz`` (the bare-endpoint peer on the same
server), then what a page load costs in all (the page and its four assets). Medians of many
repetitions; the last line is one JSON object.

    .venv/bin/python -m loadtest.bench_ui [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from loadtest.bench_ingest import free_port, start_server

PATHS = {
    "healthz": "/healthz",
    "page": "/ui",
    "script": "/ui/static/explorer.js",
    "style": "/ui/static/explorer.css",
    "cytoscape": "/ui/static/vendor/cytoscape.min.js",
}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_ui", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="per path")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start_server(Path(tmp), port)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                figures = {}
                for name, path in PATHS.items():
                    for _ in range(20):
                        client.get(path)
                    times, size = [], 0
                    stop_at = time.perf_counter() + args.seconds
                    while time.perf_counter() < stop_at:
                        started = time.perf_counter()
                        response = client.get(path)
                        times.append(time.perf_counter() - started)
                        assert response.status_code == 200, (path, response.status_code)
                        size = len(response.content)
                    figures[name] = {"p50_ms": round(statistics.median(times) * 1000, 3),
                                     "bytes": size, "reps": len(times)}  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
    bare = figures["healthz"]["p50_ms"]
    load = sum(figures[name]["p50_ms"] for name in PATHS if name != "healthz")
    for name, row in figures.items():
        print(f"{name:10s} p50 {row['p50_ms']:8.3f} ms  {row['bytes']:8d} bytes  x{row['reps']}")
    report = {
        "kind": "bench_ui",
        "paths": figures,
        "page_over_bare": round(figures["page"]["p50_ms"] / bare, 2),
        "page_load_ms": round(load, 3),
        "page_load_bytes": sum(figures[n]["bytes"] for n in PATHS if n != "healthz"),
    }
    print(json.dumps(report, separators=(",", ":")))


if __name__ == "__main__":
    main()

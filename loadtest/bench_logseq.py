"""A Logseq graph read two ways: as a folder of markdown notes (what ``kbgraph import`` did
before it knew Logseq) and as a Logseq graph (issue 39), with what resolved each reference.

The graph is any Logseq graph folder, e.g. the Logseq documentation graph (github logseq/docs:
its ``pages/``, ``journals/`` and ``logseq/config.edn``). Nothing is sent anywhere: the figures
are the readers' own (notes, links between them, references by rule) and their wall times.
The last line printed is one JSON object.

    .venv/bin/python -m loadtest.bench_logseq --graph DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kbgraph.sources.logseq.reader import read_graph
from kbgraph.sources.vault.reader import read_vault


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_logseq", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--graph", required=True, type=Path, help="a Logseq graph folder")
    args = parser.parse_args()
    started = time.perf_counter()
    as_vault = read_vault(args.graph / "pages", workers=1)
    vault_s = time.perf_counter() - started
    started = time.perf_counter()
    as_graph = read_graph(args.graph)
    graph_s = time.perf_counter() - started
    result = {
        "as_vault_pages": {
            "notes": len(as_vault.notes),
            "links": as_vault.links,
            "unresolved": as_vault.unresolved,
            "seconds": round(vault_s, 2),
        },
        "as_logseq_graph": {
            "notes": len(as_graph.notes),
            "links": as_graph.links,
            "resolved_by": as_graph.resolved_by,
            "skipped": len(as_graph.skipped),
            "seconds": round(graph_s, 2),
        },
    }
    print(f"as a vault (pages/ only): {result['as_vault_pages']}")
    print(f"as a Logseq graph: {result['as_logseq_graph']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

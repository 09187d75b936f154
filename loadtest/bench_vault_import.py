"""Vault import side by side: this checkout against a peer checkout, on one generated vault.

A vault of ``--notes`` notes is generated once (``bench_vault``'s generator); then, alternating
peer / this ``--rounds`` times, a fresh process of each checkout (its own ``.venv``) imports it
into a fresh local store (``sync_once`` with a ``LocalSink``, WAL + ``synchronous=FULL``):
wall seconds and the CPU seconds of the process and its children (the parse workers). Both
stores must hold the same concepts: their states are compared. The last line is one JSON
object with the medians, this over peer, and the aim of issue 26 (100k notes in <= 30 s).

    .venv/bin/python -m loadtest.bench_vault_import [--notes 100000] --peer CHECKOUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.report import child_json

ROOT = Path(__file__).resolve().parent.parent
AIM_S_PER_100K = 30.0

CHILD = """
import hashlib, json, resource, sys, time
from pathlib import Path
import kbgraph
from kbgraph.store import Store
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import LocalSink
from kbgraph.sources.sync import sync_once
vault, work = Path(sys.argv[1]), Path(sys.argv[2])
sink = LocalSink(work / "kb.db")
with Manifest(work / "kb.manifest") as manifest:
    wall = time.perf_counter()
    report = sync_once(vault, "kb", sink, manifest)
    wall = time.perf_counter() - wall
sink.close()
usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
with Store(work / "kb.db") as store:
    state = store.load().kbs["kb"].concepts
digest = hashlib.sha256(repr([(c.id, c.title, c.text, c.links, c.tags) for c in state]).encode())
print(json.dumps({"import_s": wall, "cpu_s": sum(u.ru_utime + u.ru_stime for u in usage),
                  "notes": len(state), "state_sha256": digest.hexdigest(),
                  "code": str(Path(kbgraph.__file__).resolve())}))
"""


def run(checkout: Path, vault: Path) -> dict[str, Any]:
    """One import by ``checkout``'s code: its own ``.venv``, else this interpreter run in the
    checkout (``-c`` puts the working folder first on ``sys.path``, the workers inherit it)."""
    venv = checkout / ".venv/bin/python"
    python = str(venv) if venv.exists() else sys.executable
    with tempfile.TemporaryDirectory(prefix="kbgraph-vault-") as work:
        result = child_json([python, "-c", CHILD, str(vault), work], checkout)
    if not Path(result.pop("code")).is_relative_to(checkout.resolve()):
        raise SystemExit(f"{checkout}: the import ran other code than the checkout's")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_vault_import", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--notes", type=int, default=100_000)
    parser.add_argument(
        "--peer", type=Path, required=True, help="a checkout to compare with (with its .venv)"
    )
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    from loadtest.bench_vault import generate

    runs: dict[str, list[dict[str, Any]]] = {"peer": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="kbgraph-vault-src-") as tmp:
        vault = Path(tmp) / "vault"
        generate(vault, args.notes)
        for _ in range(args.rounds):
            for name, checkout in (("peer", args.peer), ("this", ROOT)):
                start = time.perf_counter()
                runs[name].append(run(checkout, vault))
                print(name, json.dumps(runs[name][-1]), f"({time.perf_counter() - start:.1f} s)")
    same = {r["state_sha256"] for rs in runs.values() for r in rs}
    med = {
        name: {k: round(statistics.median(r[k] for r in rs), 2) for k in ("import_s", "cpu_s")}
        for name, rs in runs.items()
    }
    aim = AIM_S_PER_100K * args.notes / 100_000
    print(f"{'':8}{'import s':>10}{'CPU s':>10}")
    for name in ("peer", "this"):
        print(f"{name:8}{med[name]['import_s']:>10}{med[name]['cpu_s']:>10}")
    print(
        json.dumps(
            {
                "notes": args.notes,
                "peer": med["peer"],
                "this": med["this"],
                "this_over_peer": round(med["this"]["import_s"] / med["peer"]["import_s"], 3),
                "same_state": len(same) == 1,
                "rounds": args.rounds,
                "aims": {"import_s": aim},
                "met": {"import_s": med["this"]["import_s"] <= aim, "same_state": len(same) == 1},
            }
        )
    )


if __name__ == "__main__":
    main()

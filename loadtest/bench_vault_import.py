"""Vault import side by side: this checkout against a peer checkout, on one generated vault.

A vault of ``--notes`` notes is generated once (``bench_vault``'s generator); then, alternating
peer / this ``--rounds`` times, a fresh process of each checkout (its own ``.venv``) imports it
into a fresh local store opened as ``kbgraph import --config`` opens it (``open_store``: WAL +
``synchronous=FULL``; with ``--embeddings local``, the default when the model is installed, the
store makes each note's vector): wall seconds and the CPU seconds of the process and its
children (the parse workers). Both stores must hold the same concepts (``same_state``) and the
same log analyses and vector rows (``same_store``). ``--stages N``: each checkout's CPU per note
of each stage on the first N notes, one process (walk, read, parse, resolve and state hash,
event build, the store's append without and with the model, after a first pass into scratch
stores whose once-a-process costs, the model's ~0.5 s of kernel loading among them, are
``first_pass_extra_s``; where the checkout has them, the parse workers' making of the store's
analyses, ``make_ahead``, and the store's append with the model taking them,
``store_append_ahead``). The last line is one JSON object with the medians, this over peer, the
stages, and the aim of issue 47 (100k notes in <= 20 s).

    .venv/bin/python -m loadtest.bench_vault_import [--notes 100000] --peer CHECKOUT [--stages 5000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest import ROOT
from loadtest.report import checkout_python, child_json

AIM_S_PER_100K = 20.0

CHILD = """
import hashlib, json, resource, sqlite3, sys, time
from pathlib import Path
import kbgraph
from kbgraph.config import Config, EmbeddingsConfig, StoreConfig
from kbgraph.store import Store
from kbgraph.store.opening import open_store
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import LocalSink
from kbgraph.sources.sync import sync_once
vault, work, provider = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if sys.argv[4]:  # --ahead-min-cores, where the checkout makes the analyses in its workers
    try:
        from kbgraph.sources.vault import ahead
        ahead.AHEAD_MIN_CORES = int(sys.argv[4])
    except ImportError:
        pass
config = Config(StoreConfig(str(work / "kb.db")), EmbeddingsConfig(provider))
sink = LocalSink(open_store(config))
with Manifest(work / "kb.manifest") as manifest:
    wall = time.perf_counter()
    report = sync_once(vault, "kb", sink, manifest)
    wall = time.perf_counter() - wall
sink.close()
usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
with Store(work / "kb.db") as store:
    state = store.load().kbs["kb"].concepts
digest = hashlib.sha256(repr([(c.id, c.title, c.text, c.links, c.tags) for c in state]).encode())
# the log's analyses and the vector rows: what the store made of the notes (not the events,
# whose versions and ids come from the clock)
conn = sqlite3.connect(work / "kb.db")
made = hashlib.sha256(repr([
    conn.execute("SELECT seq, analysis FROM log ORDER BY gid").fetchall(),
    conn.execute("SELECT kb, concept, model, text_hash, vec, problem FROM vector"
                 " ORDER BY kb, model, concept").fetchall(),
]).encode())
conn.close()
print(json.dumps({"import_s": wall, "cpu_s": sum(u.ru_utime + u.ru_stime for u in usage),
                  "main_cpu_s": usage[0].ru_utime + usage[0].ru_stime,
                  "notes": len(state), "state_sha256": digest.hexdigest(),
                  "store_sha256": made.hexdigest(),
                  "code": str(Path(kbgraph.__file__).resolve())}))
"""

# each stage of one note's way alone, one process, public functions only: CPU seconds
STAGES = """
import hashlib, json, os, sys, time
from pathlib import Path
import kbgraph
from kbgraph.config import Config, EmbeddingsConfig, StoreConfig
from kbgraph.store.opening import open_store
from kbgraph.sources.sync import upsert_event
from kbgraph.sources.vault.notes import PARSER_VERSION, ReadContext, read_chunk
from kbgraph.sources.vault.reader import MAX_NOTE_BYTES, VaultScan, note_fields, read_note
from kbgraph.sources.vault.resolve import Resolver
vault, work, limit = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
cpu, took = time.process_time, {}
start = cpu(); scan = VaultScan.of(vault); took["walk"] = cpu() - start
order = sorted(scan.ids.items())[:limit]
real = os.path.realpath(vault)
start = cpu()
raws = [read_note(vault, real, path, MAX_NOTE_BYTES) for _, path in order]
took["read"] = cpu() - start
texts = [raw.decode() for raw in raws]
start = cpu(); fields = [note_fields(text) for text in texts]; took["parse"] = cpu() - start
cache = {hashlib.sha256(PARSER_VERSION + raw).hexdigest(): f for raw, f in zip(raws, fields)}
context = ReadContext(vault, real, Resolver(list(scan.ids), scan.files), cache)
start = cpu()
reads = read_chunk(context, [(i, nid, path) for i, (nid, path) in enumerate(order)])
took["resolve_and_hash"] = cpu() - start - took["read"]  # the notes read again, parsed never
start = cpu()
events = [upsert_event("kb", read.state, i + 1) for i, read in enumerate(reads)]
took["event_build"] = cpu() - start
def appended(path, provider):
    store = open_store(Config(StoreConfig(str(path)), EmbeddingsConfig(provider)))
    start = cpu()
    for first in range(0, len(events), 500):
        store.append("kb", events[first : first + 500])
    store.close()
    return cpu() - start
# a first pass into scratch stores pays what a process pays once (modules, kernels: the model's
# ~0.5 s), reported apart; the timed pass's fresh stores start with the model's word cache empty
appends = (("store_append", "none"), ("store_append_model", "local"))
once = {name: appended(work / f"first-{name}.db", provider) for name, provider in appends}
for name, provider in appends:
    took[name] = appended(work / f"{name}.db", provider)
try:  # the analyses made ahead by the parse workers (kbgraph.sources.vault.ahead), if any
    from kbgraph.sources.vault.ahead import Ahead, Maker
    from kbgraph.store import MadeAhead
except ImportError:
    Maker = None
if Maker is not None:
    store = open_store(Config(StoreConfig(str(work / "key.db")), EmbeddingsConfig("local")))
    key, cut = store.carrier.key, store.carrier.max_chars
    store.close()
    states = [read.state for read in reads]
    maker, made = Maker(Ahead(key, cut, [], len(states))), []
    maker.made(states[:1])  # its model loaded, apart
    start = cpu()
    for first in range(0, len(states), 128):  # a worker's chunk
        made += maker.made(states[first : first + 128])
    took["make_ahead"] = cpu() - start
    ahead = [MadeAhead(key, *one) for one in made]
    store = open_store(Config(StoreConfig(str(work / "ahead.db")), EmbeddingsConfig("local")))
    start = cpu()
    for first in range(0, len(events), 500):
        store.append("kb", events[first : first + 500], ahead=ahead[first : first + 500])
    store.close()
    took["store_append_ahead"] = cpu() - start
took["walk"] *= len(order) / len(scan.ids)  # the walk is of the whole vault
print(json.dumps({k: round(v / len(order) * 1e6, 1) for k, v in took.items()}
                 | {"first_pass_extra_s": {k: round(v - took[k], 2) for k, v in once.items()},
                    "code": str(Path(kbgraph.__file__).resolve())}))
"""


def _checked(checkout: Path, result: dict[str, Any]) -> dict[str, Any]:
    if not Path(result.pop("code")).is_relative_to(checkout.resolve()):
        raise SystemExit(f"{checkout}: the import ran other code than the checkout's")
    return result


def run(checkout: Path, vault: Path, provider: str, min_cores: int | None) -> dict[str, Any]:
    """One import by ``checkout``'s code into a fresh store."""
    with tempfile.TemporaryDirectory(prefix="kbgraph-vault-") as work:
        cores = "" if min_cores is None else str(min_cores)
        command = [checkout_python(checkout), "-c", CHILD, str(vault), work, provider, cores]
        return _checked(checkout, child_json(command, checkout))


def stages(checkout: Path, vault: Path, notes: int) -> dict[str, Any]:
    """µs of CPU per note of each stage, on the first ``notes`` notes, by ``checkout``'s code."""
    with tempfile.TemporaryDirectory(prefix="kbgraph-vault-") as work:
        command = [checkout_python(checkout), "-c", STAGES, str(vault), work, str(notes)]
        return _checked(checkout, child_json(command, checkout))


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_vault_import", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--notes", type=int, default=100_000)
    parser.add_argument(
        "--peer", type=Path, required=True, help="a checkout to compare with (with its .venv)"
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--vault", type=Path, help="the generated vault, kept for other runs (made if missing)"
    )
    parser.add_argument(
        "--embeddings",
        choices=("local", "none"),
        default="local",
        help="the store's provider: local makes each note's vector (as the default config)",
    )
    parser.add_argument(
        "--ahead-min-cores",
        type=int,
        metavar="N",
        help="the cores from which the parse workers make the store's analyses"
        " (kbgraph.sources.vault.ahead; default: the code's): 2 shows it on a 2-core machine",
    )
    parser.add_argument(
        "--stages", type=int, default=0, metavar="N", help="CPU per stage on N notes (0: none)"
    )
    args = parser.parse_args()
    from loadtest.bench_vault import generate

    runs: dict[str, list[dict[str, Any]]] = {"peer": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="kbgraph-vault-src-") as tmp:
        vault = args.vault or Path(tmp) / "vault"
        if not vault.exists():
            generate(vault, args.notes)
        for _ in range(args.rounds):
            for name, checkout in (("peer", args.peer), ("this", ROOT)):
                start = time.perf_counter()
                runs[name].append(run(checkout, vault, args.embeddings, args.ahead_min_cores))
                print(name, json.dumps(runs[name][-1]), f"({time.perf_counter() - start:.1f} s)")
        per_stage = {
            name: stages(checkout, vault, args.stages)
            for name, checkout in (("peer", args.peer), ("this", ROOT))
            if args.stages
        }
    for name, figures in per_stage.items():
        print(f"{name} µs of CPU per note:", json.dumps(figures))
    same = {r["state_sha256"] for rs in runs.values() for r in rs}
    same_store = len({r["store_sha256"] for rs in runs.values() for r in rs}) == 1
    med = {
        name: {
            k: round(statistics.median(r[k] for r in rs), 2)
            for k in ("import_s", "cpu_s", "main_cpu_s")
        }
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
                "cpu_this_over_peer": round(med["this"]["cpu_s"] / med["peer"]["cpu_s"], 3),
                "main_cpu_this_over_peer": round(
                    med["this"]["main_cpu_s"] / med["peer"]["main_cpu_s"], 3
                ),
                "ahead_min_cores": args.ahead_min_cores,
                "same_state": len(same) == 1,
                "same_store": same_store,
                "rounds": args.rounds,
                "embeddings": args.embeddings,
                "stages_us_per_note": per_stage,
                "aims": {"import_s": aim},
                "met": {
                    "import_s": med["this"]["import_s"] <= aim,
                    "same_state": len(same) == 1,
                    "same_store": same_store,
                },
            }
        )
    )


if __name__ == "__main__":
    main()

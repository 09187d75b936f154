"""Vault import and sync speed: the example vault and a generated 10,000-note vault.

For each vault, into a fresh local store (WAL, synchronous=FULL) through ``Store.append``:

1. ``import``: read, parse, resolve and send every note (notes/s);
2. a no-change re-sync (read and parse everything, send nothing);
3. the parsing share: reading the vault alone (``read_vault``), and appending the very same
   notes as prebuilt events into another fresh store (what an import costs without parsing).

Wall times on a shared machine swing with its load; CPU seconds of this process (the store's
writer thread included, fsync waits not) are reported beside them and are the steadier figure.

No peer importer is run side by side: the candidates on PyPI (obsidiantools and the like)
pull pandas, lxml and more, too heavy for this shared machine; the prebuilt-events run is the
comparison. Then the save -> visible latency of ``sync --watch`` for a few single-note edits.
The last line printed is one JSON object.

    .venv/bin/python -m loadtest.bench_vault [--notes 10000] [--edits 10]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kbgraph.events import Event
from kbgraph.sources.demokb import example_vault
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import LocalSink
from kbgraph.sources.sync import SOURCE, sync_once, upsert_event, watch
from kbgraph.sources.vault.reader import read_vault
from kbgraph.store import Store

WORDS = ["dns", "backup", "router", "vpn", "disk", "proxy", "mail", "firewall", "cluster",
         "restore", "snapshot", "pool", "vlan", "switch", "cert", "update", "power", "battery",
         "photo", "sync"]  # fmt: skip
FOLDERS = ("infra", "network", "services", "runbooks", "household", "journal", "infra/storage")


def generate(root: Path, n: int, seed: int = 7) -> None:
    """``n`` notes in 7 folders, ~8 wikilinks each (by name, by path, labelled, to headings,
    some unresolved), front matter, inline tags, a code block with link-like text."""
    rng = random.Random(seed)
    names = [f"{FOLDERS[i % len(FOLDERS)]}/{rng.choice(WORDS).title()} note {i}" for i in range(n)]
    for i, name in enumerate(names):
        links = []
        for _ in range(8):
            target = names[rng.randrange(n)]
            form = rng.random()
            if form < 0.5:
                links.append(f"[[{target.rsplit('/', 1)[-1]}]]")
            elif form < 0.7:
                links.append(f"[[{target}|see this]]")
            elif form < 0.85:
                links.append(f"[[{target.rsplit('/', 1)[-1]}#Steps]]")
            elif form < 0.95:
                links.append(f"[[Missing {rng.randrange(n // 10 + 1)}]]")
            else:
                links.append("![[diagram.png]]")
        prose = " ".join(rng.choice(WORDS) for _ in range(120))
        body = (
            f"---\ntitle: {name.rsplit('/', 1)[-1]}\naliases: [alias {i}]\n"
            f"tags: [{rng.choice(WORDS)}]\nstatus: active\n---\n"
            f"# {name}\n\n{prose} #{rng.choice(WORDS)}\n\n## Steps\n\n"
            f"1. {' '.join(links[:4])}\n2. {' '.join(links[4:])}\n\n"
            "```bash\n# not a heading [[not a link]]\nzfs list\n```\n"
        )
        path = root / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")


def measure(vault: Path, work: Path, label: str) -> dict[str, Any]:
    sink = LocalSink(work / f"{label}.db")
    try:
        with Manifest(work / f"{label}.manifest") as manifest:
            start, cpu = time.perf_counter(), time.process_time()
            report = sync_once(vault, "kb", sink, manifest)
            imported, imported_cpu = time.perf_counter() - start, time.process_time() - cpu
            start, cpu = time.perf_counter(), time.process_time()
            again = sync_once(vault, "kb", sink, manifest)
            resync, resync_cpu = time.perf_counter() - start, time.process_time() - cpu
            assert again.upserted == 0 and again.deleted == 0
    finally:
        sink.close()
    notes = len(report.read.notes)
    start, cpu = time.perf_counter(), time.process_time()
    read = read_vault(vault)
    reading, reading_cpu = time.perf_counter() - start, time.process_time() - cpu
    events: list[Event] = [
        upsert_event("kb", note, i + 1) for i, note in enumerate(read.notes.values())
    ]
    assert all(event.source == SOURCE for event in events)
    with Store(work / f"{label}-prebuilt.db") as store:
        start, cpu = time.perf_counter(), time.process_time()
        for first in range(0, len(events), 500):
            store.append("kb", events[first : first + 500])
        prebuilt, prebuilt_cpu = time.perf_counter() - start, time.process_time() - cpu
    figures = {
        "notes": notes,
        "links": report.read.links,
        "import_s": round(imported, 3),
        "import_cpu_s": round(imported_cpu, 3),
        "notes_per_s": round(notes / imported),
        "notes_per_cpu_s": round(notes / imported_cpu),
        "resync_no_change_s": round(resync, 3),
        "resync_no_change_cpu_s": round(resync_cpu, 3),
        "read_parse_resolve_cpu_s": round(reading_cpu, 3),
        "prebuilt_events_append_s": round(prebuilt, 3),
        "prebuilt_events_append_cpu_s": round(prebuilt_cpu, 3),
        "parse_share_cpu": round(reading_cpu / imported_cpu, 2),
    }
    print(f"{label:>8}: {notes:,} notes imported in {imported:.2f} s, {imported_cpu:.2f} s CPU"
          f" ({figures['notes_per_s']:,} notes/s); no-change re-sync {resync:.2f} s"
          f" ({resync_cpu:.2f} s CPU); reading+parsing alone {reading:.2f} s ({reading_cpu:.2f} s"
          f" CPU); the same notes as prebuilt events {prebuilt:.2f} s"
          f" ({prebuilt_cpu:.2f} s CPU)")  # fmt: skip
    return figures


def watch_latency(work: Path, edits: int) -> dict[str, Any]:
    vault = work / "watched"
    generate(vault, 50, seed=3)
    target = next(vault.rglob("*.md"))
    nid = target.relative_to(vault).as_posix()[:-3]
    sink = LocalSink(work / "watched.db")
    stop = threading.Event()
    samples: list[float] = []
    with Manifest(work / "watched.manifest") as manifest:
        sync_once(vault, "kb", sink, manifest)
        thread = threading.Thread(
            target=watch,
            args=(vault, lambda: sync_once(vault, "kb", sink, manifest), print, stop),
        )
        thread.start()
        time.sleep(1.0)  # the watcher is up
        try:
            with Store(work / "watched.db") as reader:
                for i in range(edits):
                    marker = f"edit number {i}"
                    start = time.perf_counter()
                    target.write_text(f"# edited\n{marker}\n", encoding="utf-8")
                    deadline = start + 30
                    while time.perf_counter() < deadline:
                        concepts = {c.id: c for c in reader.load().kbs["kb"].concepts}
                        if marker in concepts[nid].text:
                            break
                        time.sleep(0.01)
                    samples.append(time.perf_counter() - start)
                    time.sleep(0.3)
        finally:
            stop.set()
            thread.join(30)
            sink.close()
    samples.sort()
    p50 = samples[len(samples) // 2]
    print(
        f"   watch: save -> in the store, {edits} edits: p50 {p50 * 1000:.0f} ms,"
        f" max {samples[-1] * 1000:.0f} ms (debounce step 100 ms)"
    )
    return {"edits": edits, "p50_ms": round(p50 * 1000), "max_ms": round(samples[-1] * 1000)}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_vault", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--notes", type=int, default=10_000)
    parser.add_argument("--edits", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        example = measure(example_vault(), work, "example")
        generated_root = work / "generated"
        generate(generated_root, args.notes)
        generated = measure(generated_root, work, "generated")
        latency = watch_latency(work, args.edits)
    print(json.dumps({"example": example, "generated": generated, "watch": latency}))


if __name__ == "__main__":
    main()

"""Timing that hidden concepts leave (issue 28, Low 9): does an answer's time tell a narrowed
token what it may not see?

``python -m loadtest.bench_hidden_timing`` builds one KB in-process (the app through
Starlette's TestClient, no sockets: less noise) where 60,000 concepts hidden from the narrowed
token hold the word "zymurgy", and a visible concept has 10,000 hidden out-links, then times,
alternating request by request (so load on the machine hits both sides alike):

- ``search`` for "zymurgy" (held by the hidden concepts only) against an absent word: both
  answer the same empty body;
- ``link_suggest`` on the concept with 10,000 hidden out-links against a concept with none.

Prints the medians and differences; the LAST line is one JSON object. The aim is only to
report (the contract asks that the difference be measured and kept small where cheap).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from kbgraph.api import create_app
from kbgraph.config import load_config
from kbgraph.events import ConceptUpserted, Event, UpsertData
from kbgraph.store import Store
from loadtest.service import KB, Credentials, write_config


def upsert(cid: str, text: str = "", links: Sequence[str] = ()) -> Event:
    return ConceptUpserted(
        specversion="1.0", id=f"ev-{cid}", source="timing", subject=cid,
        data=UpsertData(version=1, title=cid.rsplit("/", 1)[-1], text=text, links=list(links)),
    )  # fmt: skip


def build(store: Store, hidden: int, out_links: int) -> int:
    """The KB: ``hidden`` concepts under ``secret/`` (hidden from the agent) with the word,
    visible ``infra/`` concepts, ``infra/hub`` linking to ``out_links`` hidden ones."""
    seq = 0
    batch: list[Event] = []
    for i in range(hidden):
        batch.append(upsert(f"secret/s{i}", f"zymurgy notes {i}"))
        if len(batch) == 5000:
            seq = store.append(KB, batch).seq
            batch = []
    visible = [upsert(f"infra/v{i}", f"dns backup router {i}") for i in range(200)]
    hub_links = [f"secret/s{i}" for i in range(out_links)] + ["infra/v1"]
    visible.append(upsert("infra/hub", "dns hub", hub_links))
    visible.append(upsert("infra/plain", "dns plain", ["infra/v1"]))
    return store.append(KB, batch + visible).seq or seq


def alternate(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            started = time.perf_counter()
            response = call()
            times[name].append(time.perf_counter() - started)
            assert response.status_code == 200, response.text
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_hidden_timing", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--hidden", type=int, default=60_000)
    parser.add_argument("--out-links", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args(argv)
    creds = Credentials()
    with tempfile.TemporaryDirectory(prefix="kbgraph-timing-") as tmp:
        config = write_config(Path(tmp), creds)
        with Store(Path(tmp) / "kbgraph.db") as store:
            seq = build(store, args.hidden, args.out_links)
        with TestClient(create_app(load_config(config))) as client:
            auth = {"Authorization": f"Bearer {creds.agent}"}
            client.get(f"/v1/kbs/{KB}/status", headers={**auth, "X-Min-Seq": str(seq)})

            def search(word: str) -> Callable[[], Any]:
                return lambda: client.get(f"/v1/kbs/{KB}/search", params={"q": word},
                                          headers=auth)  # fmt: skip

            def suggest(cid: str) -> Callable[[], Any]:
                return lambda: client.post(f"/v1/kbs/{KB}/tools/link_suggest",
                                           json={"id": cid}, headers=auth)  # fmt: skip

            assert search("zymurgy")().json()["hits"] == search("qqabsent")().json()["hits"] == []
            times = alternate(
                {
                    "search_hidden_word": search("zymurgy"),
                    "search_absent_word": search("qqabsent"),
                    "suggest_hidden_out_links": suggest("infra/hub"),
                    "suggest_no_hidden_links": suggest("infra/plain"),
                },
                args.rounds,
            )
    medians = {name: round(statistics.median(t) * 1000, 3) for name, t in times.items()}
    for name, ms in medians.items():
        print(f"{name:26s} median {ms:8.3f} ms", file=sys.stderr)
    out = {
        "kind": "hidden_timing",
        "hidden_concepts": args.hidden,
        "hidden_out_links": args.out_links,
        "rounds": args.rounds,
        "median_ms": medians,
        "search_difference_ms": round(
            medians["search_hidden_word"] - medians["search_absent_word"], 3
        ),
        "suggest_difference_ms": round(
            medians["suggest_hidden_out_links"] - medians["suggest_no_hidden_links"], 3
        ),
    }
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

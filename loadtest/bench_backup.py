"""Backup benchmark: ``kbgraph backup`` of a large store while the service takes writes.

A store is filled with the synthetic KB of ``bench_projection`` (``--concepts``, default
100,000; KB ``bench``) and served by a real ``kbgraph serve``. Writers then send signed
deliveries to a second KB (``live``) without pause while ``kbgraph backup --config FILE DEST``
runs (a subprocess, as an operator would). Measured: the command's wall time and the
deliveries the service acknowledged meanwhile. Then the copy is served by a second
``kbgraph serve`` and compared with the original:

- KB ``bench`` (not written after the fill): graph_context and search answers, byte for byte,
  at the same seq on the original and on the copy;
- KB ``live`` (written during the backup): the copy's log is the original's, record for
  record, up to the copy's end, and ends on a whole delivery (the copy is one commit's state).

The last line is one JSON object with the figures and the aim of issue 25 (a backup of a
100k-concept store under writes in <= 10 s; the served copy gives the same bytes), met
true/false.

    .venv/bin/python -m loadtest.bench_backup [--concepts 100000] [--writers 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from kbgraph.store import Store
from loadtest import ROOT
from loadtest.bench_ingest import ADMIN, SECRET, free_port, start_server, stop_server
from loadtest.bench_projection import cid
from loadtest.bench_restart import KB, fill
from tests import webhook_client as wc

LIVE = "live"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
AIMS = {"backup_s": 10.0}


class Writers:
    """``count`` threads sending 10-event deliveries to KB ``live`` back to back."""

    def __init__(self, port: int, count: int) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/kbs/{LIVE}/events"
        self.acked = 0
        self.failed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(n,)) for n in range(count)]

    def _run(self, n: int) -> None:
        i = 0
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                events = [
                    wc.upsert(f"w{n}/c{i * 10 + k}", text=f"live {i}", links=[f"w{n}/c{i * 10}"])
                    for k in range(10)
                ]
                body, headers = wc.delivery(SECRET, events)
                status = client.post(self.url, content=body, headers=headers).status_code
                with self._lock:
                    if status == 200:
                        self.acked += 1
                    else:
                        self.failed += 1
                i += 1

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def answers(port: int, kb: str, seq: int, concepts: int) -> list[bytes]:
    enc = msgspec.json.encode
    url = f"http://127.0.0.1:{port}/v1/kbs/{kb}"
    out = []
    with httpx.Client(timeout=60, headers={**AUTH, "X-Min-Seq": str(seq)}) as client:
        for i in range(0, concepts, max(1, concepts // 8)):
            body = enc({"ids": [cid(i)], "limit": 10})
            out.append(client.post(f"{url}/tools/graph_context", content=body))
        for q in ("dns backup", "router cluster", "vpn"):
            out.append(client.post(f"{url}/tools/graph_context", content=enc({"query": q})))
            out.append(client.get(f"{url}/search", params={"q": q, "limit": 20}))
    for response in out:
        if response.status_code != 200 or response.headers["X-KB-Seq"] != str(seq):
            raise SystemExit(f"{response.status_code} at seq {seq}: {response.text[:200]}")
    return [response.content for response in out]


def log_rows(path: Path, kb: str, up_to_gid: int) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT gid, seq, event, last_in_delivery FROM log WHERE kb = ? AND gid <= ?"
            " ORDER BY gid",
            (kb, up_to_gid),
        ).fetchall()
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_backup", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--concepts", type=int, default=100_000)
    parser.add_argument("--writers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kbgraph-bench-backup-") as tmp:
        folder = Path(tmp) / "original"
        folder.mkdir()
        with Store(folder / "bench.db") as store:
            fill_s = fill(store, args.concepts)
        port = free_port()
        proc = start_server(folder, port)  # writes folder/kbgraph.toml
        try:
            writers = Writers(port, args.writers)
            writers.start()
            time.sleep(1.0)  # writes flowing before the backup starts
            acked_before = writers.acked
            dest = Path(tmp) / "copy.db"
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "kbgraph", "backup", "--config",
                 str(folder / "kbgraph.toml"), str(dest)],
                capture_output=True, text=True, cwd=ROOT,
            )  # fmt: skip
            backup_s = time.perf_counter() - start
            acked_during = writers.acked - acked_before
            time.sleep(0.5)
            writers.stop()
            if done.returncode != 0:
                raise SystemExit(f"kbgraph backup failed: {done.stderr}")
            original = answers(port, KB, args.concepts, args.concepts)
        finally:
            stop_server(proc)
        copy_folder = Path(tmp) / "copy"
        copy_folder.mkdir()
        shutil.move(dest, copy_folder / "bench.db")
        conn = sqlite3.connect(copy_folder / "bench.db")
        copy_gid, live_seq, live_whole = conn.execute(
            "SELECT (SELECT max(gid) FROM log), (SELECT seq FROM kb WHERE name = ?),"
            " (SELECT last_in_delivery FROM log WHERE kb = ? ORDER BY gid DESC LIMIT 1)",
            (LIVE, LIVE),
        ).fetchone()
        conn.close()
        same_log = log_rows(copy_folder / "bench.db", LIVE, copy_gid) == log_rows(
            folder / "bench.db", LIVE, copy_gid
        )
        copy_port = free_port()
        proc = start_server(copy_folder, copy_port)
        try:
            served = answers(copy_port, KB, args.concepts, args.concepts)
        finally:
            stop_server(proc)
    same_bytes = served == original and same_log and live_whole == 1
    report: dict[str, Any] = {
        "bench": "backup",
        "concepts": args.concepts,
        "fill_s": round(fill_s, 1),
        "store_mb": round(done_bytes(done.stdout) / 1e6, 1),
        "backup_s": round(backup_s, 2),
        "writers": args.writers,
        "deliveries_acked_during_backup": acked_during,
        "write_failures": writers.failed,
        "copy_live_seq": live_seq,
        "answers_compared": len(original),
        "same_bytes": same_bytes,
        "aims": AIMS,
        "met": {"backup_s": backup_s <= AIMS["backup_s"], "same_bytes": same_bytes},
    }
    print(f"kbgraph backup said: {done.stdout.strip()}")
    print(json.dumps(report))


def done_bytes(stdout: str) -> int:
    """The copy's size from the command's line ("...: 12,345 bytes, ...")."""
    for part in stdout.split(":"):
        words = part.strip().split(" ")
        if len(words) > 1 and words[1].rstrip(",") == "bytes":
            return int(words[0].replace(",", ""))
    return 0


if __name__ == "__main__":
    main()

"""A real ``kbgraph serve`` killed with SIGKILL mid-stream loses no acknowledged delivery.

Several clients send signed deliveries concurrently; the server is killed while they are in
flight. Afterwards every delivery that got a 200 is in the store, every delivery is there
whole or not at all, the log is gapless, and a restarted server answers an acknowledged
delivery sent again as duplicates.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from kbgraph.store import Store
from tests import webhook_client as wc
from tests.support import ADMIN, SECRET, bearer, served_config, start_server, stop

pytestmark = pytest.mark.slow


def test_sigkill_loses_no_acknowledged_delivery(tmp_path: Path) -> None:
    config = served_config(tmp_path)
    proc = start_server(config)
    url = f"{proc.url}/v1/kbs/crash/events"
    sent: list[list[dict]] = []  # every delivery attempted
    acked: list[list[dict]] = []  # deliveries answered 200
    lock = threading.Lock()
    stop_clients = threading.Event()

    def client(n: int) -> None:
        with httpx.Client(timeout=10) as http:
            i = 0
            while not stop_clients.is_set():
                events = [
                    wc.upsert(f"c{n}/d{i}/e{j}", 1, text=f"client {n} delivery {i}")
                    for j in range(1 + (i % 4))
                ]
                body, headers = wc.delivery(SECRET, events)
                with lock:
                    sent.append(events)
                try:
                    response = http.post(url, content=body, headers=headers)
                except httpx.HTTPError:
                    return  # the server is gone
                if response.status_code == 200:
                    with lock:
                        acked.append(events)
                i += 1

    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(acked) < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: clients are still sending
        proc.wait(30)
        stop_clients.set()
        for t in threads:
            t.join(30)
    finally:
        stop_clients.set()
        stop(proc)
    assert len(acked) >= 50, "too few deliveries acknowledged before the kill"
    print(f"sent {len(sent)}, acknowledged {len(acked)}")

    with Store(tmp_path / "kb.db") as store:
        state = store.load()
        present = {c.id for c in state.kbs["crash"].concepts}
        for events in acked:
            assert all(e["subject"] in present for e in events)
        for events in sent:  # atomic: whole or not at all
            subjects = {e["subject"] in present for e in events}
            assert len(subjects) == 1, events
        log = store.read_log(0, limit=1_000_000)
        assert [r.seq for r in log] == list(range(1, len(log) + 1))
        assert len(log) == len(present) == state.kbs["crash"].seq

    # a restarted server knows every acknowledged event: sent again, they are duplicates
    proc = start_server(config)
    url = f"{proc.url}/v1/kbs/crash/events"
    try:
        for events in acked[:: max(1, len(acked) // 10)]:
            body, headers = wc.delivery(SECRET, events)
            answer = httpx.post(url, content=body, headers=headers, timeout=10).json()
            assert answer["duplicates"] == len(events) and answer["applied"] == 0
    finally:
        stop(proc)


def test_two_workers_share_the_store(tmp_path: Path) -> None:
    """``--workers 2``: two processes take deliveries into one SQLite file; none is lost."""
    config = served_config(tmp_path)
    proc = start_server(config, workers=2)
    url = f"{proc.url}/v1/kbs/shared/events"
    statuses: list[int] = []

    def client(n: int) -> None:
        for i in range(40):
            # a fresh connection each time, so the kernel spreads them over both workers
            body, headers = wc.delivery(SECRET, [wc.upsert(f"w{n}/{i}"), wc.upsert(f"w{n}/{i}/b")])
            statuses.append(httpx.post(url, content=body, headers=headers, timeout=30).status_code)

    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        stop(proc)
    assert statuses == [200] * 240
    with Store(tmp_path / "kb.db") as store:
        assert store.kb_seq("shared") == 480
        assert len(store.load().kbs["shared"].concepts) == 480
        assert [r.seq for r in store.read_log(0, limit=10_000)] == list(range(1, 481))


def test_checkpoints_and_log_cuts_under_load_lose_nothing(tmp_path: Path) -> None:
    """Two workers with a checkpoint every 100 records (written by a forked child) and the log
    cut after each, killed mid-stream: every acknowledged delivery is in the store, and a server
    started again from the newest checkpoint answers as one built from the store."""
    config = served_config(tmp_path)
    config.write_text(
        config.read_text().replace(
            '[store]\npath = "kb.db"\n',
            '[store]\npath = "kb.db"\ncheckpoint_every_events = 100\nlog_retain_events = 10\n',
        )
    )
    proc = start_server(config, workers=2)
    url = f"{proc.url}/v1/kbs/cut/events"
    acked: list[str] = []
    refused: list[str] = []  # what a delivery not acknowledged got (for the failure message)
    stop_clients = threading.Event()

    def client(n: int) -> None:
        """Deliveries one after another until told to stop: a slow or failed answer (a busy
        moment, the kill) is noted and the client goes on, so the load never quietly ends."""
        with httpx.Client(timeout=10) as http:
            for i in itertools.count():
                if stop_clients.is_set():
                    return
                subject = f"c{n}/{i}"
                body, headers = wc.delivery(SECRET, [wc.upsert(subject, links=[f"c{n}/{i - 1}"])])
                try:
                    response = http.post(url, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    refused.append(repr(exc))
                    time.sleep(0.05)
                    continue
                if response.status_code == 200:
                    acked.append(subject)
                else:
                    refused.append(f"{response.status_code} {response.text[:200]}")

    folder = tmp_path / "kb.db.checkpoints"
    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 90

        def log_cut() -> bool:
            with Store(tmp_path / "kb.db", read_only=True) as store:
                return store.log_start() > 1

        def reached() -> str:
            checkpoints = sorted(p.name for p in folder.glob("ckpt-*.kbg"))
            return (
                f"{len(acked)} acknowledged, checkpoints {checkpoints}, log cut: {log_cut()},"
                f" {len(refused)} not acknowledged (last: {refused[-3:]});"
                f" the server said:\n{proc.tail()}"
            )

        while not (len(acked) >= 600 and len(list(folder.glob("ckpt-*.kbg"))) >= 2 and log_cut()):
            assert time.monotonic() < deadline, f"no two checkpoints and a cut in 90 s: {reached()}"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # mid-stream, maybe mid-checkpoint
        proc.wait(30)
        stop_clients.set()
        for t in threads:
            t.join(30)
    finally:
        stop_clients.set()
        stop(proc)
    assert len(list(folder.glob("ckpt-*.kbg"))) >= 2, "no checkpoints were written"
    with Store(tmp_path / "kb.db") as store:
        assert store.log_start() > 1, "the log was never cut"
        present = {c.id for c in store.load().kbs["cut"].concepts}
        assert set(acked) <= present
        count = len(present)
    headers = bearer(ADMIN)
    answers = []
    logs = []  # each restarted server's log, for the message when the answers differ
    for _ in range(2):  # from the newest checkpoint, then with the checkpoints gone
        restarted = start_server(config)
        base = restarted.url
        try:
            # vectors are filled in after a build (from the store alone they start missing):
            # the answers compare once they are complete, within a deadline
            deadline = time.monotonic() + 60
            while True:
                status = httpx.get(f"{base}/v1/kbs/cut/status", headers=headers, timeout=10).json()
                if status.get("vectors") != "filling":
                    break
                assert time.monotonic() < deadline, f"vectors still filling after 60 s: {status}"
                time.sleep(0.05)
            sample = sorted(acked)[:: max(1, len(acked) // 20)]
            concepts = [
                httpx.get(f"{base}/v1/kbs/cut/concepts/{cid}", headers=headers, timeout=10).json()
                for cid in sample
            ]
            ready = httpx.get(f"{base}/readyz", timeout=10)
            answers.append((status, concepts))
        finally:
            stop(restarted)
        logs.append(f"/readyz {ready.status_code} {ready.text}; its log:\n{restarted.tail()}")
        for path in folder.glob("ckpt-*.kbg"):
            path.unlink()
    assert answers[0] == answers[1], "\n".join(logs)
    assert answers[0][0]["concepts"] == count, "\n".join(logs)

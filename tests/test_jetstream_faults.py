"""Faults under load over a real 3-server NATS JetStream cluster (issue 25, SPEC §4).

Two kbgraph nodes take a steady load of deliveries and agent reads while one fault at a time
strikes: the whole stream not answering (every NATS server paused), the stream's leader
paused with SIGSTOP then resumed, a node paused, a node killed mid-apply with SIGKILL, its
store wiped and the node restarted from the newest snapshot while writes go on. The load's
writers behave as a webhook sender does: a delivery that times out or gets a 503 is sent
again, the same webhook-id and body, to the next node, until one answers 200.

After each fault: every delivery answered 200 is on every node and applied once (each
carries new concepts: the KB's seq counts each event once), the nodes answer every tool with
the same bytes at one ``X-Min-Seq``, writes are taken again (the seconds are printed), and
``/readyz`` is ready again. While the stream does not answer, ``/readyz`` says so.

The pauses are short (the load test's ``--faults`` pauses the leader for 10 s); one cluster
and two nodes serve every test of the module, in order. Not in scripts/test.sh's SQLite
matrix: nothing here depends on the SQLite release that test_jetstream.py does not cover.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import msgspec
import pytest

from tests import webhook_client as wc
from tests.nats_cluster import NatsCluster, running_cluster
from tests.test_jetstream import (
    AUTH,
    KB,
    READY_SECONDS,
    SECRET,
    Node,
    assert_same_bytes,
    readyz_saying,
    wait_caught_up,
    wait_ready,
)

pytestmark = pytest.mark.slow

STREAM = "t-fault"
WRITE_TIMEOUT = 3.0  # the load's writers give up on an answer after this, and send again
SETTLE_SECONDS = 120.0  # a delivery not taken by any node within this: the test fails


@dataclass
class Load:
    """Writers and an agent reader against ``nodes`` (a node whose ``proc`` is None is
    skipped), and a sampler of every node's ``/readyz``; every answer with its time."""

    nodes: list[Node]
    tag: str
    acked: dict[str, list[dict]]  # webhook-id -> events, every test's (the KB holds them all)
    writers: int = 2
    writes: list[tuple[float, int, int]] = field(default_factory=list)  # (answered, node, code)
    readyz: list[tuple[float, int, int]] = field(default_factory=list)  # (asked, node, code)
    reads: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        targets = [(self._writer, (k,)) for k in range(self.writers)]
        targets += [(self._reader, ()), (self._sampler, ())]
        self.threads = [threading.Thread(target=t, args=a, daemon=True) for t, a in targets]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(SETTLE_SECONDS + 30)
        assert not any(thread.is_alive() for thread in self.threads), "a load thread hangs"

    def live(self) -> list[tuple[int, Node]]:
        return [(i, node) for i, node in enumerate(self.nodes) if node.proc is not None]

    def wait_acked(self, more: int) -> None:
        """Until ``more`` deliveries more than now are taken."""
        count = len(self.acked) + more
        deadline = time.monotonic() + READY_SECONDS
        while len(self.acked) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.acked) >= count, (len(self.acked), self.writes[-5:], self.errors[-3:])

    def _writer(self, k: int) -> None:
        turn = itertools.count(k)
        with httpx.Client(timeout=WRITE_TIMEOUT) as client:
            for i in itertools.count():
                if self.stopping.is_set():
                    return
                events = [
                    wc.upsert(
                        f"{self.tag}/w{k}/{i}/{j}",
                        1,
                        title=f"{self.tag} writer {k} delivery {i}",
                        text="alpha concept text",
                        links=[f"{self.tag}/w{k}/{max(0, i - 1)}/0"],
                    )
                    for j in range(1 + i % 2)
                ]
                body, headers = wc.delivery(SECRET, events)
                deadline = time.monotonic() + SETTLE_SECONDS
                while True:  # the same delivery until a node takes it (a sender's retries)
                    if time.monotonic() > deadline:
                        self.errors.append(f"delivery {headers['webhook-id']} never taken")
                        return
                    live = self.live()
                    if not live:
                        time.sleep(0.05)
                        continue
                    index, node = live[next(turn) % len(live)]
                    try:
                        answer = client.post(
                            f"{node.url}/v1/kbs/{KB}/events", content=body, headers=headers
                        )
                        code = answer.status_code
                    except (httpx.HTTPError, AssertionError):
                        code = 0  # no answer in time, or the node is gone
                    self.writes.append((time.monotonic(), index, code))
                    if code == 200:
                        self.acked[headers["webhook-id"]] = events
                        break
                    if code not in (0, 503):
                        self.errors.append(f"{code}: {answer.text[:300]}")
                    time.sleep(0.05)
                time.sleep(0.01)

    def _reader(self) -> None:
        body = msgspec.json.encode({"query": "alpha concept text", "limit": 5})
        rng = random.Random(5)
        with httpx.Client(timeout=WRITE_TIMEOUT) as client:
            while not self.stopping.is_set():
                live = self.live()
                if live:
                    _, node = rng.choice(live)
                    with contextlib.suppress(httpx.HTTPError, AssertionError):
                        answer = client.post(
                            f"{node.url}/v1/kbs/{KB}/tools/graph_context",
                            content=body,
                            headers=AUTH,
                        )
                        self.reads.append(answer.status_code)
                time.sleep(0.02)

    def _sampler(self) -> None:
        with httpx.Client(timeout=1.0) as client:
            while not self.stopping.is_set():
                for index, node in self.live():
                    asked = time.monotonic()
                    try:
                        code = client.get(f"{node.url}/readyz").status_code
                    except (httpx.HTTPError, AssertionError):
                        code = 0  # a paused node does not answer
                    self.readyz.append((asked, index, code))
                time.sleep(0.2)

    def taken_again(self, since: float) -> float:
        """Seconds from ``since`` (a fault's end) to the first delivery taken after it."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            after = [at for at, _, code in list(self.writes) if code == 200 and at >= since]
            if after:
                return min(after) - since
            time.sleep(0.02)
        raise AssertionError(f"no delivery taken since the fault ended: {self.writes[-5:]}")


def check_after(load: Load, cluster: NatsCluster, nodes: list[Node]) -> None:
    """Zero acknowledged loss, each delivery applied once, the same bytes on every node,
    every node ready, no answer but 200/503 (or none while a node is paused or killed)."""
    assert not load.errors, load.errors[:3]
    assert {code for *_, code in load.writes} <= {0, 200, 503}
    assert load.reads and set(load.reads) <= {200, 503}, set(load.reads)
    wait_caught_up(nodes, cluster)
    ids = sorted({event["subject"] for events in load.acked.values() for event in events})
    with httpx.Client(timeout=30) as client:
        seq = int(
            client.get(f"{nodes[0].url}/v1/kbs/{KB}/status", headers=AUTH).headers["X-KB-Seq"]
        )
        for node in nodes:
            assert client.get(f"{node.url}/readyz").status_code == 200
            status = client.get(
                f"{node.url}/v1/kbs/{KB}/status", headers={**AUTH, "X-Min-Seq": str(seq)}
            )
            assert status.headers["X-KB-Seq"] == str(seq)
            for cid in ids:  # every acknowledged delivery, on every node
                answer = client.get(
                    f"{node.url}/v1/kbs/{KB}/concepts/{cid}",
                    headers={**AUTH, "X-Min-Seq": str(seq)},
                )
                assert answer.status_code == 200, (node.url, cid, answer.text)
    # every event a new concept at version 1, every delivery eventually taken: the KB's seq
    # counts each event once however often its delivery was sent (a retry applies nothing)
    events = sum(len(each) for each in load.acked.values())
    assert seq == len(ids) == events, (seq, len(ids), events)
    assert_same_bytes(nodes, seq, ids)


@dataclass
class Faults:
    cluster: NatsCluster
    nodes: list[Node]
    acked: dict[str, list[dict]]

    def load(self, tag: str, writers: int = 2) -> Load:
        return Load(self.nodes, tag, self.acked, writers)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    """One cluster and two nodes (snapshots every second) for the module's tests, in order."""
    folder = tmp_path_factory.mktemp("faults")
    with running_cluster(folder / "nats") as cluster:
        every = "snapshot_every_seconds = 1\n"
        nodes = [Node(folder / f"node{i}", cluster, STREAM, log_extra=every) for i in range(2)]
        try:
            for node in nodes:
                node.launch()
            for node in nodes:
                assert node.proc is not None
                wait_ready(node.proc)
            yield Faults(cluster, nodes, {})
        finally:
            for node in nodes:
                node.stop()


@contextlib.contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def server_pids(cluster: NatsCluster, indexes: list[int]) -> list[int]:
    procs = [cluster.procs[i] for i in indexes]
    assert all(proc is not None for proc in procs)
    return [proc.pid for proc in procs if proc is not None]


def test_readyz_says_so_while_the_stream_does_not_answer(
    faults: Faults,
) -> None:
    """Every NATS server paused: no connection closes, yet no delivery can be taken; every
    node's /readyz says the stream does not answer (not "ready") until it answers again."""
    cluster, nodes = faults.cluster, faults.nodes
    with faults.load("quiet", writers=1) as load:
        load.wait_acked(5)
    with paused(server_pids(cluster, list(range(cluster.size)))):
        for node in nodes:
            answer = readyz_saying(node, f"stream {STREAM} has not answered for")
            assert "deliveries are refused" in answer.text
        started = time.monotonic()
    for node in nodes:
        assert node.proc is not None
        wait_ready(node.proc)
    print(f"ready again {time.monotonic() - started:.1f} s after the servers resumed")
    with faults.load("after-quiet", writers=1) as load:
        load.wait_acked(5)
    check_after(load, cluster, nodes)


def test_paused_stream_leader(faults: Faults) -> None:
    """The server leading the stream paused (SIGSTOP) for 3 s under load, then resumed."""
    cluster, nodes = faults.cluster, faults.nodes
    with faults.load("leader") as load:
        load.wait_acked(10)
        with paused(server_pids(cluster, [cluster.leader(STREAM)])):
            time.sleep(3.0)
        ended = time.monotonic()
        print(f"writes taken again {load.taken_again(ended):.2f} s after the leader resumed")
        load.wait_acked(10)
    check_after(load, cluster, nodes)


def test_paused_node(faults: Faults) -> None:
    """A kbgraph node paused (SIGSTOP) for 3 s under load: the deliveries it holds time out
    and are sent again to the other node; resumed, it catches up and answers alike."""
    cluster, nodes = faults.cluster, faults.nodes
    victim = nodes[1]
    assert victim.proc is not None
    with faults.load("node-pause") as load:
        load.wait_acked(10)
        os.killpg(victim.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(3.0)
        finally:
            os.killpg(victim.proc.pid, signal.SIGCONT)
        ended = time.monotonic()
        print(f"writes taken again {load.taken_again(ended):.2f} s after the node resumed")
        silent = [at for at, index, code in load.readyz if index == 1 and code == 0]
        assert silent, "the paused node answered /readyz"
        load.wait_acked(10)
    check_after(load, cluster, nodes)


def test_node_killed_mid_apply_wiped_and_restored_from_a_snapshot(
    faults: Faults,
) -> None:
    """A node SIGKILLed while it applies the load, its store and checkpoints deleted, and
    started again while writes go on: it restores the newest snapshot from the Object Store,
    follows the stream from its position, and answers as the other node."""
    cluster, nodes = faults.cluster, faults.nodes
    victim = nodes[1]
    with faults.load("wiped") as load:
        load.wait_acked(10)
        proc = victim.proc
        assert proc is not None
        victim.proc = None  # the writers turn to the other node
        os.killpg(proc.pid, signal.SIGKILL)  # mid-apply: deliveries stream in
        proc.wait(30)
        for path in victim.folder.iterdir():
            if path != victim.config:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        load.wait_acked(10)
        victim.start()  # while the writers go on
        ended = time.monotonic()
        assert victim.proc is not None
        assert "restored from snapshot" in victim.proc.tail()
        print(f"writes taken again {load.taken_again(ended):.2f} s after the node restarted")
        load.wait_acked(10)
    check_after(load, cluster, nodes)

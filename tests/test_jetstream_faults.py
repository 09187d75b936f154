"""Faults under load over a real 3-server NATS JetStream cluster (issue 25; docs/faults.md).

Two kbgraph nodes take a steady load of deliveries and agent reads while one fault at a time
strikes: the whole stream not answering (every NATS server paused), the stream's leader
paused with SIGSTOP then resumed, a node paused, a node killed mid-apply with SIGKILL, its
store wiped and the node restarted from the newest snapshot while writes go on. The load's
writers behave as a webhook sender does: a delivery that times out or gets a 503 is sent
again, the same webhook-id and body, to the next node, until one answers 200.

After each fault: every delivery answered 200 is on every node and applied once (each
carries new concepts: the KB's seq counts each event once), the nodes answer every tool with
the same bytes at one ``X-Min-Seq``, writes are taken again (the seconds are printed), and
``/readyz`` is ready again. While the stream does not answer, ``/readyz`` says so. The load
(``loadtest.faults.Load``) and the check (``loadtest.faults.compare``) are the load test's.
A node re-publishing a delivery that JetStream still holds "in process" asks again.

The pauses are short (the load test's ``--faults`` pauses the leader for 10 s); one cluster
and two nodes serve every test of the module, in order. Not in scripts/test.sh's SQLite
matrix: nothing here depends on the SQLite release that test_jetstream.py does not cover.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from loadtest.faults import Load, compare
from tests.jetstream_nodes import (
    AUTH,
    KB,
    READY_SECONDS,
    SECRET,
    Node,
    assert_same_bytes,
    readyz_saying,
    stream_state,
    wait_caught_up,
    wait_ready,
)
from tests.nats_cluster import NatsCluster, running_cluster

pytestmark = pytest.mark.slow

STREAM = "t-fault"


def check_after(load: Load, faults: Faults) -> None:
    """Zero acknowledged loss, each delivery applied once, the same bytes on every node,
    every node ready, no answer but 200/503 (or none while a node is paused or killed)."""
    assert not load.errors, load.errors[:3]
    assert {code for _, _, code, _ in load.writes} <= {0, 200, 503}
    assert load.reads and set(load.reads) <= {200, 503}, set(load.reads)
    nodes = faults.nodes
    wait_caught_up(nodes, faults.cluster)
    ids = sorted({event["subject"] for events in faults.acked.values() for event in events})
    found = compare([node.url for node in nodes], KB, AUTH, ids)
    # every event a new concept at version 1, every delivery eventually taken: the KB's seq
    # counts each event once however often its delivery was sent (a retry applies nothing)
    events = sum(len(each) for each in faults.acked.values())
    assert found == {"seq": events, "lost": 0, "divergent": 0}, (found, events)
    assert_same_bytes(nodes, events, ids)
    for node in nodes:  # ready again (a node asks the stream's leader once a second)
        deadline = time.monotonic() + 30
        while (code := httpx.get(f"{node.url}/readyz", timeout=5).status_code) != 200:
            assert time.monotonic() < deadline, f"{node.url}/readyz still {code}"
            time.sleep(0.2)


@dataclass
class Faults:
    cluster: NatsCluster
    nodes: list[Node]
    acked: dict[str, list[dict]]

    def targets(self) -> list[tuple[int, str]]:
        """The live nodes (the load's threads ask while a test kills one)."""
        return [(i, p.url) for i, node in enumerate(self.nodes) if (p := node.proc) is not None]

    def load(self, tag: str) -> Load:
        return Load(self.targets, SECRET, AUTH, KB, tag, self.acked)


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
    with paused(server_pids(cluster, list(range(cluster.size)))):
        for node in nodes:
            answer = readyz_saying(node, f"stream {STREAM} has not answered for")
            assert "deliveries are refused" in answer.text
        started = time.monotonic()
    for node in nodes:
        assert node.proc is not None
        wait_ready(node.proc)
    print(f"ready again {time.monotonic() - started:.1f} s after the servers resumed")


def test_paused_stream_leader(faults: Faults) -> None:
    """The server leading the stream paused (SIGSTOP) for 3 s under load, then resumed."""
    cluster = faults.cluster
    with faults.load("leader") as load:
        load.wait_acked(5)
        with paused(server_pids(cluster, [cluster.leader(STREAM)])):
            time.sleep(3.0)
        ended = time.monotonic()
        print(f"writes taken again {load.taken_again(ended):.2f} s after the leader resumed")
        load.wait_acked(5)
    check_after(load, faults)


def test_paused_node(faults: Faults) -> None:
    """A kbgraph node paused (SIGSTOP) for 3 s under load: the deliveries it holds time out
    and are sent again to the other node; resumed, it catches up and answers alike."""
    victim = faults.nodes[1]
    assert victim.proc is not None
    with faults.load("node-pause") as load:
        load.wait_acked(5)
        os.killpg(victim.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(3.0)
        finally:
            os.killpg(victim.proc.pid, signal.SIGCONT)
        ended = time.monotonic()
        print(f"writes taken again {load.taken_again(ended):.2f} s after the node resumed")
        silent = [at for at, index, code in load.readyz if index == 1 and code == 0]
        assert silent, "the paused node answered /readyz"
        load.wait_acked(5)
    check_after(load, faults)


def test_node_killed_mid_apply_wiped_and_restored_from_a_snapshot(
    faults: Faults,
) -> None:
    """A node SIGKILLed while it applies the load, its store and checkpoints deleted, and
    started again while writes go on: it restores the newest snapshot from the Object Store,
    follows the stream from its position, and answers as the other node."""
    cluster, nodes = faults.cluster, faults.nodes
    victim = nodes[1]
    with faults.load("wiped") as load:
        load.wait_acked(5)
        deadline = time.monotonic() + READY_SECONDS
        while stream_state(cluster, STREAM)[0] <= 1 and time.monotonic() < deadline:
            time.sleep(0.1)  # a snapshot taken and the stream trimmed below it
        assert stream_state(cluster, STREAM)[0] > 1, "the stream was not trimmed"
        proc = victim.proc
        assert proc is not None
        victim.proc = None  # the writers turn to the other node
        os.killpg(proc.pid, signal.SIGKILL)  # mid-apply: deliveries stream in
        proc.wait(30)
        for path in victim.folder.iterdir():
            if path != victim.config:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        load.wait_acked(5)
        victim.launch()  # while the writers go on; back once /healthz answers
        assert victim.proc is not None
        restored = [line for line in list(victim.proc.log) if "restored from snapshot" in line]
        assert restored, list(victim.proc.log)  # before serving, so in the log by now
        wait_ready(victim.proc)
        ended = time.monotonic()
        print(f"writes taken again {load.taken_again(ended):.2f} s after the node restarted")
        load.wait_acked(5)
    check_after(load, faults)

"""Snapshots over a real NATS JetStream cluster, on loopback (``tests.jetstream_nodes``): a
node publishes its store to the Object Store and trims the stream below it and below every
live node; a fresh node restores the newest snapshot; a snapshot not the cluster's, or made
with other decision rules, is refused."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.js import api

from kbgraph.config import load_config
from kbgraph.log.jetstream import snapshots
from kbgraph.log.jetstream.admin import restore_before_serving
from kbgraph.log.jetstream.node import NODE_ENV
from kbgraph.log.jetstream.snapshots import store_position
from tests import webhook_client as wc
from tests.jetstream_nodes import (
    READY_SECONDS,
    Node,
    assert_same_bytes,
    post,
    snapshots_equal,
    stream_state,
    wait_caught_up,
    wait_log,
    wait_positions,
    write_node_config,
)
from tests.nats_cluster import NatsCluster

pytestmark = pytest.mark.slow


def test_snapshots_trim_the_stream_and_a_fresh_node_starts_from_one(
    shared_cluster: NatsCluster, tmp_path: Path
) -> None:
    """A node publishes snapshots of its store to the Object Store bucket and trims the stream
    below them and below every live node (a paused node holds it back); a fresh node restores
    the newest snapshot, follows from its position and answers as the others; a snapshot that
    is not the cluster's (no valid MAC) or was made with other decision rules is refused."""
    cluster, stream = shared_cluster, "t-snap"
    every = "snapshot_every_seconds = 1\nsnapshots_keep = 1\n"
    node = Node(tmp_path / "a", cluster, stream, log_extra=every)
    node.start()
    nodes = [node]
    try:
        with httpx.Client(timeout=30) as client:
            for i in range(30):
                links = [f"snap/{i - 1}"] if i else []
                answer = post(client, node.url, [wc.upsert(f"snap/{i}", links=links)])
                assert answer.status_code == 200
        deadline = time.monotonic() + READY_SECONDS
        while stream_state(cluster, stream)[0] <= 30 and time.monotonic() < deadline:
            time.sleep(0.2)
        first, last = stream_state(cluster, stream)
        assert (first, last) == (31, 30), "the stream was not trimmed below the snapshot"
        with httpx.Client(timeout=30) as client:
            for i in range(30, 35):
                assert post(client, node.url, [wc.upsert(f"snap/{i}")]).status_code == 200

        fresh = Node(tmp_path / "fresh", cluster, stream)  # no store at all
        fresh.start()
        nodes.append(fresh)
        wait_log(fresh, "restored from snapshot")
        final = wait_caught_up(nodes, cluster)
        assert final == 35 and fresh.position() == 35
        assert_same_bytes(nodes, 35, [f"snap/{i}" for i in range(35)])

        # a live node behind holds the trim back: the fresh node (no snapshots of its own)
        # paused at 35 while A goes on to 40 and snapshots there
        wait_positions(cluster, stream, [35, 35])
        assert fresh.proc is not None
        os.killpg(fresh.proc.pid, signal.SIGSTOP)
        try:
            with httpx.Client(timeout=30) as client:
                for i in range(35, 40):
                    assert post(client, node.url, [wc.upsert(f"snap/{i}")]).status_code == 200
            kept = wait_log(node, "snapshot-00000000000000000040")
            assert "the stream kept from 36" in kept, kept
            assert stream_state(cluster, stream) == (36, 40)
        finally:
            os.killpg(fresh.proc.pid, signal.SIGCONT)
        wait_positions(cluster, stream, [40, 40])
        with httpx.Client(timeout=30) as client:
            assert post(client, node.url, [wc.upsert("snap/40")]).status_code == 200
        line = wait_log(node, "snapshot-00000000000000000041")  # the paused node moved on
        assert int(line.rsplit("kept from ", 1)[1]) in (41, 42), line  # 42: it reported 41

        other = Node(tmp_path / "other", cluster, stream)
        other.config.write_text(
            other.config.read_text().replace(
                'path = "kb.db"\n', 'path = "kb.db"\ndedupe_keys = 5\n'
            )
        )
        refused = subprocess.run(
            [sys.executable, "-m", "kbgraph", "serve", "--config", str(other.config)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 2, refused.stderr
        assert "dedupe_keys=5" in refused.stderr and "not restored" in refused.stderr
        assert not (other.folder / "kb.db").exists()

        async def forge() -> None:  # a newer "snapshot" put by someone without the secret
            nc = await cluster.connect()
            try:
                obs = await nc.jetstream(timeout=5).object_store(f"{stream}-snapshots")
                await obs.put(
                    f"snapshot-{99:020d}",
                    b"not a store",
                    meta=api.ObjectMeta(headers={"Kbgraph-Position": "99"}),
                )
            finally:
                await nc.close()

        for n in nodes:
            n.stop()
        asyncio.run(forge())
        forged = subprocess.run(
            [
                sys.executable,
                "-m",
                "kbgraph",
                "serve",
                "--config",
                str(write_node_config(tmp_path / "forged", cluster, stream)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert forged.returncode == 2 and "no valid MAC" in forged.stderr, forged.stderr
        snapshots_equal(nodes)
    finally:
        for n in nodes:
            n.stop()


def test_a_snapshot_replaced_before_it_is_fetched_is_listed_again(
    shared_cluster: NatsCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh node lists the newest snapshot, and before it fetches it the bucket replaces it
    (a newer one put, the old deleted: it keeps ``snapshots_keep``): the node lists again and
    restores the newer one, not starting empty behind a trimmed stream."""
    cluster, stream = shared_cluster, "t-snap-gone"
    every = "snapshot_every_seconds = 1\nsnapshots_keep = 1\n"
    node = Node(tmp_path / "a", cluster, stream, log_extra=every)
    node.start()
    try:
        with httpx.Client(timeout=30) as client:
            for i in range(30):
                assert post(client, node.url, [wc.upsert(f"gone/{i}")]).status_code == 200
        wait_log(node, "snapshot-00000000000000000030")
        deadline = time.monotonic() + READY_SECONDS
        while stream_state(cluster, stream)[0] <= 30 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stream_state(cluster, stream) == (31, 30)

        def replace_the_snapshot() -> None:  # A snapshots at 35 and deletes the one at 30
            with httpx.Client(timeout=30) as client:
                for i in range(30, 35):
                    assert post(client, node.url, [wc.upsert(f"gone/{i}")]).status_code == 200
            wait_log(node, "snapshot-00000000000000000035")

        listed = snapshots.snapshots
        calls: list[list[str]] = []

        async def stale_first(obs: Any) -> list[Any]:
            found = await listed(obs)
            calls.append([info.name for info in found])
            if len(calls) == 1:
                await asyncio.to_thread(replace_the_snapshot)
            return found

        monkeypatch.setattr(snapshots, "snapshots", stale_first)
        monkeypatch.setenv(NODE_ENV, "")  # restore_before_serving names this process's node
        fresh = write_node_config(tmp_path / "fresh", cluster, stream)
        config = load_config(str(fresh))
        assert restore_before_serving(config) is None
        assert store_position(tmp_path / "fresh" / "kb.db", stream) == 35, calls
        assert calls == [["snapshot-00000000000000000030"], ["snapshot-00000000000000000035"]]
    finally:
        node.stop()

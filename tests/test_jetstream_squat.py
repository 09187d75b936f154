"""A client holding a node's NATS credentials but not the cluster secret, on a real cluster:
it can write junk into the stream (refused by every node) but never make an acknowledged
delivery vanish, and it cannot change the stream's configuration.

The attack: read the node's last ``Nats-Msg-Id`` from the stream, publish junk under the ids
that would come next (behind a burst of more junk, so the node's follower lags), then send
signed deliveries. JetStream drops a message whose Msg-Id it already holds; before the fix
the node took the duplicate's acknowledgement for its own and answered 200 with nothing
stored, or 503 after 30 s."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest

from tests import webhook_client as wc
from tests.jetstream_nodes import AUTH, KB, Node, nodes_on, post, wait_caught_up
from tests.nats_cluster import NatsCluster, running_cluster

pytestmark = pytest.mark.slow

STREAM = "t-squat"
FILLER = 2000  # junk ahead of the squatted ids: the node's follower is still on it
SQUATTED = 3  # the node's next Msg-Ids, as an attacker predicts them
NOTED = "kbgraph_stream_messages_noted_total"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with running_cluster(tmp_path_factory.mktemp("nats")) as started:
        yield started


async def as_node_user(cluster: NatsCluster) -> nats.NATS:
    """A connection with the node user's credentials (and client certificate), no MAC key."""
    return await nats.connect(
        servers=cluster.urls,
        user=cluster.accounts.node_user(STREAM),
        password=cluster.accounts.node_password,
        tls=cluster.tls_context(),
        error_cb=_quiet,
    )


async def _quiet(exc: Exception) -> None:
    pass


def predicted_ids(cluster: NatsCluster) -> list[str]:
    """The ids an attacker expects next from the last one in the stream: the counter after
    the last ``-`` plus 1, 2, 3 (a random last part gives ids nobody will use)."""

    async def read() -> str:
        nc = await cluster.connect()
        try:
            js = nc.jetstream(timeout=5)
            last = (await js.stream_info(STREAM)).state.last_seq
            return (await js.get_msg(STREAM, last)).headers["Nats-Msg-Id"]
        finally:
            await nc.close()

    last_id = asyncio.run(read())
    prefix, _, tail = last_id.rpartition("-")
    counter = int(tail) if tail.isdigit() else 0
    return [f"{prefix}-{counter + i}" for i in range(1, SQUATTED + 1)]


def squat(cluster: NatsCluster, ids: list[str]) -> None:
    """``FILLER`` junk messages, then one under each of ``ids``, as the node user."""

    async def publish() -> None:
        nc = await as_node_user(cluster)
        try:
            subject = f"{STREAM}.{KB}"
            for _ in range(FILLER):
                await nc.publish(subject, b"junk", headers={"Nats-Msg-Id": secrets.token_hex(8)})
            js = nc.jetstream(timeout=10)
            for msg_id in ids:  # acknowledged: stored before the deliveries are sent
                ack = await js.publish(subject, b"junk", headers={"Nats-Msg-Id": msg_id})
                assert not ack.duplicate
        finally:
            await nc.close()

    asyncio.run(publish())


def stream_metadata_change_refused(cluster: NatsCluster) -> None:
    """The node user may not update the stream (its decision rules are in its metadata)."""

    async def attempt() -> None:
        nc = await as_node_user(cluster)
        try:
            js = nc.jetstream(timeout=2)
            config = (await js.stream_info(STREAM)).config
            before = dict(config.metadata or {})
            config.metadata = {**before, "kbgraph_decision_rules": "forged"}
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.update_stream(config)
            assert (await js.stream_info(STREAM)).config.metadata == before
        finally:
            await nc.close()

    asyncio.run(attempt())


def test_squatted_msg_ids_never_lose_an_acknowledged_delivery(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    with nodes_on(cluster, tmp_path, 1, STREAM) as (node,), httpx.Client(timeout=60) as client:
        first = post(client, node.url, [wc.upsert("real/0")])
        assert first.status_code == 200, first.text
        squat(cluster, predicted_ids(cluster))
        answers = [post(client, node.url, [wc.upsert(f"real/{i}")]) for i in (1, 2, 3)]
        wait_caught_up([node], cluster)
        for i, answer in zip((1, 2, 3), answers, strict=True):
            if answer.status_code == 200:  # acknowledged: applied and stored
                assert answer.json()["applied"] == 1, answer.text
                # read at the answer's position: the projection follows the store
                seen = AUTH | {"X-Min-Seq": str(answer.json()["seq"])}
                stored = client.get(f"{node.url}/v1/kbs/{KB}/concepts/real/{i}", headers=seen)
                assert stored.status_code == 200, (answer.text, stored.text)
            else:
                assert answer.status_code == 503, answer.text
        # ids nobody can predict: nothing was squatted, every delivery went in at once
        assert [answer.status_code for answer in answers] == [200, 200, 200]
        refused = [line for line in _noted(node) if 'kind="refused"' in line]
        assert refused and refused[0].endswith(f" {FILLER + SQUATTED}.0"), refused
        stream_metadata_change_refused(cluster)
        node.stop()  # the count of refused messages is the store's notes', after a restart too
        node.start()
        assert [line for line in _noted(node) if 'kind="refused"' in line] == refused
        assert post(client, node.url, [wc.upsert("real/4")]).status_code == 200


def _noted(node: Node) -> list[str]:
    text = httpx.get(f"{node.url}/metrics", headers=AUTH, timeout=5).text
    return [line for line in text.splitlines() if line.startswith(NOTED)]

"""TLS between kbgraph and NATS fails within seconds, by its cause, never by hanging.

- The tests' CA makes certificates a strict verifier accepts (``VERIFY_X509_STRICT``, which
  Python 3.13's default context sets: a leaf without an Authority Key Identifier is refused).
- A connection whose certificate does not verify (a CA that did not sign the servers', a
  client certificate the servers do not know) raises ``ConnectFailed`` naming the TLS error
  at once; servers that refuse, likewise. Under TLS 1.3 the servers' alert for an unknown
  client certificate may be lost to a reset: a reset right after the handshake is named as
  that refusal when a client certificate is configured (a loopback server doing exactly that).
- A node given a CA it cannot verify says so on ``/readyz`` (503) within seconds of starting,
  and keeps trying: once its CA file is the right one, it gets ready.
- The tests' own cluster helper fails by its deadline, naming the error, when its connection
  never opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbgraph.config import JetStreamConfig
from kbgraph.log.jetstream.connect import OPEN_SECONDS, ConnectFailed, connect
from tests.jetstream_nodes import Node, readyz_saying, wait_ready
from tests.nats_cluster import NatsCluster, free_ports, running_cluster
from tests.nats_security import Tls

pytestmark = pytest.mark.slow

FAST_SECONDS = 8.0  # a connection's TLS failure named by then
VERIFY_FAILED = "certificate verify failed"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with running_cluster(tmp_path_factory.mktemp("nats")) as running:
        yield running


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> list[str]:
    """A TLS handshake over a socket pair (one side in a thread); the errors each side saw."""
    ends = socket.socketpair()
    errors: list[str] = []

    def serve() -> None:
        try:
            with server.wrap_socket(ends[0], server_side=True) as conn:
                conn.recv(1)
        except (ssl.SSLError, OSError) as exc:
            errors.append(f"server: {exc}")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with client.wrap_socket(ends[1], server_hostname="127.0.0.1") as conn:
            conn.sendall(b"x")
    except (ssl.SSLError, OSError) as exc:
        errors.append(f"client: {exc}")
    thread.join(10)
    assert not thread.is_alive()
    return errors


def test_the_tests_certificates_verify_strictly(tmp_path: Path) -> None:
    """Both ends verify with ``VERIFY_X509_STRICT``, as Python 3.13's default context does
    (the CA's certificates lacked the Authority Key Identifier: "Missing Authority Key
    Identifier"); a certificate of another CA is still refused."""
    tls, other = Tls(tmp_path / "tls"), Tls(tmp_path / "other")

    def server(ca: Path) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.server_cert, tls.server_key)
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED
        context.verify_flags |= ssl.VERIFY_X509_STRICT
        return context

    def client(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca))
        context.verify_flags |= ssl.VERIFY_X509_STRICT
        context.load_cert_chain(cert, key)
        return context

    assert handshake(server(tls.ca), client(tls.ca, tls.client_cert, tls.client_key)) == []
    refused = handshake(server(tls.ca), client(other.ca, tls.client_cert, tls.client_key))
    assert any(VERIFY_FAILED in error for error in refused), refused
    refused = handshake(server(tls.ca), client(tls.ca, other.client_cert, other.client_key))
    assert any("server:" in error and VERIFY_FAILED in error for error in refused), refused


def node_log(
    cluster: NatsCluster, ca: Path, cert: Path, key: Path, servers: list[str]
) -> JetStreamConfig:
    return JetStreamConfig(
        servers=servers,
        user=cluster.accounts.node_user("kbgraph"),
        password_file=str(cluster.accounts.node_password_file),
        tls_ca_file=str(ca),
        tls_cert_file=str(cert),
        tls_key_file=str(key),
    )


def attempt(config: JetStreamConfig, reconnect: bool) -> tuple[float, str]:
    """How long ``connect`` took to fail, and what it said (it must not succeed)."""

    async def run() -> None:
        nc = await connect(config, "kbgraph-test", reconnect=reconnect)
        await nc.close()
        raise AssertionError("connected")

    started = time.monotonic()
    with pytest.raises(ConnectFailed) as failed:
        asyncio.run(asyncio.wait_for(run(), 60))
    return time.monotonic() - started, str(failed.value)


@pytest.mark.parametrize("reconnect", [True, False])
def test_a_connection_whose_tls_fails_says_so_at_once(
    cluster: NatsCluster, tmp_path: Path, reconnect: bool
) -> None:
    """A node's connection (retrying by itself once open) and a one-shot one (an admin
    command): a CA that did not sign the servers' certificate, a client certificate of
    another CA, servers that refuse; each fails in seconds, naming its cause."""
    tls, other = cluster.tls, Tls(tmp_path / "other")
    wrong_ca = node_log(cluster, other.ca, tls.client_cert, tls.client_key, cluster.urls)
    seconds, said = attempt(wrong_ca, reconnect)
    assert seconds < FAST_SECONDS and "TLS" in said and VERIFY_FAILED in said, (seconds, said)
    unknown = node_log(cluster, tls.ca, other.client_cert, other.client_key, cluster.urls)
    seconds, said = attempt(unknown, reconnect)
    # the server's alert, or (TLS 1.3: the refusal may reach us as a closed socket on our first
    # write, whichever comes first is chance) the closed socket, named as that refusal
    named = "unknown ca" in said or "refuses a client certificate" in said
    assert seconds < FAST_SECONDS and "TLS" in said and named, (seconds, said)
    good = node_log(cluster, tls.ca, tls.client_cert, tls.client_key, cluster.urls)

    async def opens() -> bool:
        nc = await connect(good, "kbgraph-test", reconnect=reconnect)
        await nc.close()
        return True

    assert asyncio.run(asyncio.wait_for(opens(), 60))
    if not reconnect:  # a node retries refusals until OPEN_SECONDS; a one-shot gives up
        closed = [f"tls://127.0.0.1:{port}" for port in free_ports(2)]
        refused = node_log(cluster, tls.ca, tls.client_cert, tls.client_key, closed)
        seconds, said = attempt(refused, reconnect)
        assert seconds < FAST_SECONDS and "ConnectionRefusedError" in said, (seconds, said)


def test_a_node_given_a_ca_it_cannot_verify_says_so_and_retries(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    """A node whose CA did not sign the servers' certificate: its start-up names the TLS error
    (no snapshot restored, and why) rather than wait for the restore's deadline, ``/readyz``
    says 503 naming it, and the node keeps trying: once the file holds the right CA, it
    connects by itself and gets ready."""
    ca = tmp_path / "ca.pem"
    shutil.copy(Tls(tmp_path / "other").ca, ca)
    node = Node(tmp_path / "node", cluster)
    node.config.write_text(node.config.read_text().replace(str(cluster.tls.ca), str(ca)))
    try:
        node.launch()
        assert node.proc is not None
        answer = readyz_saying(node, VERIFY_FAILED)
        restore = [line for line in node.proc.tail().splitlines() if "no snapshot restored" in line]
        assert restore and VERIFY_FAILED in restore[0], node.proc.tail()[-2000:]
        assert "TLS with the NATS server failed" in answer.text, answer.text
        shutil.copy(cluster.tls.ca, ca)
        wait_ready(node.proc, 60)
    finally:
        node.stop()


def test_the_clusters_wait_holds_its_deadline_when_a_connection_hangs(tmp_path: Path) -> None:
    """The helper's own connections use a CA that cannot verify the servers (nats-py then
    hangs closing the failed connection): ``wait_ready`` fails by its deadline, naming the
    TLS error, rather than wait for good."""
    cluster = NatsCluster(tmp_path / "nats")
    other = Tls(tmp_path / "other")

    def wrong_context() -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(other.ca))
        context.load_cert_chain(str(cluster.tls.client_cert), str(cluster.tls.client_key))
        return context

    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            cluster.wait_ready(timeout=4)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    try:
        for index in range(cluster.size):
            cluster.start_server(index)
        cluster.tls_context = wrong_context  # type: ignore[method-assign]
        started = time.monotonic()
        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "wait_ready did not return within 30 s"
        assert time.monotonic() - started < 15
    finally:
        cluster.stop()
    (raised,) = outcome
    assert isinstance(raised, AssertionError), raised
    assert VERIFY_FAILED in str(raised), raised


@contextlib.contextmanager
def closing_after_handshake(tls: Tls) -> Iterator[str]:
    """A loopback server that does what a TLS 1.3 NATS server refusing a client certificate
    looks like from the client: it greets (NATS's INFO line, asking for TLS), completes the
    handshake, then resets the connection before reading a byte. Yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.server_cert, tls.server_key)
    stopping = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            conn.sendall(b'INFO {"server_id":"fake","tls_required":true,"max_payload":1024}\r\n')
            try:
                wrapped = context.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                continue
            wrapped.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            wrapped.close()  # linger 0: a reset, whatever the client writes next

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tls://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopping.set()
        thread.join(10)
        listener.close()


@pytest.mark.parametrize("reconnect", [True, False])
def test_a_reset_right_after_the_handshake_is_named_as_a_refused_client_certificate(
    tmp_path: Path, reconnect: bool
) -> None:
    """Under TLS 1.3 a server checks the client's certificate after the client's side of the
    handshake is done: its alert may be lost to the reset our first write meets, so the
    refusal reaches us as a closed socket. With a client certificate configured, the error
    says what that most likely means; without one, it does not guess."""
    tls = Tls(tmp_path / "tls")
    with closing_after_handshake(tls) as url:
        with_cert = JetStreamConfig(
            servers=[url],
            tls_ca_file=str(tls.ca),
            tls_cert_file=str(tls.client_cert),
            tls_key_file=str(tls.client_key),
        )
        seconds, said = attempt(with_cert, reconnect)
        assert "refuses a client certificate" in said, said
        assert "log.jetstream.tls_cert_file" in said, said
        assert seconds < OPEN_SECONDS + 2, seconds
        without = JetStreamConfig(servers=[url], tls_ca_file=str(tls.ca))
        _, said = attempt(without, reconnect)
        closed = "Connection reset" in said or "Broken pipe" in said
        assert closed and "client certificate" not in said, said

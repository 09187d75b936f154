"""Issue 28, High 1 over real sockets: a client that trickles a request body (made-up
signature headers with a fresh timestamp, one byte at a time) holds neither the webhook's
in-flight budget nor a connection for long, and cannot lock out working clients.

The only time bounds are generous "closed within" ones.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import webhook_client as wc
from tests.support import GENEROUS, SECRET, closed_by_server, start_server, stop

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def serve(folder: Path, limits: str) -> Iterator[str]:
    config = folder / "kbgraph.toml"
    config.write_text(
        f'[store]\npath = "kb.db"\n[webhooks]\nsecrets = ["{SECRET}"]\n[limits]\n{limits}\n'
    )
    proc = start_server(config)
    try:
        yield proc.url
    finally:
        stop(proc)


def trickler(url: str, kb: str, length: int) -> socket.socket:
    """A delivery with plausible headers (fresh timestamp, a signature that will not verify)
    declaring ``length`` bytes, of which one is sent."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=GENEROUS)
    head = [f"POST /v1/kbs/{kb}/events HTTP/1.1", f"host: {host}:{port}",
            f"content-length: {length}", "content-type: application/json",
            "webhook-id: msg_fake", f"webhook-timestamp: {int(time.time())}",
            "webhook-signature: v1,AAAA"]  # fmt: skip
    sock.sendall(("\r\n".join(head) + "\r\n\r\n[").encode())
    return sock


def signed_delivery(url: str, kb: str) -> httpx.Response:
    body = wc.encode([wc.upsert("a/b", title="B")])
    headers = wc.signed_headers(SECRET, body, "application/cloudevents-batch+json")
    return httpx.post(f"{url}/v1/kbs/{kb}/events", content=body, headers=headers, timeout=30)


def test_trickled_bodies_do_not_hold_the_ingest_budget_and_are_closed(tmp_path: Path) -> None:
    # the default budget (64 MiB) is what four declared 16 MiB bodies used to reserve whole
    with serve(tmp_path, "body_timeout_seconds = 2.0\nmin_body_bytes_per_second = 1024") as url:
        socks = [trickler(url, "anykb", 16 << 20) for _ in range(4)]
        time.sleep(0.3)  # the server has read their heads and is waiting for their bodies
        for sock in socks:
            sock.sendall(b" ")  # a byte now and then keeps nothing alive for long
        delivered = signed_delivery(url, "realkb")
        assert delivered.status_code == 200, delivered.text
        assert delivered.json()["applied"] == 1
        assert all(closed_by_server(sock) for sock in socks)  # past the body deadline


def test_trickled_bodies_cannot_lock_out_other_clients(tmp_path: Path) -> None:
    limits = "max_connections = 20\nbody_timeout_seconds = 120\nheader_timeout_seconds = 120"
    with serve(tmp_path, limits) as url:
        socks = [trickler(url, "anykb", 1 << 20) for _ in range(25)]
        time.sleep(0.3)
        with httpx.Client(timeout=GENEROUS) as client:
            for _ in range(5):  # each new connection closes the longest-waiting trickler
                assert (
                    client.get(f"{url}/healthz", headers={"connection": "close"}).status_code == 200
                )
        assert all(closed_by_server(sock) for sock in socks[:5])
        for sock in socks:
            sock.close()

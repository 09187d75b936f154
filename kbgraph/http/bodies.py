"""Agent request bodies, bounded: read at most ``[limits] max_request_bytes`` of them.

The limit is checked from ``Content-Length`` before any body byte is read, then on the bytes
read so far, so nothing larger than the limit is ever buffered or decoded. A refusal answers
``413`` with ``Connection: close`` (the rest of the body is never read; see
``kbgraph.http.server``).
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive

from kbgraph.events import Refused


class BodyRefused(Refused):
    """A body the API will not take."""


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or ``BodyRefused`` (413 past ``limit`` bytes, 400 on a client gone midway)."""
    too_large = BodyRefused(
        413, f"request body over the limit of {limit} bytes", {"Connection": "close"}
    )
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise BodyRefused(400, "client disconnected before the body was complete") from None
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole once, then whatever ``receive`` gives next
    (the disconnect), for an ASGI app downstream of ``read_body``."""
    pending = True

    async def again() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again

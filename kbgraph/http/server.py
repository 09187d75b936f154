"""uvicorn's httptools protocol with the connection limits it lacks (docs/operations.md "Limits").

uvicorn with httptools bounds neither the request head nor the time a client may take to send
it: a connection that never sends a request is never closed, and a 100 MB header is parsed
(with quadratic copying) on the event loop. ``BoundedHttpToolsProtocol`` adds, per worker:

- ``max_header_bytes``: the request line and headers past this many bytes answer ``431`` and
  the connection closes; the parser is never fed more than that of one head.
- ``header_timeout_seconds``: from the moment a connection waits for a request (just opened,
  or its previous response sent) to the end of the request's head; past it the connection
  closes. Trickling bytes does not extend it.
- ``body_timeout_seconds`` and ``min_body_bytes_per_second``: from the end of the head, the
  body must end within ``body_timeout_seconds`` plus one second per
  ``min_body_bytes_per_second`` bytes received so far; past it the connection closes (the app
  sees the client gone: a 400 that frees whatever the request held, such as the webhook's
  in-flight budget). A body trickled a byte a second holds nothing for long.
- ``max_connections``: a new connection past the bound closes the connection that has waited
  longest for the client (idle keep-alive, half-sent head or half-sent body); with none
  waiting, the new connection gets ``503`` and closes. Idle or trickling sockets therefore
  cannot lock out working clients.

uvicorn's own ``timeout_keep_alive`` closes a connection idle after a response. The limits
come from the config named by ``KBGRAPH_CONFIG`` (as for the app), read once per process.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections import OrderedDict
from typing import Any, ClassVar, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kbgraph.config import CONFIG_ENV, LimitsConfig, load_config

PROTOCOL: Final = "kbgraph.http.server:BoundedHttpToolsProtocol"


@functools.cache
def limits() -> LimitsConfig:
    """This process's limits, from the config file in ``KBGRAPH_CONFIG``."""
    path = os.environ.get(CONFIG_ENV)
    return load_config(path, quiet=True).limits if path else LimitsConfig()


def _refusal(status: int, reason: str, message: str) -> bytes:
    body = b'{"error":"' + message.encode() + b'"}'
    return b"".join(
        [
            f"HTTP/1.1 {status} {reason}\r\n".encode(),
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` plus a head size bound, head and body deadlines and a connection
    bound."""

    # Per worker process: connections waiting for the client (a head, or the rest of a body),
    # the longest-waiting first.
    _waiting: ClassVar[OrderedDict[BoundedHttpToolsProtocol, None]] = OrderedDict()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        bounds = limits()
        self._max_head = bounds.max_header_bytes
        self._head_timeout = bounds.header_timeout_seconds
        self._body_timeout = bounds.body_timeout_seconds
        self._body_rate = float(bounds.min_body_bytes_per_second)
        self._max_connections = bounds.max_connections
        self._head_bytes: int | None = 0  # bytes of the head being read; None while in a body
        self._timer: asyncio.TimerHandle | None = None
        # loop time the current head, or body, must end by; None when waiting for neither
        self._deadline: float | None = None
        self._body_bytes = 0  # of the body being read (while _head_bytes is None)
        self._body_started = 0.0

    # -- connection bound, head and body deadlines ---------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._max_connections:
            if self._waiting:
                oldest, _ = self._waiting.popitem(last=False)
                oldest.transport.close()
            else:
                transport.write(_refusal(503, "Service Unavailable", "too many connections"))
                transport.close()
                return
        self._wait_for_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def _wait_for_head(self) -> None:
        self._wait_until(self.loop.time() + self._head_timeout)

    def _wait_for_body(self) -> None:
        self._body_bytes = 0
        self._body_started = self.loop.time()
        self._wait_until(self._body_started + self._body_timeout)

    def _wait_until(self, deadline: float) -> None:
        self._waiting[self] = None
        self._deadline = deadline
        if self._timer is not None and self._timer.when() > deadline:
            self._timer.cancel()  # a body's deadline may come before the head's
            self._timer = None
        if self._timer is None:  # one timer per connection, re-armed when it fires early
            self._timer = self.loop.call_at(deadline, self._expired)

    def _stop_waiting(self) -> None:
        self._waiting.pop(self, None)
        self._deadline = None

    def _expired(self) -> None:
        self._timer = None
        if self._deadline is None:  # the head or body came in time
            return
        if self.loop.time() < self._deadline:  # waiting again since, or bytes came: sleep on
            self._timer = self.loop.call_at(self._deadline, self._expired)
            return
        self._stop_waiting()
        if not self.transport.is_closing():
            self.transport.close()

    # -- head size ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        while data:
            if self._head_bytes is None:  # in a body: the app bounds its size, we its time
                if self._deadline is not None:
                    self._body_bytes += len(data)
                    allowed = self._body_timeout + self._body_bytes / self._body_rate
                    self._deadline = self._body_started + allowed
                super().data_received(data)
                return
            room = self._max_head - self._head_bytes
            piece, data = data[:room], data[room:]
            self._head_bytes += len(piece)
            super().data_received(piece)
            if self.transport.is_closing():
                return
            if data and self._head_bytes is not None and self._head_bytes >= self._max_head:
                self._stop_waiting()
                if self.cycle is None or self.cycle.response_complete:  # else mid-response
                    message = f"request head over the limit of {self._max_head} bytes"
                    refusal = _refusal(431, "Request Header Fields Too Large", message)
                    self.transport.write(refusal)
                self.transport.close()
                return

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._stop_waiting()
        super().on_headers_complete()
        if not self.transport.is_closing():
            self._wait_for_body()  # ended at once by on_message_complete when there is none

    def on_message_complete(self) -> None:
        self._stop_waiting()
        super().on_message_complete()
        self._head_bytes = 0  # the next head (pipelined or not) is counted from here
        if self.cycle.response_complete and not self.transport.is_closing():
            self._wait_for_head()  # answered before the body ended (a 413, say)

    def on_response_complete(self) -> None:
        if self._head_bytes is None and not self.transport.is_closing():
            self.transport.close()  # answered before the body ended: never read the rest
        busy = bool(self.pipeline)  # super() starts the next pipelined request, if any
        super().on_response_complete()
        if not busy and self._head_bytes is not None and not self.transport.is_closing():
            self._wait_for_head()

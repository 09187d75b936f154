"""``Host`` and ``Origin`` checks against DNS rebinding and cross-site requests (issues 28, 34).

A web page a user opens may make their browser send requests to ``127.0.0.1``, or, after
rebinding its own name to ``127.0.0.1``, to this service under the page's name. So:

- **a request that needs no credential** (any request when there is no token; a delivery to a
  KB no webhook secret applies to, whatever the tokens: an open door is open whatever the other
  door does; such configurations are loopback only): its ``Host`` must name a loopback host
  (``localhost``, ``127.0.0.1``, ``[::1]``, any port; a request without one, not sent by a
  browser, passes), else ``421``; an ``Origin``, when sent, must be this same origin
  (``http://`` plus the request's own ``Host``) or one of ``[server] allowed_origins``, else
  ``403``.
- **a request that needs a credential**: a browser never sends a bearer token or a webhook
  signature by itself, so only the MCP endpoint checks ``Origin`` (the MCP specification asks
  streamable HTTP servers to), the same way; ``Host`` is whatever name the service is
  published under.

The MCP SDK's ``TransportSecuritySettings`` holds fixed host and origin lists and answers in
plain text, for its own endpoint only: these checks cover the whole API, answer JSON like every
other refusal, and compare an ``Origin`` with the request's own ``Host``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from kbgraph.events import ECHO_CHARS
from kbgraph.http.ingest import error_response

LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "[::1]"})
_HOST: Final = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::([0-9]{1,5}))?")
MCP_PATH: Final = re.compile(r"/v1/kbs/[^/]+/mcp")
EVENTS_PATH: Final = re.compile(r"/v1/kbs/([^/]+)/events")


def is_loopback_host(host: str) -> bool:
    """``host`` (a ``Host`` header: name and optional port) names a loopback address."""
    match = _HOST.fullmatch(host.strip())
    return match is not None and match.group(1).lower() in LOOPBACK_NAMES


def origin_problem(headers: Headers, allowed: frozenset[str]) -> str | None:
    """Why the request's ``Origin`` is refused: not this origin nor an allowed one."""
    origin = headers.get("origin")
    if origin is None:
        return None
    host = headers.get("host", "")
    same = {f"http://{host}".lower(), f"https://{host}".lower()} if host else set()
    if origin.lower() in same or origin in allowed:
        return None
    return f"Origin {origin[:ECHO_CHARS]!r} is not this service's origin nor an allowed one"


class HostOriginCheck:
    """ASGI middleware: the checks above, before any route runs."""

    def __init__(
        self,
        app: ASGIApp,
        reads_open: bool,
        ingest_open: Callable[[str], bool],
        allowed_origins: frozenset[str],
    ) -> None:
        """``reads_open``: no token; ``ingest_open(kb)``: no webhook secret applies to ``kb``."""
        self.app = app
        self.reads_open = reads_open
        self.ingest_open = ingest_open
        self.allowed = allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self.problem(scope)
            if problem is not None:
                await error_response(*problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def problem(self, scope: Scope) -> tuple[int, str] | None:
        headers = Headers(scope=scope)
        path = scope["path"]
        events = EVENTS_PATH.fullmatch(path)
        if self.reads_open or (events is not None and self.ingest_open(events[1])):
            host = headers.get("host")
            if host is not None and not is_loopback_host(host):
                shown = host[:ECHO_CHARS]
                return 421, f"Host {shown!r}: authentication is off, so only loopback names"
        elif not MCP_PATH.fullmatch(path):
            return None
        why = origin_problem(headers, self.allowed)
        return None if why is None else (403, why)

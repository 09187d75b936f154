"""A small, fast HTTP/1.1 keep-alive client on raw asyncio streams (load test and benchmark).

httpx spends more CPU per request than a uvicorn worker does answering a small one, so on a
2-core machine it cannot saturate the server. This client writes pre-built request bytes and
parses just enough of the answer (status line, headers, ``Content-Length`` or chunked body).

- ``build_request(method, path, ...)`` -> the request bytes (reusable, e.g. in a benchmark).
- ``Connection``: one keep-alive connection, one request at a time, reconnecting when the
  server closed it or it sat idle longer than the server's keep-alive.
- ``Pool``: ``size`` connections shared by many tasks (``await pool.request(...)``).
- ``closed_loop(...)``: ``concurrency`` tasks each sending back to back on its own
  connection for a bounded time, recording per-request latency (benchmark passes).

Loopback only: ``Connection`` refuses any host other than 127.0.0.1 / ::1 / localhost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple

LOOPBACK: Final = frozenset({"127.0.0.1", "::1", "localhost"})
IDLE_RECONNECT_SECONDS: Final = 4.0  # uvicorn closes idle keep-alive connections after 5 s
DEFAULT_TIMEOUT: Final = 30.0


class Response(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


class HTTPLoadError(ConnectionError):
    """The connection failed or the answer was not parseable HTTP/1.1."""


def build_request(
    method: str,
    path: str,
    host: str,
    port: int,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
) -> bytes:
    """The raw bytes of an HTTP/1.1 keep-alive request."""
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}:{port}"]
    if headers:
        lines.extend(f"{name}: {value}" for name, value in headers.items())
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _check_loopback(host: str) -> None:
    if host not in LOOPBACK:
        raise ValueError(f"httpload talks to loopback only, not {host!r}")


class Connection:
    """One keep-alive connection; ``send`` is not re-entrant (one request at a time)."""

    def __init__(self, host: str, port: int) -> None:
        _check_loopback(host)
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._last_used = 0.0

    async def connect(self) -> None:
        await self.close()
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._last_used = time.monotonic()

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def send(self, raw: bytes, retry: bool = False) -> Response:
        """Send pre-built request bytes and read the answer.

        ``retry``: resend once on a fresh connection when a reused one turns out broken
        (only for requests that are safe to repeat).
        """
        fresh = False
        if self._writer is None or time.monotonic() - self._last_used > IDLE_RECONNECT_SECONDS:
            await self.connect()
            fresh = True
        try:
            return await self._exchange(raw)
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
            await self.close()
            if retry and not fresh:
                await self.connect()
                try:
                    return await self._exchange(raw)
                except (ConnectionError, asyncio.IncompleteReadError, OSError) as again:
                    await self.close()
                    raise HTTPLoadError(f"request failed: {again!r}") from again
            raise HTTPLoadError(f"request failed: {exc!r}") from exc

    async def _exchange(self, raw: bytes) -> Response:
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        writer.write(raw)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1."):
            raise HTTPLoadError(f"not an HTTP/1.x answer: {head[:40]!r}")
        status = int(head[9:12])
        headers: dict[str, str] = {}
        for line in head[:-4].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        length = headers.get("content-length")
        if length is not None:
            body = await reader.readexactly(int(length)) if length != "0" else b""
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(reader)
        elif status in (204, 304) or 100 <= status < 200:
            body = b""
        else:
            body = await reader.read()  # delimited by the connection closing
            await self.close()
        if headers.get("connection", "").lower() == "close" and self._writer is not None:
            await self.close()
        self._last_used = time.monotonic()
        return Response(status, headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    for _ in range(1_000_000):  # bounded: a chunked body of a million chunks is not an answer
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
    raise HTTPLoadError("chunked body too long")


class Pool:
    """``size`` keep-alive connections shared by any number of tasks."""

    def __init__(self, host: str, port: int, size: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        _check_loopback(host)
        self.host = host
        self.port = port
        self.timeout = timeout
        self._free: asyncio.Queue[Connection] = asyncio.Queue()
        self._all = [Connection(host, port) for _ in range(size)]
        for connection in self._all:
            self._free.put_nowait(connection)

    def idle(self) -> int:
        """Connections free right now."""
        return self._free.qsize()

    def build(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
    ) -> bytes:
        return build_request(method, path, self.host, self.port, headers, body)

    async def send(self, raw: bytes, retry: bool = False, timeout: float | None = None) -> Response:
        """Send pre-built bytes on a free connection (waits for one), bounded by ``timeout``."""
        connection = await self._free.get()
        try:
            async with asyncio.timeout(self.timeout if timeout is None else timeout):
                return await connection.send(raw, retry=retry)
        except TimeoutError:
            await connection.close()  # the answer may still come: never reuse this stream
            raise
        finally:
            self._free.put_nowait(connection)

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        retry: bool = False,
        timeout: float | None = None,
    ) -> Response:
        return await self.send(self.build(method, path, headers, body), retry, timeout)

    async def close(self) -> None:
        for connection in self._all:
            await connection.close()


class PassResult(NamedTuple):
    latencies: list[float]  # seconds, one per completed request
    statuses: dict[int, int]
    errors: int  # connection errors and timeouts
    elapsed: float


async def closed_loop(
    host: str,
    port: int,
    requests: Sequence[bytes],
    concurrency: int,
    seconds: float,
    max_requests: int = 1_000_000,
    check: Callable[[Response], bool] | None = None,
) -> PassResult:
    """``concurrency`` connections each sending ``requests`` (cycled) back to back.

    Stops after ``seconds`` or ``max_requests`` in total, whichever comes first. ``check``
    may reject a 200 answer (counted under status 0).
    """
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    started = time.perf_counter()
    deadline = started + seconds
    budget = [max_requests]

    async def worker(offset: int) -> None:
        nonlocal errors
        connection = Connection(host, port)
        await connection.connect()
        k = offset
        perf = time.perf_counter
        try:
            while budget[0] > 0:
                now = perf()
                if now >= deadline:
                    break
                budget[0] -= 1
                raw = requests[k % len(requests)]
                k += 1
                try:
                    response = await connection.send(raw, retry=True)
                except HTTPLoadError:
                    errors += 1
                    continue
                latencies.append(perf() - now)
                status = response.status
                if check is not None and status == 200 and not check(response):
                    status = 0
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            await connection.close()

    tasks = [asyncio.ensure_future(worker(i * 7919)) for i in range(concurrency)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=seconds + DEFAULT_TIMEOUT)
    except TimeoutError:
        errors += 1
    return PassResult(latencies, statuses, errors, time.perf_counter() - started)

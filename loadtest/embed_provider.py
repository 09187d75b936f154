"""A test embeddings provider: a real uvicorn server answering OpenAI-shaped
``POST /v1/embeddings`` after ``delay`` seconds (each request on its own, not blocking the
others), counting the requests and the texts it is asked. Vectors are derived from each text's
bytes (64 dimensions), so equal texts get equal vectors anywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from typing import Final

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

DIM: Final = 64


def vector(text: str) -> list[float]:
    digest = hashlib.sha512(text.encode("utf-8", "surrogatepass")).digest()
    return [b / 255.0 - 0.5 for b in digest[:DIM]]


class CountingProvider:
    """Start it, point ``[embeddings] url`` at ``url``; ``texts`` counts what it was asked.
    ``unavailable_to``: requests bearing this API key are answered 503 and not counted (a
    provider that fails for one caller alone)."""

    def __init__(self, delay: float = 0.0, unavailable_to: str | None = None) -> None:
        self.delay = delay
        self.requests = 0
        self.texts = 0
        self.asked: list[str] = []  # every text asked, in order
        self._lock = threading.Lock()

        async def embeddings(request: Request) -> JSONResponse:
            if (
                unavailable_to
                and request.headers.get("authorization") == f"Bearer {unavailable_to}"
            ):
                return JSONResponse({"error": "unavailable to this key"}, status_code=503)
            body = await request.json()
            with self._lock:
                self.requests += 1
                self.texts += len(body["input"])
                self.asked.extend(body["input"])
            await asyncio.sleep(self.delay)
            data = [
                {"object": "embedding", "index": i, "embedding": vector(text)}
                for i, text in enumerate(body["input"])
            ]
            return JSONResponse({"object": "list", "data": data, "model": body["model"]})

        app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the test provider did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()

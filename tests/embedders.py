"""Embedders for the tests: ``FakeServer``, an OpenAI-compatible ``/v1/embeddings`` endpoint
on loopback that records what it was asked (``config`` points kbgraph at it);
``HashEmbedder``, deterministic vectors from a text's hash; and ``vectors_of``, a KB's vectors
as the projection holds them."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kbgraph.config import EmbeddingsConfig
from kbgraph.embeddings.local import LocalEmbedder
from kbgraph.projection import Projections

LOCAL = LocalEmbedder()  # the model FakeServer answers with (the tests compare against it)


class FakeServer:
    """``POST /v1/embeddings``; ``delay`` seconds before answering, ``fail`` 503s first,
    400 (a context-length error) for a batch holding a text longer than ``refuse_over``, and
    no answer while ``gate`` is closed (a provider that hangs)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.keys: list[str] = []
        self.delay = 0.0
        self.fail = 0
        self.refuse_over = 0
        self.gate = threading.Event()
        self.gate.set()

        async def embeddings(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            self.keys.append(request.headers.get("authorization", ""))
            while not self.gate.wait(0.05) and not self.server.should_exit:
                await asyncio.sleep(0)
            if self.delay:
                time.sleep(self.delay)  # blocks this server's loop: a slow server
            if self.refuse_over and max(map(len, body["input"])) > self.refuse_over:
                return JSONResponse({"error": {"code": "context_length_exceeded"}}, 400)
            if self.fail:
                self.fail -= 1
                return JSONResponse({"error": "busy"}, 503)
            vectors = LOCAL.embed(body["input"]) * 3.0  # not unit: the client normalises
            data = [
                {"object": "embedding", "index": i, "embedding": v.tolist()}
                for i, v in reversed(list(enumerate(vectors)))  # any order: sorted by index
            ]
            return JSONResponse({"object": "list", "data": data, "model": body["model"]})

        app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def start(self) -> None:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def texts(self) -> int:
        """How many texts it was asked to embed."""
        return sum(len(r["input"]) for r in self.requests)


def config(url: str, **kwargs) -> EmbeddingsConfig:
    fields = {"provider": "openai", "url": url, "model": "m", "api_key_env": "KBG_TEST_KEY"}
    return EmbeddingsConfig(**(fields | kwargs))


def vectors_of(p: Projections, kb_name: str = "homelab") -> dict[str, bytes]:
    """Each concept's quantised vector and scale, as bytes, by id: what two projections of
    one KB must agree on."""
    kb = p.get(kb_name)
    assert kb is not None, kb_name
    with kb.read() as snap:
        v = snap.vectors
        return {
            snap.ids[u]: v.q8[u].tobytes() + v.scale[u].tobytes()
            for u in range(len(snap.ids))
            if u < v.cap and v.have[u]
        }


class HashEmbedder:
    """A deterministic stand-in model: each text's unit vector from its bytes."""

    name = "hash-64"
    remote = False

    def embed(self, texts: list[str]) -> np.ndarray:
        digests = b"".join(hashlib.sha512(text.encode()).digest() for text in texts)
        out = np.frombuffer(digests, np.int8).astype(np.float32).reshape(len(texts), 64) + 0.5
        return out / np.linalg.norm(out, axis=1, keepdims=True)

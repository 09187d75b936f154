"""The application factory: the routes of ``kbgraph/http/``, the service's lifespan (store,
projections, the JetStream log, warm-ups) and its middlewares.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kbgraph.agent import toolspecs
from kbgraph.config import CONFIG_ENV, Config, load_config
from kbgraph.events import SignatureVerifier
from kbgraph.http import explorer, ingest
from kbgraph.http import mcp as mcp_out
from kbgraph.http.health import WriteProbe
from kbgraph.http.openapi import document as openapi_document
from kbgraph.http.origins import HostOriginCheck
from kbgraph.http.routes import (
    MCPEndpoint,
    concept_handler,
    encode_json,
    healthz,
    internal_error,
    kbs_handler,
    log,
    metrics,
    observed,
    readyz,
    search_handler,
    starlette_error,
    status_handler,
    tool_route,
)
from kbgraph.service import Service


def create_app(config: Config) -> Starlette:
    """The whole service: agent API, webhook ingest, health and metrics."""
    openapi = encode_json(openapi_document(explorer.OPENAPI_PATHS))
    listing = encode_json(toolspecs.http_listing())

    service = Service(config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for door in config.open_doors():  # loud: a config taken as written may be a mistake
            log.warning("door open: %s (served on loopback names only)", door)
        await anyio.to_thread.run_sync(service.open)  # kbgraph.service: built in one place
        app.state.store = service.store
        app.state.projections = service.projections
        app.state.tool_threads = service.tool_threads
        await service.follow()
        mcp_manager = mcp_out.http_session_manager(lambda: service.tool_threads)
        app.state.mcp = mcp_manager
        app.state.ready = True
        try:
            async with mcp_manager.run():  # the SDK's task group lives as long as the app
                yield
        finally:
            app.state.ready = False
            await service.close()

    async def ready(request: Request) -> Response:
        return await readyz(request, service)

    async def openapi_json(request: Request) -> Response:
        return Response(openapi, media_type="application/json")

    async def tools_json(request: Request) -> Response:
        return Response(listing, media_type="application/json")

    routes = [
        *[tool_route(spec) for spec in toolspecs.HTTP_TOOLS],
        Route("/v1/kbs", observed("kbs", kbs_handler), methods=["GET"]),
        Route("/v1/kbs/{kb}/search", observed("search", search_handler), methods=["GET"]),
        Route(
            "/v1/kbs/{kb}/concepts/{concept_id:concept_id}",
            observed("concept", concept_handler),
            methods=["GET"],
        ),
        Route("/v1/kbs/{kb}/status", observed("status", status_handler), methods=["GET"]),
        Route("/v1/kbs/{kb}/mcp", MCPEndpoint(), methods=["GET", "POST", "DELETE"]),
        Route("/v1/tools", tools_json, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *ingest.routes(service),
        *explorer.routes,
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: starlette_error,  # routing's 404/405, in JSON
            Exception: internal_error,  # a bug: JSON too, and nothing of it in the body
        },
    )
    app.router.redirect_slashes = False  # its redirect would echo the Host header: 404 instead
    app.add_middleware(
        HostOriginCheck,
        reads_open=not config.tokens,
        ingest_open=lambda kb: not config.webhooks.secrets_for(kb),
        allowed_origins=frozenset(config.server.allowed_origins),
    )
    app.state.config = config
    app.state.write_probe = WriteProbe(config.store.path)
    app.state.tokens = config.token_index()
    app.state.verifier = SignatureVerifier(list(config.webhooks.secrets))
    app.state.kb_verifiers = {
        kb: SignatureVerifier(list(own.secrets)) for kb, own in config.webhooks.kbs.items()
    }
    app.state.inflight = ingest.InflightBytes(config.limits.max_inflight_ingest_bytes)
    app.state.ready = False
    return app


def app_from_env() -> Starlette:
    """uvicorn factory (``kbgraph.api:app_from_env``): the config path comes from the env."""
    return create_app(load_config(os.environ[CONFIG_ENV]))

"""The application factory, the composition root: the service and the one ``AppContext``
(``kbgraph.http.context``) every route of ``kbgraph/http/`` is handed, the service's lifespan
(store, projections, the delivery log, warm-ups) and its middlewares.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kbgraph.agent import toolspecs
from kbgraph.config import CONFIG_ENV, Config, load_config
from kbgraph.http import explorer, ingest, routes
from kbgraph.http import mcp as mcp_out
from kbgraph.http.context import AppContext
from kbgraph.http.openapi import document as openapi_document
from kbgraph.http.origins import EVENTS_PATH, HostOriginCheck
from kbgraph.http.routes import encode_json, internal_error, log, starlette_error
from kbgraph.service import Service


def create_app(config: Config, *, serving: bool = False) -> Starlette:
    """The whole service: agent API, webhook ingest, health and metrics. ``serving``: the
    process is a ``kbgraph serve`` worker, its heap settled once it is ready and after each
    reload of its projections (``kbgraph.service.Service.settle``; never in a process that
    builds apps over and over, such as the tests')."""
    openapi = encode_json(openapi_document(explorer.OPENAPI_PATHS))
    listing = encode_json(toolspecs.http_listing())
    service = Service(config)
    context = AppContext.build(config, service)  # the one thing every route is handed
    running = context.running

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for door in config.open_doors():  # loud: a config taken as written may be a mistake
            log.warning("door open: %s (served on loopback names only)", door)
        await anyio.to_thread.run_sync(service.open)  # kbgraph.service: built in one place
        await service.follow()
        running.mcp = mcp_out.http_session_manager(lambda: service.tool_threads)
        if serving:
            service.settle()
        running.ready = True
        try:
            async with running.mcp.run():  # the SDK's task group lives as long as the app
                yield
        finally:
            running.ready = False
            running.mcp = None
            await service.close()

    async def openapi_json(request: Request) -> Response:
        return Response(openapi, media_type="application/json")

    async def tools_json(request: Request) -> Response:
        return Response(listing, media_type="application/json")

    hot = ingest.routes(context)
    app = App(
        routes=[
            *hot,  # first: the hot path, matched before any other
            *routes.routes(context),
            Route("/v1/tools", tools_json, methods=["GET"]),
            Route("/openapi.json", openapi_json, methods=["GET"]),
            *explorer.routes,
        ],
        lifespan=lifespan,
        exception_handlers={
            HTTPException: starlette_error,  # routing's 404/405, in JSON
            Exception: internal_error,  # a bug: JSON too, and nothing of it in the body
        },
    )
    app.router.redirect_slashes = False  # its redirect would echo the Host header: 404 instead
    reads_open = not config.tokens
    allowed = frozenset(config.server.allowed_origins)

    def ingest_open(kb: str) -> bool:
        return not config.webhooks.secrets_for(kb)

    app.add_middleware(
        HostOriginCheck, reads_open=reads_open, ingest_open=ingest_open, allowed_origins=allowed
    )
    app.ingest = ServerErrorMiddleware(
        HostOriginCheck(hot[0].app, reads_open, ingest_open, allowed), handler=internal_error
    )
    app.state.context = context  # for context_of: the one use of app.state
    return app


class App(Starlette):
    """The service's Starlette app, but a webhook delivery (``POST /v1/kbs/{kb}/events``, the
    hot path) skips the layers that do nothing for it: ``ServerErrorMiddleware`` and
    ``HostOriginCheck`` run as in the full stack, then the route's ``PostEvents`` with the
    path's ``kb``, as the router would call it; the exception middleware (its handlers are for
    ``HTTPException``, which ``PostEvents`` never raises) and the router's matching are not
    run. Every other request (another method or path, a ``root_path``) takes the full stack."""

    ingest: ASGIApp | None = None  # the hot path's stack, set by create_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.ingest is not None and scope["type"] == "http" and scope["method"] == "POST":
            match = EVENTS_PATH.fullmatch(scope["path"])
            if match is not None and not scope.get("root_path"):
                scope["app"] = self
                scope["path_params"] = {"kb": match[1]}
                await self.ingest(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def context_of(app: ASGIApp) -> AppContext:
    """The context ``create_app`` built ``app`` around, for a test or tool holding the app (a
    test client's ``app``, say)."""
    if not isinstance(app, Starlette):
        raise TypeError(f"not an app create_app made: {app!r}")
    context: AppContext = app.state.context
    return context


def app_from_env() -> Starlette:
    """uvicorn factory (``kbgraph.api:app_from_env``): the config path comes from the env."""
    return create_app(load_config(os.environ[CONFIG_ENV], quiet=True), serving=True)  # serve warned

"""HTTP out: the Starlette application serving agents (SPEC section 3) and the webhook.

Request path of a tool call: bearer token -> the caller's rules for the KB (no rule answers
as a missing KB) -> ``X-Min-Seq`` wait -> body decoded with msgspec -> the tool runs in a
worker thread under the KB's read lock (a delivery-whole snapshot; the compiled algorithms
release the GIL) -> deterministic JSON bytes with ``X-KB-Seq``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread
import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kbgraph import evidence, graphalgo, ingest, search, tools
from kbgraph import mcp as mcp_out
from kbgraph.access import RuleSet
from kbgraph.bodies import BodyRefused, read_body, replay
from kbgraph.config import Config, TokenGrant, load_config
from kbgraph.events import SignatureVerifier
from kbgraph.health import WriteProbe
from kbgraph.ingest import error_response
from kbgraph.names import is_kb_name
from kbgraph.projection import KBProjection, Projections, Snapshot
from kbgraph.store import Store
from kbgraph.threads import ToolThreads

CONFIG_ENV: Final = "KBGRAPH_CONFIG"
TOOL_THREADS: Final = 2  # one per core: the kernels run in parallel, the Python parts share the GIL
MAX_SEQ_DIGITS: Final = 19  # X-Min-Seq: plain decimal digits only
_ADMIN: Final = TokenGrant(name="anonymous-admin", admin=True, rules={})

REQUEST_SECONDS = Histogram(
    "kbgraph_request_seconds",
    "Agent API request latency by route and status.",
    ["route", "status"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5, 10.0),
)

_encode = msgspec.json.Encoder().encode
Req = TypeVar("Req")


class ConceptIdConvertor(Convertor[str]):
    """A concept id in a path: any characters, slashes and newlines too (``path`` stops at a
    newline, and an id with one must still answer ``not found: <id>`` in JSON)."""

    regex = r"[\s\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("concept_id", ConceptIdConvertor())


class HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encode(body), status, headers, media_type="application/json")


# --- who is calling, and what may they see -------------------------------------------------


def authenticate(request: Request) -> TokenGrant:
    tokens: dict[str, TokenGrant] = request.app.state.tokens
    if not tokens:
        return _ADMIN  # authentication off: allowed on loopback only (the CLI refuses others)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    grant = None
    if scheme.lower() == "bearer" and token.strip():
        grant = tokens.get(hashlib.sha256(token.strip().encode()).hexdigest())
    if grant is None:
        raise HTTPError(401, "missing or unknown bearer token", {"WWW-Authenticate": "Bearer"})
    return grant


def kb_not_found(kb: str) -> HTTPError:
    return HTTPError(404, f"not found: kb {kb}")


def rules_for(grant: TokenGrant, kb: str) -> RuleSet | None:
    """The caller's rules for ``kb`` (None: admin). A KB without a rule answers as missing."""
    if not is_kb_name(kb):
        raise kb_not_found(kb)
    if grant.admin:
        return None
    rules = grant.rules.get(kb)
    if not rules:
        raise kb_not_found(kb)
    return rules


async def open_kb(request: Request, kb: str) -> KBProjection:
    """The KB's projection, once it has applied ``X-Min-Seq`` (bounded wait, else 503)."""
    projections: Projections = request.app.state.projections
    raw = request.headers.get("x-min-seq")
    if raw is not None:
        if not (raw.isascii() and raw.isdigit() and len(raw) <= MAX_SEQ_DIGITS):
            shown = raw if len(raw) <= 40 else raw[:40] + "…"
            raise HTTPError(422, f"X-Min-Seq: expected up to 19 digits 0-9, got {shown!r}")
        min_seq = int(raw)
        timeout = request.app.state.config.server.min_seq_wait_seconds
        if min_seq > 0 and not await projections.wait_for(kb, min_seq, timeout):
            raise HTTPError(503, f"not yet at seq {min_seq}: try again", {"Retry-After": "1"})
    projection = projections.get(kb)
    if projection is None:
        raise kb_not_found(kb)
    return projection


async def gate(request: Request) -> tuple[KBProjection, RuleSet | None]:
    """Token, the caller's rules for the path's KB, ``X-Min-Seq``: every read's first steps."""
    grant = authenticate(request)
    kb = request.path_params["kb"]
    rules = rules_for(grant, kb)
    return await open_kb(request, kb), rules


def decode_body(body: bytes, request_type: type[Req]) -> Req:
    try:
        return tools.decode_request(body, request_type)
    except tools.ToolError as exc:
        raise HTTPError(exc.status, exc.message) from None


# --- endpoints -----------------------------------------------------------------------------


Handler = Callable[[Request], Awaitable[Response]]


def observed(route: str, handler: Handler) -> Handler:
    """Time the handler into the metrics and turn HTTPError into its JSON answer."""
    histogram: dict[int, Any] = {}

    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except (HTTPError, BodyRefused) as exc:
            response = error_response(exc.status, exc.message, exc.headers)
        except tools.ToolError as exc:
            response = error_response(exc.status, exc.message)
        status = response.status_code
        child = histogram.get(status)
        if child is None:
            child = histogram[status] = REQUEST_SECONDS.labels(route, str(status))
        child.observe(time.perf_counter() - started)
        return response

    return endpoint


async def run_on_snapshot(
    request: Request,
    projection: KBProjection,
    rules: RuleSet | None,
    compute: Callable[[Snapshot, Any], Any],
) -> Response:
    """Run ``compute(snapshot, view)`` in a worker thread under the KB's read lock.

    The response bytes are encoded in the worker too, so the event loop only moves bytes.
    """

    def work() -> tuple[int, bytes]:
        with projection.read() as snap:
            body = compute(snap, snap.view(rules))
            return snap.seq, _encode(body)

    seq, body = await request.app.state.tool_threads.run(work)
    return Response(body, headers={"X-KB-Seq": str(seq)}, media_type="application/json")


def tool_route(name: str, request_type: type[Req], tool: Callable[..., Any]) -> Route:
    async def handler(request: Request) -> Response:
        projection, rules = await gate(request)  # 404 for a missing KB before the body
        req = decode_body(await read_body(request), request_type)
        return await run_on_snapshot(
            request, projection, rules, lambda snap, view: tool(snap, view, req)
        )

    return Route(f"/v1/kbs/{{kb}}/tools/{name}", observed(name, handler), methods=["POST"])


async def search_handler(request: Request) -> Response:
    projection, rules = await gate(request)
    query = request.query_params.get("q")
    if query is None:
        raise HTTPError(422, "'q' is required")
    raw_limit = request.query_params.get("limit", "0") or "0"
    try:
        limit = int(raw_limit)
    except ValueError:
        raise HTTPError(422, f"limit: Expected int, got {raw_limit!r}") from None
    return await run_on_snapshot(
        request, projection, rules, lambda snap, view: tools.search(snap, view, query, limit)
    )


async def concept_handler(request: Request) -> Response:
    projection, rules = await gate(request)
    concept_id = request.path_params["concept_id"]
    return await run_on_snapshot(
        request, projection, rules, lambda snap, view: tools.concept(snap, view, concept_id)
    )


async def status_handler(request: Request) -> Response:
    projection, rules = await gate(request)
    kb = request.path_params["kb"]
    return await run_on_snapshot(
        request, projection, rules, lambda snap, view: tools.status(snap, view, kb)
    )


class MCPEndpoint:
    """``/v1/kbs/{kb}/mcp``: the gate answers refusals as the API does (401, 404 JSON), then
    hands the request, its caller in the scope, to the MCP SDK's session manager."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            projection, rules = await gate(request)
            if scope["method"] == "POST":  # the SDK would read any size: bound it first
                receive = replay(await read_body(request), receive)
        except (HTTPError, BodyRefused) as exc:
            await error_response(exc.status, exc.message, exc.headers)(scope, receive, send)
            return
        scope[mcp_out.SCOPE_KEY] = mcp_out.Caller(projection, rules)
        await request.app.state.mcp.handle_request(scope, receive, send)


async def starlette_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such path, wrong method) as JSON errors too."""
    assert isinstance(exc, HTTPException)
    message = "not found" if exc.status_code == 404 else exc.detail
    return error_response(exc.status_code, f"{message}: {request.url.path}", exc.headers)


async def internal_error(request: Request, exc: Exception) -> Response:
    """An unexpected exception: logged by uvicorn, answered as a bare JSON 500."""
    return error_response(500, "internal error")


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready once the projection is built and the kernels compiled; not ready again if the
    follower stopped (it does when applying a record fails, rather than serve a stale graph)
    or while the store cannot write (``kbgraph.health.WriteProbe``)."""
    if not getattr(request.app.state, "ready", False):
        return error_response(503, "starting: building the projection")
    failure = request.app.state.projections.error
    if failure is not None:
        return error_response(503, f"projection stopped following the log: {failure!r}")
    problem = await request.app.state.write_probe.problem()
    if problem is not None:
        return error_response(503, problem)
    return json_response({"status": "ready"})


async def metrics(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


TOOLS: Final = (
    ("graph_context", tools.GraphContextRequest, tools.GraphContextResponse, tools.graph_context,
     False, "Concepts around a question or given concepts, ranked by personalized PageRank, "
     "each with its hop count and the concept it was reached through."),
    ("link_suggest", tools.LinkSuggestRequest, tools.LinkSuggestResponse, tools.link_suggest,
     False, "Missing links for a concept by resource allocation (at least two shared "
     "neighbours)."),
    ("graph_path", tools.GraphPathRequest, tools.GraphPathResponse, tools.graph_path,
     True, "The shortest chain of links between two concepts."),
)  # fmt: skip


def tools_listing() -> list[dict[str, Any]]:
    listing = []
    for name, request_type, _, _, advanced, description in TOOLS:
        _, components = msgspec.json.schema_components(
            [request_type], ref_template="#/$defs/{name}"
        )
        listing.append(
            {
                "name": name,
                "description": description,
                "advanced": advanced,
                "method": "POST",
                "path": f"/v1/kbs/{{kb}}/tools/{name}",
                "input_schema": components[request_type.__name__],
            }
        )
    return listing


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1, generated from the msgspec request and response types."""
    types: list[Any] = [t for row in TOOLS for t in row[1:3]]
    types += [tools.SearchResponse, tools.ConceptResponse, tools.StatusResponse]
    _, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    components["Error"] = {
        "type": "object",
        "properties": {"error": {"type": "string"}},
        "required": ["error"],
    }

    def ref(name: str) -> dict[str, Any]:
        return {"$ref": f"#/components/schemas/{name}"}

    def answers(ok: str, *codes: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "200": {"description": "OK", "content": {"application/json": {"schema": ref(ok)}}}
        }
        for code in codes:
            out[str(code)] = {
                "description": "error",
                "content": {"application/json": {"schema": ref("Error")}},
            }
        return out  # fmt: skip

    kb_param = {"name": "kb", "in": "path", "required": True, "schema": {"type": "string"}}
    paths: dict[str, Any] = {}
    for name, request_type, response_type, _, advanced, description in TOOLS:
        paths[f"/v1/kbs/{{kb}}/tools/{name}"] = {
            "post": {
                "operationId": name,
                "summary": description,
                "x-advanced": advanced,
                "parameters": [kb_param],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ref(request_type.__name__)}},
                },
                "responses": answers(response_type.__name__, 400, 401, 404, 422, 503),
            }
        }
    paths["/v1/kbs/{kb}/search"] = {
        "get": {
            "operationId": "search",
            "parameters": [
                kb_param,
                {"name": "q", "in": "query", "required": True, "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "schema": {"type": "integer"}},
            ],
            "responses": answers("SearchResponse", 401, 404, 422, 503),
        }
    }
    paths["/v1/kbs/{kb}/concepts/{id}"] = {
        "get": {
            "operationId": "concept",
            "parameters": [
                kb_param,
                {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
            ],
            "responses": answers("ConceptResponse", 401, 404, 503),
        }
    }
    paths["/v1/kbs/{kb}/mcp"] = {"post": {
        "operationId": "mcp", "parameters": [kb_param],
        "summary": "MCP streamable HTTP (stateless, JSON answers): the tools as MCP tools.",
        "requestBody": {"required": True, "content": {"application/json": {}}},
        "responses": {"200": {"description": "a JSON-RPC answer"},
                      **{k: v for k, v in answers("StatusResponse", 401, 404, 503).items()
                         if k != "200"}}}}  # fmt: skip
    paths["/v1/kbs/{kb}/status"] = {"get": {
        "operationId": "status", "parameters": [kb_param],
        "responses": answers("StatusResponse", 401, 404, 503)}}  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {"title": "kbgraph", "version": "0.1.0"},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }


def create_app(config: Config) -> Starlette:
    """The whole service: agent API, webhook ingest, health and metrics."""
    openapi = _encode(openapi_document())
    listing = _encode(tools_listing())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Tools run here, off the event loop; the compiled kernels release the GIL.
        tool_threads = ToolThreads(TOOL_THREADS)
        app.state.tool_threads = tool_threads
        store = Store(config.store.path)
        projections = Projections(store)
        app.state.store = store
        app.state.projections = projections
        app.state.on_commit = projections.kick
        await anyio.to_thread.run_sync(projections.start)
        await anyio.to_thread.run_sync(graphalgo.warm_up)
        await anyio.to_thread.run_sync(search.warm_up)
        await anyio.to_thread.run_sync(evidence.warm_up)
        mcp_manager = mcp_out.http_session_manager(lambda: tool_threads)
        app.state.mcp = mcp_manager
        app.state.ready = True
        try:
            async with mcp_manager.run():  # the SDK's task group lives as long as the app
                yield
        finally:
            app.state.ready = False
            tool_threads.close()
            projections.stop()
            store.close()

    async def openapi_json(request: Request) -> Response:
        return Response(openapi, media_type="application/json")

    async def tools_json(request: Request) -> Response:
        return Response(listing, media_type="application/json")

    routes = [
        *[tool_route(name, request_type, tool) for name, request_type, _, tool, _, _ in TOOLS],
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
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *ingest.routes,
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
    app.state.config = config
    app.state.write_probe = WriteProbe(config.store.path)
    app.state.tokens = config.token_index()
    app.state.verifier = SignatureVerifier(list(config.webhooks.secrets))
    app.state.ready = False
    return app


def app_from_env() -> Starlette:
    """uvicorn factory (``kbgraph.api:app_from_env``): the config path comes from the env."""
    return create_app(load_config(os.environ[CONFIG_ENV]))

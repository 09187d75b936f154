"""HTTP out: the Starlette application serving agents (docs/api.md) and the webhook.

Request path of a tool call: bearer token -> the caller's rules for the KB (no rule answers
as a missing KB) -> ``X-Min-Seq`` wait -> body decoded with msgspec -> the tool runs in a
worker thread under the KB's read lock (a delivery-whole snapshot; the compiled algorithms
release the GIL) -> deterministic JSON bytes with ``X-KB-Seq``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Final

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, Histogram, generate_latest
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kbgraph.access import RuleSet
from kbgraph.agent import retrieval, shapes, tools, toolspecs
from kbgraph.agent.calls import Caller, call
from kbgraph.agent.retrieval import Meaning, needs_meaning
from kbgraph.config import TokenGrant
from kbgraph.events import Refused
from kbgraph.http import mcp as mcp_out
from kbgraph.http.bodies import BodyRefused, read_body, replay
from kbgraph.http.context import AppContext
from kbgraph.http.ingest import error_response
from kbgraph.names import is_kb_name
from kbgraph.projection import KBProjection, Snapshot

MAX_SEQ_DIGITS: Final = 19  # X-Min-Seq: plain decimal digits only
_ADMIN: Final = TokenGrant(name="anonymous-admin", admin=True, rules={})
log = logging.getLogger("kbgraph.api")

REQUEST_SECONDS = Histogram(
    "kbgraph_request_seconds",
    "Agent API request latency by route and status.",
    ["route", "status"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5, 10.0),
)

encode_json = msgspec.json.Encoder().encode


class ConceptIdConvertor(Convertor[str]):
    """A concept id in a path: any characters, slashes and newlines too (``path`` stops at a
    newline, and an id with one must still answer ``not found: <id>`` in JSON)."""

    regex = r"[\s\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("concept_id", ConceptIdConvertor())


class HTTPError(Refused):
    """A request the agent API refuses before any tool runs (token, KB, ``X-Min-Seq``, query)."""


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(encode_json(body), status, headers, media_type="application/json")


# --- who is calling, and what may they see -------------------------------------------------


def authenticate(context: AppContext, request: Request) -> TokenGrant:
    tokens = context.tokens
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


async def open_kb(context: AppContext, request: Request, kb: str) -> KBProjection:
    """The KB's projection, once it has applied ``X-Min-Seq`` (bounded wait, else 503)."""
    projections = context.service.projections
    raw = request.headers.get("x-min-seq")
    if raw is not None:
        if not (raw.isascii() and raw.isdigit() and len(raw) <= MAX_SEQ_DIGITS):
            shown = raw if len(raw) <= 40 else raw[:40] + "…"
            raise HTTPError(422, f"X-Min-Seq: expected up to 19 digits 0-9, got {shown!r}")
        min_seq = int(raw)
        timeout = context.config.server.min_seq_wait_seconds
        if min_seq > 0 and not await projections.wait_for(kb, min_seq, timeout):
            raise HTTPError(503, f"not yet at seq {min_seq}: try again", {"Retry-After": "1"})
    projection = projections.get(kb)
    if projection is None:
        raise kb_not_found(kb)
    return projection


async def gate(context: AppContext, request: Request) -> tuple[KBProjection, RuleSet | None]:
    """Token, the caller's rules for the path's KB, ``X-Min-Seq``: every read's first steps."""
    grant = authenticate(context, request)
    kb = request.path_params["kb"]
    rules = rules_for(grant, kb)
    return await open_kb(context, request, kb), rules


# --- endpoints -----------------------------------------------------------------------------


Handler = Callable[[Request], Awaitable[Response]]
ContextHandler = Callable[[AppContext, Request], Awaitable[Response]]


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
    context: AppContext,
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
            return snap.seq, encode_json(body)

    seq, body = await context.service.tool_threads.run(work)
    return Response(body, headers={"X-KB-Seq": str(seq)}, media_type="application/json")


async def meaning_of(
    context: AppContext, projection: KBProjection, question: str | None
) -> Meaning:
    """The question's vector, before a tool thread or the KB's lock is taken (or none in time)."""
    seconds = context.config.embeddings.query_timeout_seconds
    return await retrieval.embed_meaning(projection.vectors, question, seconds)


def encoded(seq: int, answer: msgspec.Struct) -> tuple[int, bytes]:
    """A tool's answer as the HTTP body, made in its tool thread."""
    return seq, encode_json(answer)


def tool_route(context: AppContext, spec: toolspecs.ToolSpec[Any, Any]) -> Route:
    async def handler(request: Request) -> Response:
        projection, rules = await gate(context, request)  # 404 for a missing KB before the body
        body = await read_body(request, context.config.limits.max_request_bytes)
        caller = Caller(projection, rules, context.config.embeddings.query_timeout_seconds)
        seq, answer = await call(spec, caller, body, context.service.tool_threads, encoded)
        return Response(answer, headers={"X-KB-Seq": str(seq)}, media_type="application/json")

    path = f"/v1/kbs/{{kb}}/tools/{spec.name}"
    return Route(path, observed(spec.name, handler), methods=["POST"])


async def kbs_handler(context: AppContext, request: Request) -> Response:
    """``GET /v1/kbs``: the KBs this token may see (a KB it has no rule for is not named),
    each with its visible concept and link counts."""
    grant = authenticate(context, request)
    projections = context.service.projections
    names = projections.names() if grant.admin else sorted(grant.rules)

    def work() -> bytes:
        listed = []
        for name in names:
            projection = projections.get(name)
            if projection is None:
                continue
            with projection.read() as snap:
                view = snap.view(None if grant.admin else grant.rules[name])
                listed.append(tools.status(snap, view, name))
        return encode_json(shapes.KBsResponse(kbs=listed, count=len(listed)))

    body = await context.service.tool_threads.run(work)
    return Response(body, media_type="application/json")


async def search_handler(context: AppContext, request: Request) -> Response:
    projection, rules = await gate(context, request)
    query = request.query_params.get("q")
    if query is None:
        raise HTTPError(422, "'q' is required")
    raw_limit = request.query_params.get("limit", "0") or "0"
    try:
        limit = int(raw_limit)
    except ValueError:
        raise HTTPError(422, f"limit: Expected int, got {raw_limit!r}") from None
    mode = request.query_params.get("mode") or None
    meaning = await meaning_of(context, projection, query if needs_meaning(mode) else None)
    return await run_on_snapshot(
        context,
        projection,
        rules,
        lambda snap, view: tools.search(snap, view, query, limit, mode, meaning),
    )


async def concept_handler(context: AppContext, request: Request) -> Response:
    projection, rules = await gate(context, request)
    concept_id = request.path_params["concept_id"]
    return await run_on_snapshot(
        context, projection, rules, lambda snap, view: tools.concept(snap, view, concept_id)
    )


async def status_handler(context: AppContext, request: Request) -> Response:
    projection, rules = await gate(context, request)
    kb = request.path_params["kb"]
    return await run_on_snapshot(
        context, projection, rules, lambda snap, view: tools.status(snap, view, kb)
    )


class MCPEndpoint:
    """``/v1/kbs/{kb}/mcp``: the gate answers refusals as the API does (401, 404 JSON), then
    hands a POST with a JSON body, its caller in the scope, to the MCP SDK's session manager.

    Stateless, the endpoint offers no event stream: ``GET`` (and ``DELETE``, there being no
    session) answer ``405`` as the MCP specification allows, so no stream can be held open.
    """

    def __init__(self, context: AppContext) -> None:
        self.context = context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        context = self.context
        request = Request(scope, receive)
        try:
            projection, rules = await gate(context, request)
            if scope["method"] != "POST":
                raise HTTPError(
                    405,
                    f"{scope['method']} not allowed: this MCP endpoint is stateless, without "
                    "event streams or sessions; POST JSON-RPC messages",
                    {"Allow": "POST"},
                )
            content_type = request.headers.get("content-type", "")
            if content_type.split(";")[0].strip().lower() != "application/json":
                raise HTTPError(415, f"Content-Type {content_type!r}: expected application/json")
            body = await read_body(request, context.config.limits.max_request_bytes)
            receive = replay(body, receive)  # the SDK would read any size
            manager = context.running.mcp
            if manager is None:  # only between two runs of the app's lifespan
                raise HTTPError(503, "starting: the MCP endpoint is not running yet")
        except (HTTPError, BodyRefused) as exc:
            await error_response(exc.status, exc.message, exc.headers)(scope, receive, send)
            return
        seconds = context.config.embeddings.query_timeout_seconds
        scope[mcp_out.SCOPE_KEY] = Caller(projection, rules, seconds)
        await manager.handle_request(scope, receive, send)


async def starlette_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such path, wrong method) as JSON errors too; a mistyped
    tool name is told the tools that exist."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 404 and _TOOL_PATH.fullmatch(path):
        return error_response(404, f"no such tool: {path}; the tools are {_TOOL_NAMES}")
    message = "not found" if exc.status_code == 404 else exc.detail
    return error_response(exc.status_code, f"{message}: {path}", exc.headers)


_TOOL_PATH: Final = re.compile(r"/v1/kbs/[^/]+/tools/[^/]*")
_TOOL_NAMES: Final = ", ".join(spec.name for spec in toolspecs.HTTP_TOOLS)


async def internal_error(request: Request, exc: Exception) -> Response:
    """An unexpected exception: logged by uvicorn, answered as a bare JSON 500."""
    return error_response(500, "internal error")


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(context: AppContext, request: Request) -> Response:
    """Ready once the projection is built and the kernels compiled; not ready again if the
    follower stopped (it does when applying a record fails, rather than serve a stale graph)
    or while the store cannot write (``kbgraph.http.health.WriteProbe``), or while the delivery
    log says why it cannot take deliveries (over JetStream: until this node has applied the
    stream as far as it reached when the node started, among others)."""
    if not context.running.ready:
        return error_response(503, "starting: building the projection")
    service = context.service
    failure = service.projections.error
    if failure is not None:
        return error_response(503, f"projection stopped following the log: {failure!r}")
    problem = await context.write_probe.problem()
    if problem is not None:
        return error_response(503, problem)
    problem = service.log.problem()
    if problem is not None:
        return error_response(503, problem)
    return json_response({"status": "ready"})


async def metrics(context: AppContext, request: Request) -> Response:
    """Prometheus's exposition: its counts are over every KB, so with authentication on only
    an admin token or one with ``metrics = true`` reads them (a scraper's bearer token)."""
    try:
        grant = authenticate(context, request)
    except HTTPError as exc:
        return error_response(exc.status, exc.message, exc.headers)
    if not grant.metrics and not grant.admin:
        return error_response(403, "this token may not read /metrics: needs admin or metrics")
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def routes(context: AppContext) -> list[Route]:
    """The agent API's routes, health and metrics, each handed ``context``."""

    def bound(handler: ContextHandler) -> Handler:
        return partial(handler, context)

    return [
        *[tool_route(context, spec) for spec in toolspecs.HTTP_TOOLS],
        Route("/v1/kbs", observed("kbs", bound(kbs_handler)), methods=["GET"]),
        Route("/v1/kbs/{kb}/search", observed("search", bound(search_handler)), methods=["GET"]),
        Route(
            "/v1/kbs/{kb}/concepts/{concept_id:concept_id}",
            observed("concept", bound(concept_handler)),
            methods=["GET"],
        ),
        Route("/v1/kbs/{kb}/status", observed("status", bound(status_handler)), methods=["GET"]),
        Route("/v1/kbs/{kb}/mcp", MCPEndpoint(context), methods=["GET", "POST", "DELETE"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", bound(readyz), methods=["GET"]),
        Route("/metrics", bound(metrics), methods=["GET"]),
    ]

"""MCP out (docs/agents.md, MCP): the agent tools over the Model Context Protocol, official SDK.

One low-level ``mcp.server.lowlevel.Server`` serves both transports: streamable HTTP at
``/v1/kbs/{kb}/mcp`` (stateless, JSON responses, in the API's Starlette app, the bearer token
and the KB's rule checked by the API before the SDK sees the request) and stdio (``kbgraph
mcp``). A call decodes its arguments into the HTTP API's own request struct, runs the same
function of ``kbgraph.agent.tools`` in a tool thread under the KB's read lock, and answers the HTTP
body as ``structuredContent`` beside a compact text rendering of it for an LLM (``render``).
A refused call is a tool error carrying the HTTP error's message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from kbgraph import __version__
from kbgraph.access import RuleSet
from kbgraph.agent import retrieval, tools
from kbgraph.agent.tools import ToolError
from kbgraph.agent.toolspecs import BY_NAME, SPECS, ToolSpec, input_schema, output_schema
from kbgraph.projection import KBProjection, Projections
from kbgraph.threads import ToolThreads

SCOPE_KEY: Final = "kbgraph.http.mcp.caller"  # the ASGI scope entry the HTTP gate fills
TEXT_LIMIT: Final = 1500  # characters of a concept's text in the rendering (all in structured)
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Caller:
    """Whose call this is: the KB's projection and the token's rules (None: admin), and how
    long a question waits for its vector (``[embeddings] query_timeout_seconds``)."""

    projection: KBProjection
    rules: RuleSet | None
    query_seconds: float


Resolve = Callable[[ServerRequestContext[Any, Any]], Caller]


def tool_listing() -> list[types.Tool]:
    return [
        types.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=input_schema(spec.request_type),
            output_schema=output_schema(spec.response_type),
            annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
            _meta={"advanced": spec.advanced},
        )
        for spec in SPECS
    ]


def build_server(resolve: Resolve, threads: Callable[[], ToolThreads]) -> Server[Any]:
    """The MCP server; ``resolve`` names the caller of a request (or raises ``ToolError``)."""
    listing = types.ListToolsResult(tools=tool_listing())

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        spec = BY_NAME.get(params.name)
        try:
            if spec is None:
                raise ToolError(404, f"unknown tool: {params.name}")
            caller = resolve(ctx)
            request = tools.decode_request(_encode(params.arguments or {}), spec.request_type)
            meaning = await retrieval.embed_meaning(
                caller.projection.vectors, spec.question(request), caller.query_seconds
            )
            body, text = await threads().run(lambda: _answer(spec, caller, request, meaning))
        except ToolError as exc:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=exc.message)], is_error=True
            )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=body
        )

    return Server(
        "kbgraph",
        version=__version__,
        instructions="Graph retrieval over one knowledge base: start with graph_context.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _answer(
    spec: ToolSpec, caller: Caller, request: Any, meaning: retrieval.Meaning
) -> tuple[dict[str, Any], str]:
    """Run in a tool thread: the tool on a read-locked snapshot, then its body and text."""
    with caller.projection.read() as snap:
        response = spec.run(snap, snap.view(caller.rules), request, meaning)
    body = msgspec.to_builtins(response)  # the HTTP body as JSON values (UNSET left out)
    return body, render(spec.name, body)


# --- over HTTP -------------------------------------------------------------------------------


def http_session_manager(threads: Callable[[], ToolThreads]) -> StreamableHTTPSessionManager:
    """Stateless, JSON-answering streamable HTTP; run it with ``.run()`` in the app lifespan.

    The API's gate has put the caller into the ASGI scope before the SDK sees the request.
    """

    def resolve(ctx: ServerRequestContext[Any, Any]) -> Caller:
        caller = ctx.request.scope.get(SCOPE_KEY) if ctx.request is not None else None
        if not isinstance(caller, Caller):  # unreachable through the gate; refuse, never guess
            raise ToolError(401, "missing or unknown bearer token")
        return caller

    return StreamableHTTPSessionManager(
        app=build_server(resolve, threads), stateless=True, json_response=True
    )


# --- over stdio ------------------------------------------------------------------------------


async def serve_stdio(
    projections: Projections, kb: str, rules: RuleSet | None, query_seconds: float
) -> None:
    """Serve one KB over stdin/stdout as one token sees it, until stdin closes."""
    from mcp.server.stdio import stdio_server

    thread_pool = ToolThreads(1, name="kbgraph-mcp")

    def resolve(ctx: ServerRequestContext[Any, Any]) -> Caller:
        projection = projections.get(kb)
        if projection is None:  # the KB may appear later: the follower keeps reading
            raise ToolError(404, f"not found: kb {kb}")
        return Caller(projection, rules, query_seconds)

    server = build_server(resolve, lambda: thread_pool)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        thread_pool.close()


# --- the text an LLM reads -------------------------------------------------------------------


def _name(title: str, concept_id: str) -> str:
    return f"{title} [{concept_id}]" if title and title != concept_id else f"[{concept_id}]"


def _render_context(body: dict[str, Any]) -> list[str]:
    asked = []
    if "query" in body:
        asked.append(f"query {body['query']!r}")
    if "ids" in body:
        asked.append("ids " + ", ".join(body["ids"]))
    lines = [f"graph_context for {' and '.join(asked)}: {len(body['seeds'])} seeds, "
             f"{body['count']} results"]  # fmt: skip
    if body.get("mode") == "lexical":
        lines.append("seeds by words alone")
    if "note" in body:
        lines.append(body["note"])
    titles = {row["id"]: row["title"] for row in body["seeds"] + body["results"]}
    vias = {row["id"]: row["via"] for row in body["results"]}
    seeds = {row["id"] for row in body["seeds"]}
    if body["ranked"]:
        lines.append("Ranked (best first; seeds are the best matches, the rest found by links):")
    for i, row in enumerate(body["ranked"], 1):
        if row["hops"] == 0:
            how = "seed"
        else:
            chain = [row["via"]]  # back towards a seed through the answer's own via links
            while chain[-1] in vias and len(chain) < row["hops"]:
                chain.append(vias[chain[-1]])
            names = [_name(titles.get(c, ""), c) for c in chain]
            if chain[-1] not in seeds:
                names.append("…")
            hops = "1 hop" if row["hops"] == 1 else f"{row['hops']} hops"
            how = f"{hops}, via {' ← '.join(names)}"
        lines.append(f"{i}. {_name(row['title'], row['id'])} score {row['score']:g}, {how}")
        if row["snippet"]:
            lines.append(f"   {row['snippet']}")
    return lines


def _render_suggest(body: dict[str, Any]) -> list[str]:
    lines = [f"link_suggest for [{body['id']}]: {body['count']} candidates"]
    for i, row in enumerate(body["candidates"], 1):
        evidence = f"common neighbours: {', '.join(row['common'])}" if row["common"] else ""
        lines.append(f"{i}. {_name(row['title'], row['id'])} score {row['score']:g}"
                     + (f", {evidence}" if evidence else ""))  # fmt: skip
        if row.get("mention"):
            lines.append(f"   mentioned: {row['mention']}")
    return lines


def _render_path(body: dict[str, Any]) -> list[str]:
    head = f"graph_path [{body['source']}] → [{body['target']}]"
    if not body["path"]:
        return [f"{head}: {body.get('note', 'no path')}"]
    steps = " → ".join(_name(step["title"], step["id"]) for step in body["path"])
    return [f"{head}: {body['hops']} hops", steps]


def _render_search(body: dict[str, Any]) -> list[str]:
    lines = [f"search {body['query']!r} ({body['mode']}): {body['count']} hits"]
    for i, hit in enumerate(body["hits"], 1):
        lines.append(f"{i}. {_name(hit['title'], hit['id'])} score {hit['score']:g}")
        if hit["snippet"]:
            lines.append(f"   {hit['snippet']}")
    return lines


def _render_concept(body: dict[str, Any]) -> list[str]:
    facts = [f"{key} {body[key]}" for key in ("type", "status") if body[key]]
    if body["aliases"]:
        facts.append("also " + ", ".join(body["aliases"]))
    if body["tags"]:
        facts.append("tags " + ", ".join(body["tags"]))
    lines = [_name(body["title"], body["id"]) + (f" ({'; '.join(facts)})" if facts else "")]
    lines.append("links: " + (", ".join(body["links"]) or "none"))
    lines.append("backlinks: " + (", ".join(body["backlinks"]) or "none"))
    text = body["text"]
    if len(text) > TEXT_LIMIT:
        cut = len(text) - TEXT_LIMIT
        text = f"{text[:TEXT_LIMIT]}… ({cut} more characters in the structured content)"
    if text:
        lines += ["", text]
    return lines


_RENDERERS: Final[dict[str, Callable[[dict[str, Any]], list[str]]]] = {
    "graph_context": _render_context,
    "link_suggest": _render_suggest,
    "graph_path": _render_path,
    "search": _render_search,
    "get_concept": _render_concept,
}


def render(tool: str, body: dict[str, Any]) -> str:
    """A compact, numbered text of a tool's body: only what the body holds, nothing more."""
    return "\n".join(_RENDERERS[tool](body))

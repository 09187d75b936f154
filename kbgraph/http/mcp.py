"""MCP out (docs/agents.md, MCP): the agent tools over the Model Context Protocol, official SDK.

One low-level ``mcp.server.lowlevel.Server`` serves both transports: streamable HTTP at
``/v1/kbs/{kb}/mcp`` (stateless, JSON responses, in the API's Starlette app, the bearer token
and the KB's rule checked by the API before the SDK sees the request) and stdio (``kbgraph
mcp``). A call runs as an HTTP tool call does (``kbgraph.agent.calls.call``: its arguments
decoded into the HTTP API's own request struct, the tool in a tool thread under the KB's read
lock) and answers the HTTP body as ``structuredContent`` beside the text its spec renders of it
for an LLM (``kbgraph.agent.render``). A refused call is a tool error carrying the HTTP error's
message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from kbgraph import __version__
from kbgraph.access import RuleSet
from kbgraph.agent.calls import Caller, call
from kbgraph.agent.tools import ToolError
from kbgraph.agent.toolspecs import BY_NAME, SPECS, ToolSpec, input_schema, output_schema
from kbgraph.projection import Projections
from kbgraph.threads import ToolThreads

SCOPE_KEY: Final = "kbgraph.http.mcp.caller"  # the ASGI scope entry the HTTP gate fills
_encode = msgspec.json.Encoder().encode

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
            arguments = _encode(params.arguments or {})
            body, text = await call(spec, caller, arguments, threads(), _answer(spec))
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
    spec: ToolSpec[Any, Any],
) -> Callable[[int, msgspec.Struct], tuple[dict[str, Any], str]]:
    """What a call answers (in its tool thread): the HTTP body as JSON values (``UNSET`` left
    out) and the spec's text of it."""

    def finish(seq: int, response: msgspec.Struct) -> tuple[dict[str, Any], str]:
        body: dict[str, Any] = msgspec.to_builtins(response)
        return body, "\n".join(spec.render(body))

    return finish


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

"""The tools as served: one catalogue that the HTTP API, MCP and the OpenAPI document all read.

Each ``ToolSpec`` names a tool, its msgspec request and response types (whose field metadata
carries every description, default, bound and allowed value: ``kbgraph.agent.shapes``), the
function that answers it (typed: mypy checks it takes the request and gives the response), the
text MCP shows of its answer (``kbgraph.agent.render``), the description an agent reads and the
route the docs name it by (``docs/agents.md``'s endpoints table; ``tests/test_toolspecs.py``
checks each is there). Nothing here is written twice: the JSON Schemas of ``/v1/tools``,
``/openapi.json`` and MCP's ``tools/list`` are generated from it, and HTTP and MCP run a tool
through one sequence (``kbgraph.agent.calls``).

A new tool is its request and response types (``shapes``), its function and its renderer (a
module of its own, or ``tools`` and ``render``), and one ``ToolSpec`` below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import msgspec

from kbgraph.agent import render, retrieval, shapes, tools
from kbgraph.graphalgo import View
from kbgraph.projection.snapshot import Snapshot

Req = TypeVar("Req", bound=msgspec.Struct)
Resp = TypeVar("Resp", bound=msgspec.Struct)


def no_question(request: object) -> None:
    """A tool that wants no vector."""
    return None


@dataclass(frozen=True, slots=True)
class ToolSpec(Generic[Req, Resp]):
    name: str
    request_type: type[Req]
    response_type: type[Resp]
    run: Callable[[Snapshot, View, Req, retrieval.Meaning], Resp]
    render: Callable[[dict[str, Any]], list[str]]  # MCP's text: lines of the body's JSON values
    description: str
    route: str  # "METHOD path" as docs/agents.md's endpoints table names it
    advanced: bool = False
    http_post: bool = True  # served at POST /v1/kbs/{kb}/tools/{name} (else a GET route)
    # the text whose vector the tool wants (embedded before the lock: kbgraph.agent.retrieval)
    question: Callable[[Req], str | None] = no_question


def _post(name: str) -> str:
    return f"POST /v1/kbs/{{kb}}/tools/{name}"


# Each tool's function as a spec runs it, (snapshot, view, request, meaning) -> response, typed
# so that mypy checks the request's fields and the response against the spec's types.


def _search(
    snap: Snapshot, view: View, req: shapes.SearchRequest, meaning: retrieval.Meaning
) -> shapes.SearchResponse:
    return tools.search(snap, view, req.query, req.limit, req.mode, meaning)


def _concept(
    snap: Snapshot, view: View, req: shapes.ConceptRequest, meaning: retrieval.Meaning
) -> shapes.ConceptResponse:
    return tools.concept(snap, view, req.id)


def _link_suggest(
    snap: Snapshot, view: View, req: shapes.LinkSuggestRequest, meaning: retrieval.Meaning
) -> shapes.LinkSuggestResponse:
    return tools.link_suggest(snap, view, req)


def _graph_path(
    snap: Snapshot, view: View, req: shapes.GraphPathRequest, meaning: retrieval.Meaning
) -> shapes.GraphPathResponse:
    return tools.graph_path(snap, view, req)


def _context_question(req: shapes.GraphContextRequest) -> str | None:
    return req.query


def _search_question(req: shapes.SearchRequest) -> str | None:
    return req.query if retrieval.needs_meaning(req.mode) else None


SPECS: Final = (
    ToolSpec(
        "graph_context", shapes.GraphContextRequest, shapes.GraphContextResponse,
        tools.graph_context, render.render_context,
        "The concepts around a question or given concept ids: 'ranked' is the list to read, "
        "the best matches (seeds, hops 0) and the concepts personalized PageRank finds around "
        "them on the link graph in one order, each with its score, hop count, the concept it "
        "was reached through (via) and a text snippet; 'seeds' and 'results' are its parts. "
        "Start here.",
        _post("graph_context"),
        question=_context_question,
    ),
    ToolSpec(
        "search", shapes.SearchRequest, shapes.SearchResponse,
        _search,
        render.render_search,
        "Search made for questions (BM25F over titles and aliases, then texts; stop words, "
        "stems): hits with score and snippet.",
        "GET /v1/kbs/{kb}/search?q=&limit=&mode=",
        http_post=False,
        question=_search_question,
    ),
    ToolSpec(
        "get_concept", shapes.ConceptRequest, shapes.ConceptResponse,
        _concept,
        render.render_concept,
        "One concept in full: title, aliases, type, status, tags, text, its links and backlinks.",
        "GET /v1/kbs/{kb}/concepts/{id}",
        http_post=False,
    ),
    ToolSpec(
        "link_suggest", shapes.LinkSuggestRequest, shapes.LinkSuggestResponse,
        _link_suggest,
        render.render_suggest,
        "Links a concept is probably missing: concepts its text mentions or shares rare terms "
        "and tags with, and concepts it shares neighbours with (method hybrid, the default), "
        "or shared neighbours alone (method structure); each with its evidence.",
        _post("link_suggest"),
    ),
    ToolSpec(
        "graph_path", shapes.GraphPathRequest, shapes.GraphPathResponse,
        _graph_path,
        render.render_path,
        "Advanced: the shortest chain of links between two concepts.",
        _post("graph_path"),
        advanced=True,
    ),
)  # fmt: skip
BY_NAME: Final[dict[str, ToolSpec[Any, Any]]] = {spec.name: spec for spec in SPECS}
HTTP_TOOLS: Final = tuple(spec for spec in SPECS if spec.http_post)


def input_schema(request_type: type) -> dict[str, Any]:
    """The request struct's JSON Schema (descriptions, defaults, bounds, allowed values)."""
    schema: dict[str, Any] = msgspec.json.schema(request_type)["$defs"][request_type.__name__]
    return schema


def output_schema(response_type: type) -> dict[str, Any]:
    """The response struct's JSON Schema, its nested types under ``$defs``."""
    _, defs = msgspec.json.schema_components([response_type], ref_template="#/$defs/{name}")
    return {**defs[response_type.__name__], "$defs": defs}


def http_listing() -> list[dict[str, Any]]:
    """``GET /v1/tools``: the tools served over HTTP POST, with their input schemas."""
    return [
        {
            "name": spec.name,
            "description": spec.description,
            "advanced": spec.advanced,
            "method": "POST",
            "path": f"/v1/kbs/{{kb}}/tools/{spec.name}",
            "input_schema": input_schema(spec.request_type),
        }
        for spec in HTTP_TOOLS
    ]

"""The tools as served: one catalogue that the HTTP API, MCP and the OpenAPI document all read.

Each ``ToolSpec`` names a tool, its msgspec request and response types (whose field metadata
carries every description, default, bound and allowed value: ``kbgraph.agent.tools``), the function
that answers it and the description an agent reads. Nothing here is written twice: the JSON
Schemas of ``/v1/tools``, ``/openapi.json`` and MCP's ``tools/list`` are generated from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from kbgraph.agent import retrieval, shapes, tools


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    request_type: type[msgspec.Struct]
    response_type: type[msgspec.Struct]
    run: Callable[[Any, Any, Any, Any], Any]  # (snapshot, view, request, meaning) -> response
    description: str
    advanced: bool = False
    http_post: bool = True  # served at POST /v1/kbs/{kb}/tools/{name} (else a GET route)
    # the text whose vector the tool wants (embedded before the lock: kbgraph.agent.retrieval)
    question: Callable[[Any], str | None] = lambda req: None


SPECS: Final = (
    ToolSpec(
        "graph_context", shapes.GraphContextRequest, shapes.GraphContextResponse,
        tools.graph_context,
        "The concepts around a question or given concept ids: 'ranked' is the list to read, "
        "the best matches (seeds, hops 0) and the concepts personalized PageRank finds around "
        "them on the link graph in one order, each with its score, hop count, the concept it "
        "was reached through (via) and a text snippet; 'seeds' and 'results' are its parts. "
        "Start here.",
        question=lambda req: req.query,
    ),
    ToolSpec(
        "search", shapes.SearchRequest, shapes.SearchResponse,
        lambda snap, view, req, meaning: tools.search(
            snap, view, req.query, req.limit, req.mode, meaning
        ),
        "Search made for questions (BM25F over titles and aliases, then texts; stop words, "
        "stems): hits with score and snippet.",
        http_post=False,
        question=lambda req: req.query if retrieval.needs_meaning(req.mode) else None,
    ),
    ToolSpec(
        "get_concept", shapes.ConceptRequest, shapes.ConceptResponse,
        lambda snap, view, req, meaning: tools.concept(snap, view, req.id),
        "One concept in full: title, aliases, type, status, tags, text, its links and backlinks.",
        http_post=False,
    ),
    ToolSpec(
        "link_suggest", shapes.LinkSuggestRequest, shapes.LinkSuggestResponse,
        lambda snap, view, req, meaning: tools.link_suggest(snap, view, req),
        "Links a concept is probably missing: concepts its text mentions or shares rare terms "
        "and tags with, and concepts it shares neighbours with (method hybrid, the default), "
        "or shared neighbours alone (method structure); each with its evidence.",
    ),
    ToolSpec(
        "graph_path", shapes.GraphPathRequest, shapes.GraphPathResponse,
        lambda snap, view, req, meaning: tools.graph_path(snap, view, req),
        "Advanced: the shortest chain of links between two concepts.",
        advanced=True,
    ),
)  # fmt: skip
BY_NAME: Final = {spec.name: spec for spec in SPECS}
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

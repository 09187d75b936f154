"""The agent API's request and response types (docs/api.md), as msgspec structs.

A request field's metadata (description, default, bounds, allowed values) is the one source of
the schemas ``/v1/tools``, ``/openapi.json`` and MCP's ``tools/list`` show; clamping and the
contract's own error messages stay with the tools (``kbgraph.agent.tools``), not the decoder.
"""

from __future__ import annotations

from typing import Annotated, Final, NamedTuple

import msgspec
from msgspec import UNSET, UnsetType

MAX_IDS: Final = 10


class Bounds(NamedTuple):
    """A count field's default (what 0 takes) and the range any other value is clamped into."""

    default: int
    low: int
    high: int

    def clamp(self, value: int) -> int:
        return self.default if value == 0 else min(max(value, self.low), self.high)


CONTEXT_LIMIT: Final = Bounds(10, 1, 30)
SUGGEST_LIMIT: Final = Bounds(5, 1, 20)
PATH_HOPS: Final = Bounds(6, 1, 12)
SEARCH_LIMIT: Final = Bounds(10, 1, 50)


def _field(description: str, **schema: object) -> msgspec.Meta:
    """A request field's description, plus bounds or allowed values for the JSON Schema only:
    clamping and the contract's own error messages stay with the tools, not the decoder."""
    return msgspec.Meta(description=description, extra_json_schema=schema or None)


def _bounded(what: str, bounds: Bounds) -> msgspec.Meta:
    """A count field: its description says the default and the clamp, its schema the range."""
    return _field(
        f"{what}; 0 takes the default {bounds.default}, others clamp into"
        f" {bounds.low}-{bounds.high}.",
        minimum=0,
        maximum=bounds.high,
    )


class GraphContextRequest(msgspec.Struct, forbid_unknown_fields=True):
    query: Annotated[
        str | None,
        _field("A question or keywords; its best search hits seed the ranking."),
    ] = None
    ids: Annotated[
        list[str] | None,
        _field(
            f"Concept ids to start from (each adds weight 1), at most {MAX_IDS}.", maxItems=MAX_IDS
        ),
    ] = None
    limit: Annotated[int, _bounded("How many results", CONTEXT_LIMIT)] = CONTEXT_LIMIT.default


class LinkSuggestRequest(msgspec.Struct, forbid_unknown_fields=True):
    id: Annotated[str, _field("The concept to suggest missing links for.")]
    limit: Annotated[int, _bounded("How many candidates", SUGGEST_LIMIT)] = SUGGEST_LIMIT.default
    method: Annotated[
        str | None,
        _field(
            "'hybrid' adds the text's evidence (unlinked mentions, shared rare terms and tags)"
            " to the link structure; 'structure' is resource allocation alone.",
            enum=["hybrid", "structure", None],
        ),
    ] = "hybrid"


class GraphPathRequest(msgspec.Struct, forbid_unknown_fields=True):
    source: Annotated[str, _field("The concept id the path starts at.")]
    target: Annotated[str, _field("The concept id the path ends at.")]
    direction: Annotated[
        str | None,
        _field(
            "'both' follows links either way, 'out' only as written.",
            enum=["both", "out", None],
        ),
    ] = "both"
    edges: Annotated[
        str | None,
        _field(
            "'links' walks the links alone; 'all' the links and the mentions (a concept's text"
            " naming another; where the KB keeps them).",
            enum=["links", "all", None],
        ),
    ] = "links"
    max_hops: Annotated[int, _bounded("The longest path considered", PATH_HOPS)] = PATH_HOPS.default


class SearchRequest(msgspec.Struct, forbid_unknown_fields=True):  # GET search?q=&limit=
    query: Annotated[str, _field("Words to search titles and texts for (no syntax).")]
    limit: Annotated[int, _bounded("How many hits", SEARCH_LIMIT)] = SEARCH_LIMIT.default
    mode: Annotated[
        str | None,
        _field(
            "'lexical' ranks by words (BM25), 'vector' by meaning (embeddings), 'hybrid' fuses"
            " both; absent: 'hybrid' where the KB has vectors, else 'lexical'. 'vector' on a KB"
            " without vectors is refused (409).",
            enum=["lexical", "vector", "hybrid", None],
        ),
    ] = None


class ConceptRequest(msgspec.Struct, forbid_unknown_fields=True):  # GET concepts/{id}
    id: Annotated[str, _field("The concept id, e.g. 'infra/dns'.")]


# --- responses -----------------------------------------------------------------------------


class Seed(msgspec.Struct):
    id: str
    title: str
    weight: float
    score: float
    snippet: str


class ContextResult(msgspec.Struct):
    id: str
    title: str
    score: float
    hops: int
    via: str
    snippet: str


class RankedResult(msgspec.Struct, kw_only=True):
    """One item of ``ranked``: a seed (hops 0, no ``via``) or a result."""

    id: str
    title: str
    score: float
    hops: int
    via: str | UnsetType = UNSET
    by: Annotated[
        str | UnsetType,
        msgspec.Meta(
            description="The kind of the edge from 'via': 'link' or 'mention' (the text of one"
            " names the other). Absent for a seed."
        ),
    ] = UNSET
    snippet: str


class GraphContextResponse(msgspec.Struct, kw_only=True):
    query: str | UnsetType = UNSET
    ids: list[str] | UnsetType = UNSET
    ranked: list[RankedResult]
    seeds: list[Seed]
    results: list[ContextResult]
    count: int
    note: str | UnsetType = UNSET
    mode: Annotated[
        str | UnsetType,
        msgspec.Meta(
            description="How the query's seeds were ranked: 'hybrid' (words and meaning) or"
            " 'lexical' (words alone: the KB has no vectors, or the query's vector did not come"
            " in time). Absent without a query."
        ),
    ] = UNSET


class Candidate(msgspec.Struct):
    id: str
    title: str
    score: float
    common: list[str]
    mention: str | UnsetType = UNSET


class LinkSuggestResponse(msgspec.Struct):
    id: str
    method: str
    candidates: list[Candidate]
    count: int


class PathStep(msgspec.Struct):
    id: str
    title: str


class GraphPathResponse(msgspec.Struct, kw_only=True):
    source: str
    target: str
    hops: int
    path: list[PathStep]
    note: str | UnsetType = UNSET


class SearchHit(msgspec.Struct):
    id: str
    title: str
    score: float
    snippet: str


class SearchResponse(msgspec.Struct):
    query: str
    hits: list[SearchHit]
    count: int
    mode: Annotated[
        str,
        msgspec.Meta(
            description="The mode the hits were ranked by: 'lexical', 'vector' or 'hybrid';"
            " 'lexical' where hybrid was asked when the KB has no vectors or the query's vector"
            " did not come in time (the answer is by words alone)."
        ),
    ]


class ConceptResponse(msgspec.Struct):
    id: str
    title: str
    aliases: list[str]
    type: str
    status: str
    tags: list[str]
    text: str
    version: int
    links: list[str]
    backlinks: list[str]


class StatusResponse(msgspec.Struct):
    kb: str
    concepts: int
    links: int  # pairs of visible concepts linked either way (as `kbgraph import` counts)
    vectors: str = "off"  # "complete", "filling" (vectors_missing of the visible ones) or "off"
    vectors_missing: int = 0
    # visible concepts whose text the provider refused (served by their words), the first
    # FAILED_NAMED of them by id; absent when there is none
    vectors_failed: int | UnsetType = UNSET
    vectors_failed_ids: list[str] | UnsetType = UNSET


FAILED_NAMED: Final = 20


class KBsResponse(msgspec.Struct):
    kbs: list[StatusResponse]
    count: int

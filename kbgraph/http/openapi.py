"""``/openapi.json``: every route of the app, generated from the msgspec types.

Tool requests and responses come from ``kbgraph.agent.toolspecs`` (field descriptions, defaults,
bounds and allowed values live on the request types, so nothing is written twice); the events
endpoint is described from ``kbgraph.events``' CloudEvents types in the three content modes of
the HTTP binding (structured, batched, binary). A module that adds routes hands its paths to
``document(extra_paths=...)``; ``tests/test_openapi.py`` fails for any route left out.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any, Final

import msgspec

from kbgraph import events
from kbgraph.agent import shapes
from kbgraph.agent.toolspecs import BY_NAME, HTTP_TOOLS
from kbgraph.store import DeliveryResult

_REF: Final = "#/components/schemas/{name}"
EVENT_TYPES: Final = (
    events.ConceptUpserted,
    events.ConceptDeleted,
    events.LinkAdded,
    events.LinkRemoved,
)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(name=name)}


def _answers(ok: str | None, *codes: int, ok_text: str = "OK") -> dict[str, Any]:
    body = {"content": {"application/json": {"schema": _ref(ok)}}} if ok else {}
    out: dict[str, Any] = {"200": {"description": ok_text, **body}}
    for code in codes:
        out[str(code)] = {
            "description": "error",
            "content": {"application/json": {"schema": _ref("Error")}},
        }
    return out


def _param(name: str, where: str, description: str, *, required: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "description": description,
        "schema": {"type": "string"},
    }


KB_PARAM: Final = _param("kb", "path", "The knowledge base's name.")
MIN_SEQ: Final = {
    **_param("X-Min-Seq", "header", "Wait (bounded) until the KB has applied this log position."),
    "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"},
}
_WEBHOOK_HEADERS: Final = (
    _param("webhook-id", "header", "Standard Webhooks: the delivery's id.", required=True),
    _param("webhook-timestamp", "header", "Unix seconds; refused beyond 5 minutes either way.",
           required=True),
    _param("webhook-signature", "header",
           "Space-separated 'v1,<base64 HMAC-SHA256>' over '{id}.{timestamp}.{raw body}'.",
           required=True),
)  # fmt: skip
_CE_HEADERS: Final = tuple(
    _param(
        f"ce-{name}",
        "header",
        f"Binary content mode: the event's '{name}' attribute (percent-encoded). "
        + ("Required in binary mode." if required else "Optional."),
    )
    for name, required in (
        ("specversion", True),
        ("id", True),
        ("source", True),
        ("type", True),
        ("subject", True),
        ("time", False),
    )
)

EVENTS_DESCRIPTION: Final = (
    "Concept and link changes from a knowledge base, as CloudEvents 1.0, "
    "signed with Standard Webhooks. Three content modes: structured, one event "
    "(application/cloudevents+json, or application/json holding an event object); batched "
    "(application/cloudevents-batch+json, or application/json holding an array); binary, one "
    "event whose attributes are the ce-* headers and whose data is the body (a ce-specversion "
    "header with a non-CloudEvents content type). Event types: concept.upserted, "
    "concept.deleted, link.added, link.removed. A delivery is applied atomically; 200 only "
    "once it is durable."
)


def _events_path() -> dict[str, Any]:
    event = {"oneOf": [_ref(t.__name__) for t in EVENT_TYPES], "discriminator": {
        "propertyName": "type",
        "mapping": {t.__struct_config__.tag: _REF.format(name=t.__name__) for t in EVENT_TYPES},
    }}  # fmt: skip
    data = {"oneOf": [_ref("UpsertData"), _ref("DeleteData"), _ref("LinkData")]}
    return {
        "post": {
            "operationId": "events",
            "summary": "Deliver concept and link events (the webhook).",
            "description": EVENTS_DESCRIPTION,
            "security": [],
            "parameters": [KB_PARAM, *_WEBHOOK_HEADERS, *_CE_HEADERS],
            "requestBody": {
                "required": True,
                "content": {
                    "application/cloudevents+json": {"schema": event},
                    "application/cloudevents-batch+json": {
                        "schema": {"type": "array", "items": event}
                    },
                    "application/json": {
                        "schema": {"oneOf": [event, {"type": "array", "items": event}, data]},
                        "description": "An event, an array of events, or (with ce-* headers, "
                        "binary mode) the event's data.",
                    },
                },
            },
            "responses": _answers("DeliveryResult", 400, 401, 413, 415, 422, 503),
        }
    }


def _tool_path(name: str) -> dict[str, Any]:
    spec = BY_NAME[name]
    return {
        "post": {
            "operationId": name,
            "summary": spec.description,
            "x-advanced": spec.advanced,
            "parameters": [KB_PARAM, MIN_SEQ],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(spec.request_type.__name__)}},
            },
            "responses": _answers(spec.response_type.__name__, 400, 401, 404, 413, 422, 503),
        }
    }


def _get(
    operation: str, summary: str, ok: str | None, params: list[dict[str, Any]], *codes: int
) -> dict[str, Any]:
    return {"get": {"operationId": operation, "summary": summary, "parameters": params,
                    "responses": _answers(ok, *codes)}}  # fmt: skip


def document(extra_paths: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenAPI 3.1 for the whole app; ``extra_paths`` are other modules' routes."""
    types: list[Any] = [t for s in BY_NAME.values() for t in (s.request_type, s.response_type)]
    types += [shapes.KBsResponse, shapes.StatusResponse, DeliveryResult, *EVENT_TYPES]
    _, components = msgspec.json.schema_components(types, ref_template=_REF)
    components["Error"] = {
        "type": "object",
        "properties": {"error": {"type": "string", "description": "What is wrong."}},
        "required": ["error"],
    }
    search = BY_NAME["search"].request_type
    limit = msgspec.json.schema(search)["$defs"][search.__name__]["properties"]["limit"]
    mode = msgspec.json.schema(search)["$defs"][search.__name__]["properties"]["mode"]
    concept_id = _param("concept_id", "path", "The concept id, e.g. 'infra/dns'.")
    paths: dict[str, Any] = {f"/v1/kbs/{{kb}}/tools/{s.name}": _tool_path(s.name)
                             for s in HTTP_TOOLS}  # fmt: skip
    paths["/v1/kbs"] = _get(
        "kbs", "The KBs this token may see, with their visible concept and link counts.",
        "KBsResponse", [], 401,
    )  # fmt: skip
    paths["/v1/kbs/{kb}/search"] = _get(
        "search", BY_NAME["search"].description, "SearchResponse",
        [KB_PARAM, MIN_SEQ, {**_param("q", "query", "The question or words.", required=True)},
         {"name": "limit", "in": "query", "description": limit["description"],
          "schema": {k: v for k, v in limit.items() if k != "description"}},
         {"name": "mode", "in": "query", "description": mode["description"],
          "schema": {"type": "string", "enum": ["lexical", "vector", "hybrid"]}}],
        401, 404, 409, 422, 503,
    )  # fmt: skip
    paths["/v1/kbs/{kb}/concepts/{concept_id}"] = _get(
        "concept", BY_NAME["get_concept"].description, "ConceptResponse",
        [KB_PARAM, concept_id, MIN_SEQ], 401, 404, 503,
    )  # fmt: skip
    paths["/v1/kbs/{kb}/status"] = _get(
        "status", "The KB's visible concept and link counts.", "StatusResponse",
        [KB_PARAM, MIN_SEQ], 401, 404, 503,
    )  # fmt: skip
    mcp_errors = {k: v for k, v in _answers(None, 401, 403, 404, 413, 415, 503).items()
                  if k != "200"}  # fmt: skip
    not_offered = {k: v for k, v in _answers(None, 401, 404, 405).items() if k != "200"}
    paths["/v1/kbs/{kb}/mcp"] = {
        "post": {
            "operationId": "mcp_post",
            "summary": "MCP streamable HTTP (stateless, JSON answers): the tools as MCP tools.",
            "parameters": [KB_PARAM],
            "requestBody": {"required": True, "content": {"application/json": {}}},
            "responses": {"200": {"description": "a JSON-RPC answer"}, **mcp_errors},
        },
        **{
            method: {
                "operationId": f"mcp_{method}",
                "summary": "Not offered (405): stateless, no event stream and no session.",
                "parameters": [KB_PARAM],
                "responses": not_offered,
            }
            for method in ("get", "delete")
        },
    }
    paths["/v1/kbs/{kb}/events"] = _events_path()
    unauthenticated: dict[str, list[dict[str, list[str]]]] = {"security": []}
    paths["/v1/tools"] = _get("tools", "The HTTP tools and their input schemas.", None, [])
    paths["/healthz"] = _get("healthz", "The process is up.", None, [])
    paths["/readyz"] = _get(
        "readyz", "Ready: projection built, follower running, store writable.", None, [], 503
    )
    paths["/metrics"] = _get(
        "metrics", "Prometheus metrics: an admin token or one with metrics = true.", None, [],
        401, 403,
    )  # fmt: skip
    paths["/openapi.json"] = _get("openapi", "This document.", None, [])
    for path in ("/v1/tools", "/healthz", "/readyz", "/openapi.json"):
        paths[path]["get"].update(unauthenticated)
    paths.update(extra_paths or {})
    return {
        "openapi": "3.1.0",
        "info": {"title": "kbgraph", "version": version("kbgraph")},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }

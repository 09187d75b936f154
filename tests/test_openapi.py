"""/openapi.json covers every route; tool schemas come from one source; GET /v1/kbs; the
first-hour edges (a mistyped tool, ``kbgraph`` alone, ``--version``)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from starlette.routing import Mount, Route

from kbgraph.agent import toolspecs
from kbgraph.http.mcp import tool_listing
from tests.kb_events import upsert
from tests.support import ADMIN, INFRA, OTHER, RUNBOOKS, Service

KB = "homelab"


def app_routes(routes: list, prefix: str = "") -> list[tuple[str, set[str]]]:
    """(path as OpenAPI writes it, methods) of every route, Mounts walked."""
    out = []
    for route in routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", prefix + route.path)
        if isinstance(route, Mount) and route.routes:
            out.extend(app_routes(route.routes, path))
        elif isinstance(route, Mount):  # an app of its own (static files): every path below
            out.append((path + "/{path}", {"get"}))
        elif isinstance(route, Route):
            out.append((path, {m.lower() for m in (route.methods or ())} - {"head"}))
        else:  # a route kind this test does not know must not slip through unchecked
            raise AssertionError(f"unknown route type {type(route).__name__} at {path}")
    return out


def test_every_route_is_in_the_document(service: Service) -> None:
    spec = service.client.get("/openapi.json").json()
    routes = app_routes(service.app.routes)
    assert len(routes) >= 14
    for path, methods in routes:
        assert path in spec["paths"], f"{path} missing from /openapi.json"
        assert methods <= set(spec["paths"][path]), (path, methods)
    for path, operations in spec["paths"].items():  # and nothing documented that is not served
        assert any(path == p for p, _ in routes), path
        for operation in operations.values():
            for code, answer in operation["responses"].items():
                assert answer["description"], (path, code)


def test_events_endpoint_documents_its_modes_and_types(service: Service) -> None:
    spec = service.client.get("/openapi.json").json()
    post = spec["paths"]["/v1/kbs/{kb}/events"]["post"]
    content = post["requestBody"]["content"]
    assert set(content) == {
        "application/cloudevents+json",
        "application/cloudevents-batch+json",
        "application/json",
    }
    event = content["application/cloudevents+json"]["schema"]
    assert set(event["discriminator"]["mapping"]) == {
        "concept.upserted",
        "concept.deleted",
        "link.added",
        "link.removed",
    }
    headers = {p["name"] for p in post["parameters"] if p["in"] == "header"}
    assert {"webhook-id", "webhook-timestamp", "webhook-signature"} <= headers
    assert {"ce-specversion", "ce-id", "ce-source", "ce-type", "ce-subject"} <= headers
    schemas = spec["components"]["schemas"]
    for name in ("ConceptUpserted", "UpsertData", "LinkData", "DeliveryResult"):
        assert name in schemas
    assert set(schemas["DeliveryResult"]["properties"]) == {
        "accepted", "applied", "duplicates", "stale", "ignored", "seq"
    }  # fmt: skip


def test_tool_schemas_have_one_source(service: Service) -> None:
    spec = service.client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    listing = {tool["name"]: tool for tool in service.client.get("/v1/tools").json()}
    mcp = {tool.name: tool for tool in tool_listing()}
    assert set(listing) == {s.name for s in toolspecs.HTTP_TOOLS}
    for spec_ in toolspecs.HTTP_TOOLS:
        http = listing[spec_.name]["input_schema"]
        assert http == schemas[spec_.request_type.__name__] == mcp[spec_.name].input_schema
        assert listing[spec_.name]["description"] == mcp[spec_.name].description
        for field, schema in http["properties"].items():
            assert schema.get("description"), (spec_.name, field)
    context = listing["graph_context"]["input_schema"]["properties"]
    assert context["limit"]["default"] == 10 and context["limit"]["maximum"] == 30
    assert context["ids"]["maxItems"] == 10
    path = listing["graph_path"]["input_schema"]["properties"]
    assert set(path["direction"]["enum"]) - {None} == {"both", "out"}
    assert path["max_hops"]["default"] == 6
    suggest = listing["link_suggest"]["input_schema"]["properties"]
    assert set(suggest["method"]["enum"]) - {None} == {"hybrid", "structure"}
    assert suggest["limit"]["default"] == 5 and suggest["limit"]["maximum"] == 20


def write_homelab(service: Service) -> int:
    return service.write(
        KB,
        [
            upsert("infra/dns", links=["infra/dhcp", "ops/backup"]),
            upsert("infra/dhcp", links=["infra/dns"]),
            upsert("ops/backup", type="Runbook", links=["infra/dns"]),
        ],
    )


def test_kbs_lists_what_the_token_may_see(service: Service) -> None:
    written = {
        KB: write_homelab(service),
        "elsewhere": service.write("elsewhere", [upsert("a/x"), upsert("a/y", links=["a/x"])]),
        "secret-kb": service.write("secret-kb", [upsert("b/z")]),
    }
    for kb, seq in written.items():  # each KB's projection has applied what was written
        assert service.call(ADMIN, "GET", f"/v1/kbs/{kb}/status", seq).status_code == 200
    admin = service.call(ADMIN, "GET", "/v1/kbs")
    assert admin.status_code == 200
    assert admin.json() == {
        "kbs": [
            {
                "kb": "elsewhere",
                "concepts": 2,
                "links": 1,
                "vectors": "complete",
                "vectors_missing": 0,
            },
            {"kb": KB, "concepts": 3, "links": 2, "vectors": "complete", "vectors_missing": 0},
            {
                "kb": "secret-kb",
                "concepts": 1,
                "links": 0,
                "vectors": "complete",
                "vectors_missing": 0,
            },
        ],
        "count": 3,
    }
    # narrowed: only the KBs it has a rule for, counted over what it may see
    assert service.call(INFRA, "GET", "/v1/kbs").json() == {
        "kbs": [{"kb": KB, "concepts": 2, "links": 1, "vectors": "complete", "vectors_missing": 0}],
        "count": 1,
    }
    assert service.call(RUNBOOKS, "GET", "/v1/kbs").json()["kbs"] == [
        {"kb": KB, "concepts": 1, "links": 0, "vectors": "complete", "vectors_missing": 0}
    ]
    assert service.call(OTHER, "GET", "/v1/kbs").json()["kbs"] == [
        {"kb": "elsewhere", "concepts": 2, "links": 1, "vectors": "complete", "vectors_missing": 0}
    ]
    refused = service.call(None, "GET", "/v1/kbs")
    assert refused.status_code == 401 and "token" in refused.json()["error"]


def test_kbs_of_a_narrowed_token_equal_hidden_never_written(tmp_path: Path) -> None:
    """INFRA's listing equals an admin's listing of a store holding only the infra concepts."""
    from starlette.testclient import TestClient

    from kbgraph.api import create_app
    from kbgraph.config import load_config
    from tests.support import write_config

    answers = []
    for folder, events, token in (
        ("full", None, INFRA),
        ("infra-only", [upsert("infra/dns", links=["infra/dhcp", "ops/backup"]),
                        upsert("infra/dhcp", links=["infra/dns"])], ADMIN),
    ):  # fmt: skip
        (tmp_path / folder).mkdir()
        with TestClient(create_app(load_config(write_config(tmp_path / folder)))) as client:
            service = Service(client)
            seq = write_homelab(service) if events is None else service.write(KB, events)
            assert service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", seq).status_code == 200
            answers.append(service.call(token, "GET", "/v1/kbs").content)
    assert answers[0] == answers[1]


@pytest.mark.parametrize("path", ["graph_contxt", "", "search"])
def test_a_mistyped_tool_is_told_the_tools(service: Service, path: str) -> None:
    response = service.call(ADMIN, "POST", f"/v1/kbs/{KB}/tools/{path}", json={})
    assert response.status_code == 404
    assert response.json() == {
        "error": f"no such tool: /v1/kbs/{KB}/tools/{path}; "
        "the tools are graph_context, link_suggest, graph_path"
    }


def test_kbgraph_alone_prints_help_and_version_prints_version() -> None:
    alone = subprocess.run(
        [sys.executable, "-m", "kbgraph"], capture_output=True, text=True, timeout=60
    )
    assert alone.returncode == 2
    assert alone.stderr.startswith("usage: kbgraph") and "serve" in alone.stderr
    assert "import" in alone.stderr and "sync" in alone.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "kbgraph", "--version"], capture_output=True, text=True, timeout=60
    )
    assert (shown.returncode, shown.stdout.strip()) == (0, f"kbgraph {version('kbgraph')}")

"""MCP over both transports, driven by the official MCP client (``mcp.ClientSession``).

A real ``kbgraph serve`` answers streamable HTTP at ``/v1/kbs/{kb}/mcp`` beside the HTTP API,
and ``kbgraph mcp`` answers over stdio; every tool's ``structuredContent`` must equal the HTTP
API's body for the same request, refusals must be tool errors with the API's messages, and a
narrowed token must get what an admin gets where the hidden concepts were never written.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from kbgraph.store import Store
from tests.kb_events import upsert
from tests.support import ADMIN, INFRA, OTHER, ROOT, bearer, start_server, stop, write_config

pytestmark = pytest.mark.slow

KB = "homelab"
INFRA_ONLY = "infraonly"  # homelab's infra concepts only: what INFRA must see on homelab
HIDDEN_TITLES = ("VLAN plan", "Restart DNS", "January")


def homelab(only_infra: bool = False) -> list:
    events = [
        upsert("infra/dns", links=["infra/router", "network/vlan"], type="Service",
               title="DNS resolver", text="The resolver answers DNS queries for the lab."),
        upsert("infra/router", links=["network/vlan", "infra/dns"], type="Host",
               title="Edge router", text="Routes traffic between the VLANs and the DNS."),
        upsert("infra/backup", links=["infra/router"], type="Runbook",
               title="Backup plan", text="Nightly backup of the router config and DNS zones."),
        upsert("network/vlan", type="Note", title="VLAN plan", text="VLAN 10 is for DNS."),
        upsert("ops/restart-dns", links=["infra/dns", "infra/backup"], type="Runbook",
               title="Restart DNS", text="How to restart the DNS resolver safely."),
        upsert("journal/2026-01", links=["ops/restart-dns", "infra/backup"], type="Note",
               title="January", text="Restarted the DNS resolver twice."),
    ]  # fmt: skip
    return [e for e in events if e.subject.startswith("infra/")] if only_infra else events


class Served:
    def __init__(self, folder: Path) -> None:
        self.config = folder / "kbgraph.toml"
        self.store = folder / "kbgraph.db"
        self.base = ""  # the server's URL, once it runs

    def http(self, token: str | None, method: str, path: str, body: Any = None) -> httpx.Response:
        headers = bearer(token) if token else {}
        return httpx.request(method, self.base + path, headers=headers, json=body, timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("mcp")
    write_config(folder)
    service = Served(folder)
    with Store(service.store) as store:
        store.append(KB, homelab())
        store.append(INFRA_ONLY, homelab(only_infra=True))
    proc = start_server(service.config)
    service.base = proc.url
    try:
        yield service
    finally:
        stop(proc)


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(main)


@asynccontextmanager
async def http_session(served: Served, token: str | None, kb: str = KB):
    headers = bearer(token) if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as client,
        streamable_http_client(f"{served.base}/v1/kbs/{kb}/mcp", http_client=client) as streams,
        ClientSession(*streams) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def stdio_session(served: Served, kb: str = KB, token: str | None = None):
    args = ["-m", "kbgraph", "mcp", "--config", str(served.config), "--kb", kb]
    if token is not None:
        args += ["--token", token]
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT))
    async with stdio_client(params) as streams, ClientSession(*streams) as session:
        await session.initialize()
        yield session


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# (tool, MCP arguments, HTTP method, HTTP path below /v1/kbs/{kb}/, HTTP body)
CALLS: list[tuple[str, dict, str, str, dict | None]] = [
    ("graph_context", {"query": "dns backup", "limit": 5}, "POST", "tools/graph_context",
     {"query": "dns backup", "limit": 5}),
    ("graph_context", {"ids": ["infra/router"]}, "POST", "tools/graph_context",
     {"ids": ["infra/router"]}),
    ("graph_context", {"query": "zebra"}, "POST", "tools/graph_context", {"query": "zebra"}),
    ("link_suggest", {"id": "infra/dns"}, "POST", "tools/link_suggest", {"id": "infra/dns"}),
    ("graph_path", {"source": "infra/backup", "target": "infra/dns", "direction": "out"},
     "POST", "tools/graph_path",
     {"source": "infra/backup", "target": "infra/dns", "direction": "out"}),
    ("search", {"query": "dns router", "limit": 3}, "GET", "search?q=dns%20router&limit=3", None),
    ("search", {"query": "name lookup", "mode": "vector"}, "GET",
     "search?q=name%20lookup&mode=vector", None),
    ("search", {"query": "dns router", "mode": "lexical"}, "GET",
     "search?q=dns%20router&mode=lexical", None),
    ("get_concept", {"id": "infra/dns"}, "GET", "concepts/infra/dns", None),
]  # fmt: skip


async def same_as_http(
    served: Served, session: ClientSession, token: str, kb: str = KB
) -> list[str]:
    """Call every tool; assert structuredContent == the HTTP body; return the texts."""
    texts = []
    for tool, arguments, method, path, body in CALLS:
        result = await session.call_tool(tool, arguments)
        http = served.http(token, method, f"/v1/kbs/{kb}/{path}", body)
        assert http.status_code == 200, http.text
        assert not result.is_error, result.content
        assert canonical(result.structured_content) == canonical(http.json()), tool
        (content,) = result.content
        texts.append(content.text)
    return texts


def test_http_lists_tools_with_a_described_schema(served: Served) -> None:
    async def main() -> dict:
        async with http_session(served, ADMIN) as session:
            return {tool.name: tool for tool in (await session.list_tools()).tools}

    tools = run(main)
    assert set(tools) == {"graph_context", "link_suggest", "graph_path", "search", "get_concept"}
    for tool in tools.values():
        assert tool.description and tool.input_schema["type"] == "object"
        assert tool.annotations.read_only_hint is True
        for field, schema in tool.input_schema["properties"].items():
            assert schema.get("description"), (tool.name, field)
    context = tools["graph_context"].input_schema["properties"]
    assert (context["limit"]["default"], context["limit"]["maximum"]) == (10, 30)
    assert context["ids"]["maxItems"] == 10
    path = tools["graph_path"].input_schema
    assert path["required"] == ["source", "target"]
    assert path["properties"]["direction"]["enum"] == ["both", "out", None]
    assert path["properties"]["max_hops"]["default"] == 6
    assert tools["graph_path"].meta == {"advanced": True}
    assert tools["search"].input_schema["properties"]["limit"]["maximum"] == 50
    mode = tools["search"].input_schema["properties"]["mode"]
    assert mode["enum"] == ["lexical", "vector", "hybrid", None] and mode["default"] is None
    assert "hybrid" in mode["description"]


def test_http_structured_content_is_the_http_body(served: Served) -> None:
    async def main() -> list[str]:
        async with http_session(served, ADMIN) as session:
            return await same_as_http(served, session, ADMIN)

    context, ids_only, no_seed, suggest, path, search, _, _, concept = run(main)
    assert suggest.startswith("link_suggest for [infra/dns]:")
    lines = context.splitlines()
    assert lines[0].startswith("graph_context for query 'dns backup':")
    # the text is graph_context's ranked list: seeds and results in one numbered order
    ranked = [line for line in lines if line[:1].isdigit()]
    assert any(line.endswith(", seed") and "score" in line for line in ranked)
    assert any(line.startswith("1. ") and line.endswith(", seed") for line in ids_only.splitlines())
    assert any("via" in line and "hop" in line for line in ids_only.splitlines())
    assert [line.split(".", 1)[0] for line in ranked] == [str(i) for i in range(1, len(ranked) + 1)]
    assert "Nightly backup" in context  # snippets
    assert "via DNS resolver [infra/dns]" in ids_only or "via Edge router" in ids_only
    assert "no seed matched the query" in no_seed
    assert path.splitlines()[1] == "Backup plan [infra/backup] → Edge router [infra/router] → " \
        "DNS resolver [infra/dns]"  # fmt: skip
    assert search.splitlines()[1].startswith("1. ") and "score" in search
    assert "backlinks: infra/router, ops/restart-dns" in concept
    assert len(context) < 2000


@pytest.mark.parametrize(
    ("tool", "arguments", "path", "message"),
    [
        ("graph_context", {}, "tools/graph_context", "'query' or 'ids' is required"),
        ("graph_context", {"query": "dns", "limit": "5"}, "tools/graph_context",
         "limit: Expected int, got str"),
        ("graph_context", {"ids": ["infra/dns", "x/y"]}, "tools/graph_context", "not found: x/y"),
        ("link_suggest", {"id": "infra/dns", "bogus": 1}, "tools/link_suggest",
         "request: Object contains unknown field bogus"),
        ("graph_path", {"source": "infra/dns", "target": "infra/router", "direction": "in"},
         "tools/graph_path", 'invalid direction "in": expected out or both'),
        ("get_concept", {"id": "nowhere/x"}, None, "not found: nowhere/x"),
        ("nonsense", {}, None, "unknown tool: nonsense"),
    ],
)  # fmt: skip
def test_http_refusals_are_tool_errors_with_the_api_message(
    served: Served, tool: str, arguments: dict, path: str | None, message: str
) -> None:
    async def main() -> Any:
        async with http_session(served, ADMIN) as session:
            return await session.call_tool(tool, arguments)

    result = run(main)
    assert result.is_error and [c.text for c in result.content] == [message]
    if path is not None:
        http = served.http(ADMIN, "POST", f"/v1/kbs/{KB}/{path}", arguments)
        assert http.json() == {"error": message}


def test_http_needs_a_token_and_a_rule_for_the_kb(served: Served) -> None:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for token in (None, "wrong"):
        response = served.http(token, "POST", f"/v1/kbs/{KB}/mcp", initialize)
        assert response.status_code == 401
        assert response.json() == {"error": "missing or unknown bearer token"}
    no_rule = served.http(OTHER, "POST", f"/v1/kbs/{KB}/mcp", initialize)
    missing = served.http(ADMIN, "POST", "/v1/kbs/nosuchkb/mcp", initialize)
    assert no_rule.status_code == missing.status_code == 404
    assert no_rule.json() == {"error": f"not found: kb {KB}"}
    assert missing.json() == {"error": "not found: kb nosuchkb"}

    async def refused() -> None:
        async with http_session(served, OTHER) as session:
            await session.list_tools()

    with pytest.raises(BaseException):  # noqa: B017 - the client's own error types vary
        run(refused)


def test_narrowed_token_gets_what_admin_gets_without_the_hidden(served: Served) -> None:
    async def as_token(token: str, kb: str) -> list[tuple[str, str, bool]]:
        answers = []
        async with http_session(served, token, kb) as session:
            hidden = ("get_concept", {"id": "network/vlan"}, "", "", None)
            for tool, arguments, *_ in [*CALLS, hidden]:
                result = await session.call_tool(tool, arguments)
                text = result.content[0].text
                answers.append((canonical(result.structured_content), text, result.is_error))
        return answers

    narrowed = run(lambda: as_token(INFRA, KB))
    reference = run(lambda: as_token(ADMIN, INFRA_ONLY))
    assert narrowed == reference
    assert narrowed[-1][1:] == ("not found: network/vlan", True)
    for _, text, _ in narrowed:
        assert not any(title in text for title in HIDDEN_TITLES), text


def test_stdio_serves_the_same_tools_and_follows_new_events(served: Served) -> None:
    async def main() -> tuple[list[str], Any, Any, Any]:
        async with stdio_session(served, KB, "infra") as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert names == {"graph_context", "link_suggest", "graph_path", "search",
                             "get_concept"}  # fmt: skip
            texts = await same_as_http(served, session, INFRA)
            hidden = await session.call_tool("get_concept", {"id": "ops/restart-dns"})
            with Store(served.store) as store:  # a delivery the service acknowledges
                store.append(KB, [upsert("infra/new", links=["infra/dns"], title="New one")])
            deadline = time.monotonic() + 60
            while True:
                fresh = await session.call_tool("get_concept", {"id": "infra/new"})
                if not fresh.is_error or time.monotonic() > deadline:
                    break
                await anyio.sleep(0.05)
            return texts, hidden, fresh, await session.call_tool("graph_context", {})

    texts, hidden, fresh, refused = run(main)
    assert all(title not in text for text in texts for title in HIDDEN_TITLES)
    assert hidden.is_error and hidden.content[0].text == "not found: ops/restart-dns"
    assert not fresh.is_error and fresh.structured_content["links"] == ["infra/dns"]
    assert refused.is_error and refused.content[0].text == "'query' or 'ids' is required"


def test_stdio_refuses_a_token_without_a_rule_and_answers_a_missing_kb(served: Served) -> None:
    command = [sys.executable, "-m", "kbgraph", "mcp", "--config", str(served.config)]
    no_rule = subprocess.run(
        [*command, "--kb", KB, "--token", "other"], capture_output=True, text=True, cwd=ROOT,
        stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip
    assert no_rule.returncode == 2 and "has no rule for KB 'homelab'" in no_rule.stderr

    async def main() -> Any:
        async with stdio_session(served, "nosuchkb") as session:
            return await session.call_tool("search", {"query": "dns"})

    result = run(main)
    assert result.is_error and result.content[0].text == "not found: kb nosuchkb"


def test_http_offers_no_stream_and_refuses_in_json(served: Served) -> None:
    """Stateless: GET (with or without Last-Event-ID) and DELETE answer 405 at once, so no
    token can hold event streams open; a POST that is not JSON is refused in JSON too."""
    url = f"{served.base}/v1/kbs/{KB}/mcp"
    auth = {**bearer(INFRA), "Accept": "text/event-stream"}
    for method, extra in (("GET", {}), ("GET", {"Last-Event-ID": "0"}), ("DELETE", {})):
        response = httpx.request(method, url, headers={**auth, **extra}, timeout=10)
        assert response.status_code == 405, (method, extra, response.text)
        assert response.headers["allow"] == "POST"
        assert response.json()["error"].startswith(f"{method} not allowed")
    listing = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}'
    for content_type in (None, "text/plain"):
        headers = {**bearer(INFRA), "Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        response = httpx.post(url, content=listing, headers=headers, timeout=10)
        assert response.status_code == 415
        assert response.json() == {
            "error": f"Content-Type {content_type or ''!r}: expected application/json"
        }


def test_http_checks_the_origin(served: Served) -> None:
    """The MCP specification: servers must validate Origin (DNS rebinding). An Origin other
    than the service's own is refused; none, or its own, passes."""
    url = f"{served.base}/v1/kbs/{KB}/mcp"
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {**bearer(INFRA), "Accept": "application/json, text/event-stream"}
    evil = httpx.post(url, json=listing, headers={**headers, "Origin": "http://evil.example"})
    assert evil.status_code == 403
    assert evil.json() == {
        "error": "Origin 'http://evil.example' is not this service's origin nor an allowed one"
    }
    for origin in ({}, {"Origin": served.base}):
        ok = httpx.post(url, json=listing, headers={**headers, **origin})
        assert ok.status_code == 200, ok.text
        assert len(ok.json()["result"]["tools"]) == 5
    # the rest of the API, where a browser never sends the token by itself, is not checked
    api = served.http(INFRA, "GET", f"/v1/kbs/{KB}/status")
    assert api.status_code == 200


@pytest.mark.parametrize(
    ("tool", "arguments", "field", "expected"),
    [
        ("search", {"query": "dns"}, "mode", "expected lexical, vector or hybrid"),
        ("graph_path", {"source": "infra/dns", "target": "infra/router"}, "direction",
         "expected out or both"),
        ("link_suggest", {"id": "infra/dns"}, "method", "expected hybrid or structure"),
    ],
)  # fmt: skip
def test_an_invalid_choice_is_cut_in_the_refusal(
    served: Served, tool: str, arguments: dict, field: str, expected: str
) -> None:
    """Issue 34, case 10: a 15 KB ``mode`` was echoed whole over HTTP, 1 MB over MCP; cut to
    200 characters as other refusals are."""
    value = "x" * 500_000
    message = f'invalid {field} "{"x" * 200}…": {expected}'

    async def main() -> Any:
        async with http_session(served, ADMIN) as session:
            return await session.call_tool(tool, {**arguments, field: value})

    result = run(main)
    assert result.is_error and [c.text for c in result.content] == [message]
    if tool == "search":
        http = served.http(ADMIN, "GET", f"/v1/kbs/{KB}/search?q=dns&mode={'x' * 15_000}")
    else:
        http = served.http(ADMIN, "POST", f"/v1/kbs/{KB}/tools/{tool}", {**arguments, field: value})
    assert http.status_code == 422 and http.json() == {"error": message}

"""Every registered tool is whole: its schemas, its MCP text and its docs line, each from its
``ToolSpec``; and one call sequence (``kbgraph.agent.calls``) answers it for HTTP and MCP."""

from __future__ import annotations

import re
from typing import Any

import anyio
import msgspec
import pytest

from kbgraph.agent import toolspecs
from kbgraph.agent.calls import Caller, call
from kbgraph.agent.tools import ToolError
from kbgraph.projection import KBProjection
from kbgraph.store import Store
from kbgraph.threads import ToolThreads
from tests.kb_events import upsert
from tests.support import ROOT

# one request per tool, on the KB below (a new tool adds its own: the test fails without it)
REQUESTS: dict[str, dict[str, Any]] = {
    "graph_context": {"query": "resolver"},
    "search": {"query": "resolver"},
    "get_concept": {"id": "infra/dns"},
    "link_suggest": {"id": "infra/backup"},
    "graph_path": {"source": "infra/backup", "target": "infra/dns"},
}


@pytest.fixture(scope="module")
def projection(tmp_path_factory: pytest.TempPathFactory) -> KBProjection:
    with Store(tmp_path_factory.mktemp("kb") / "kb.db") as store:
        store.append("kb", [
            upsert("infra/dns", title="DNS resolver", text="Answers DNS for the lab."),
            upsert("infra/router", links=["infra/dns"], title="Edge router",
                   text="Routes to the resolver."),
            upsert("infra/backup", links=["infra/router"], title="Backup",
                   text="The resolver's zones, nightly."),
        ])  # fmt: skip
        built = KBProjection("kb")
        built.build(store.load().kbs["kb"])
    return built


def test_every_tool_has_a_request_to_test_with() -> None:
    assert set(REQUESTS) == set(toolspecs.BY_NAME)


@pytest.mark.parametrize("spec", toolspecs.SPECS, ids=lambda spec: spec.name)
def test_every_tool_has_its_schemas(spec: toolspecs.ToolSpec[Any, Any]) -> None:
    assert toolspecs.input_schema(spec.request_type)["type"] == "object"
    assert toolspecs.output_schema(spec.response_type)["type"] == "object"
    assert spec.description


@pytest.mark.parametrize("spec", toolspecs.SPECS, ids=lambda spec: spec.name)
def test_every_tool_has_its_docs_line(spec: toolspecs.ToolSpec[Any, Any]) -> None:
    """docs/agents.md's endpoints table names the tool's route."""
    table = (ROOT / "docs" / "agents.md").read_text()
    assert re.search(rf"^\| `{re.escape(spec.route)}` \| .+ \|$", table, re.M), spec.route


@pytest.mark.parametrize("spec", toolspecs.SPECS, ids=lambda spec: spec.name)
def test_every_tool_answers_and_renders_through_the_one_call(
    spec: toolspecs.ToolSpec[Any, Any], projection: KBProjection
) -> None:
    """The call sequence gives the tool's answer at the KB's seq, and the spec's renderer
    makes text of its body (a missing renderer would fail here, not on an agent's call)."""
    threads = ToolThreads(1)
    body = msgspec.json.encode(REQUESTS[spec.name])

    def finish(seq: int, answer: msgspec.Struct) -> tuple[int, msgspec.Struct, list[str]]:
        return seq, answer, spec.render(msgspec.to_builtins(answer))

    try:
        seq, answer, text = anyio.run(
            call, spec, Caller(projection, None, 1.0), body, threads, finish
        )
    finally:
        threads.close()
    assert seq == projection.seq and isinstance(answer, spec.response_type)
    assert text and all(isinstance(line, str) for line in text)
    assert "infra/" in "\n".join(text)


def test_a_refused_request_is_a_tool_error_naming_the_field(projection: KBProjection) -> None:
    threads = ToolThreads(1)
    spec = toolspecs.BY_NAME["graph_path"]
    try:
        with pytest.raises(ToolError) as refused:
            anyio.run(
                call, spec, Caller(projection, None, 1.0), b'{"source": 1}', threads,
                lambda seq, answer: answer,
            )  # fmt: skip
    finally:
        threads.close()
    assert refused.value.status == 422 and "source" in refused.value.message

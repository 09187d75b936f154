"""One tool call, the same over HTTP and MCP: the request decoded into the tool's own struct
(refused with ``ToolError`` naming the field), the question's vector embedded before a tool
thread or the KB's lock is taken, then, in a tool thread under the KB's read lock (a
delivery-whole snapshot), the tool on the caller's view and ``finish`` of its answer (the
HTTP bytes, MCP's body and text: made in the thread, so the event loop only moves them).

Who the caller is (token, rules, ``X-Min-Seq``) is settled before, by the HTTP gate
(``kbgraph.http.routes.gate``) or ``kbgraph mcp``'s token; a refusal of any step is a
``ToolError`` (its status and message), which HTTP answers as JSON and MCP as a tool error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kbgraph.access import RuleSet
from kbgraph.agent import retrieval, tools
from kbgraph.agent.toolspecs import Req, Resp, ToolSpec
from kbgraph.projection import KBProjection
from kbgraph.threads import ToolThreads

Out = TypeVar("Out")


@dataclass(frozen=True, slots=True)
class Caller:
    """Whose call this is: the KB's projection and the token's rules (None: admin), and how
    long a question waits for its vector (``[embeddings] query_timeout_seconds``)."""

    projection: KBProjection
    rules: RuleSet | None
    query_seconds: float


async def call(
    spec: ToolSpec[Req, Resp],
    caller: Caller,
    body: bytes,
    threads: ToolThreads,
    finish: Callable[[int, Resp], Out],
) -> Out:
    """``finish(seq, answer)`` of the tool on the caller's view of the KB at ``seq``."""
    request = tools.decode_request(body, spec.request_type)
    meaning = await retrieval.embed_meaning(
        caller.projection.vectors, spec.question(request), caller.query_seconds
    )

    def work() -> Out:
        with caller.projection.read() as snap:
            answer = spec.run(snap, snap.view(caller.rules), request, meaning)
            return finish(snap.seq, answer)

    return await threads.run(work)

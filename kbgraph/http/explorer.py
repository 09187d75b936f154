"""The explorer page (docs/agents.md): ``GET /ui`` and its static assets, served by the app.

The page is plain HTML, CSS and JavaScript with Cytoscape.js vendored under
``kbgraph/http/ui/vendor``
(MIT, its licence beside it): no build step, no network beyond this service. It calls only the
agent API, with the token the user types, so it shows exactly what that token may see. A strict
Content-Security-Policy allows scripts, styles and requests from this origin only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

UI_DIR: Final = Path(__file__).resolve().parent / "ui"
# Cytoscape.js 3.35.0 injects one fixed <style> element for its container; this is its hash
# (the browser names it when it is missing: update it with the vendored library).
CYTOSCAPE_STYLE_SHA256: Final = "sha256-pgvDUBa4IjFA2yuSJ2cqcyxmNYJMborsd0ORcRv9vw8="
CSP: Final = (
    f"default-src 'none'; script-src 'self'; style-src 'self' '{CYTOSCAPE_STYLE_SHA256}'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
PAGE_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


async def page(request: Request) -> Response:
    return FileResponse(UI_DIR / "index.html", headers=PAGE_HEADERS, media_type="text/html")


class _Assets(StaticFiles):
    """The page's assets with the page's headers (nosniff, the same CSP for anything loaded)."""

    async def get_response(self, path: str, scope: Any) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(PAGE_HEADERS)
        return response


routes: Final = [
    Route("/ui", page, methods=["GET"]),
    Mount("/ui/static", _Assets(directory=UI_DIR), name="ui-static"),
]

OPENAPI_PATHS: Final = {
    "/ui": {"get": {
        "operationId": "explorer", "security": [],
        "summary": "The explorer page: graph_context drawn, concepts, suggestions and paths.",
        "responses": {"200": {"description": "HTML", "content": {"text/html": {}}}},
    }},
    "/ui/static/{path}": {"get": {
        "operationId": "explorer_assets", "security": [],
        "summary": "The explorer's scripts, styles and vendored Cytoscape.js (with its licence).",
        "parameters": [{"name": "path", "in": "path", "required": True,
                        "schema": {"type": "string"}}],
        "responses": {"200": {"description": "a file"},
                      "404": {"description": "no such file"}},
    }},
}  # fmt: skip

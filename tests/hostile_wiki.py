"""A fake MediaWiki Action API on loopback that answers as a test tells it: honestly, from a
few pages and recent changes, or with bombs (endless or huge answers, drips, odd shapes); and
dump bombs: a few KB of bz2 that decompress to hundreds of MB of XML.

``FakeWiki.serve()`` runs it in a thread; ``hostile`` maps a call's name (``list=allpages``,
``meta=siteinfo&siprop=general``, ...) to a function of the call's parameters giving the
answer: JSON (a dict), raw bytes, or an iterator of (bytes, seconds to wait before them).
The wiki's clock is ours (``now``), so its recent changes are stamped as a real wiki's are.
"""

from __future__ import annotations

import bz2
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kbgraph.store import Store

KB = "wiki"  # the KB the tests follow a wiki into
Answer = dict[str, Any] | bytes | Iterator[tuple[bytes, float]]


def now(offset: float = 0.0) -> str:
    """Our clock (plus ``offset`` seconds) as the API writes a time."""
    moment = datetime.fromtimestamp(time.time() + offset, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class FakeWiki:
    pages: dict[str, str] = field(default_factory=dict)  # title -> wikitext
    changes: list[dict[str, Any]] = field(default_factory=list)  # recent changes, oldest first
    clock: str = ""  # the wiki's clock: ours when empty
    hostile: dict[str, Callable[[dict[str, str]], Answer]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def answer(self, params: dict[str, str]) -> Answer:
        name = call_name(params)
        self.calls.append(name)
        if name in self.hostile:
            return self.hostile[name](params)
        if name == "meta=siteinfo&siprop=namespaces":
            return {"query": {"namespaces": {"0": {"id": 0, "name": "", "case": "first-letter"}}}}
        if name == "meta=siteinfo&siprop=general":
            return {"query": {"general": {"time": self.clock or now()}}}
        if name == "list=recentchanges":
            start = params.get("rcstart", "")
            changes = [c for c in self.changes if c["timestamp"] >= start]
            return {"query": {"recentchanges": changes}}
        if name == "list=allpages":
            return {"query": {"allpages": [{"title": t} for t in sorted(self.pages)]}}
        if name == "list=backlinks":
            return {"query": {"backlinks": []}}
        titles = params.get("titles", "").split("|")
        if name == "prop=info":
            return {"query": {"pages": [self._info(t) for t in titles]}}
        if name == "prop=revisions|redirects":
            return {"query": {"pages": [self._content(t) for t in titles]}}
        return {"query": {"pages": [self._info(t) for t in titles]}}  # redirects=1

    def _info(self, title: str) -> dict[str, Any]:
        if title not in self.pages:
            return {"title": title, "missing": True}
        return {"title": title, "pageid": 1, "actions": {"read": True}}

    def _content(self, title: str) -> dict[str, Any]:
        main = {"content": self.pages[title], "contentmodel": "wikitext"}
        return {"title": title, "pageid": 1, "revisions": [{"slots": {"main": main}}]}

    @contextmanager
    def serve(self) -> Iterator[str]:
        """The wiki on a loopback port until the block ends: its base URL."""
        wiki = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                params = dict(parse_qsl(urlsplit(self.path).query))
                body = wiki.answer(params)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._send(body)  # else the follower hung up, as it should on a bomb

            def _send(self, body: Answer) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                if isinstance(body, dict | bytes):
                    raw = json.dumps(body).encode() if isinstance(body, dict) else body
                    self.send_header("content-length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for chunk, wait in body:
                    time.sleep(wait)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()


def call_name(params: dict[str, str]) -> str:
    for key in ("list", "prop"):
        if key in params:
            return f"{key}={params[key]}"
    if "meta" in params:
        return f"meta={params['meta']}&siprop={params.get('siprop', '')}"
    return "redirects" if "redirects" in params else "query"


def endless_titles(params: dict[str, str]) -> Answer:
    """``list=allpages`` that always has 500 more titles and a new continuation."""
    n = int(params.get("apcontinue", "0"))
    titles = [{"title": f"Page {n}-{i}"} for i in range(500)]
    return {"continue": {"apcontinue": str(n + 1), "continue": "-||"},
            "query": {"allpages": titles}}  # fmt: skip


def huge(params: dict[str, str]) -> Answer:
    """400 MB of one JSON string, as fast as the follower reads it."""
    return _huge()


def _huge() -> Iterator[tuple[bytes, float]]:
    block = b"a" * (1 << 20)
    yield b'{"query": {"general": {"time": "', 0.0
    for _ in range(400):
        yield block, 0.0
    yield b'"}}}', 0.0


def drip(seconds: float) -> Callable[[dict[str, str]], Answer]:
    """An honest answer, a byte every ``seconds``: a per-read timeout longer never fires."""

    def answer(params: dict[str, str]) -> Answer:
        body = json.dumps({"query": {"general": {"time": now()}}}).encode()
        return ((bytes([byte]), seconds) for byte in body)

    return answer


def wrong_shape(params: dict[str, str]) -> Answer:
    return {"query": {"namespaces": 5}}


HEAD = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11">'
    "<siteinfo><sitename>Bombs</sitename><namespaces>"
    '<namespace key="0" case="first-letter" /></namespaces></siteinfo>'
)


def page(title: str, text: str, n: int = 1) -> str:
    return (
        f"<page><title>{title}</title><ns>0</ns><id>{n}</id><revision><id>{n}</id>"
        f'<model>wikitext</model><format>text/x-wiki</format><text xml:space="preserve">{text}'
        "</text></revision></page>"
    )


def bomb(path: Path, before: str, repeated: str, times: int, after: str) -> Path:
    """``before + repeated * times + after`` as a bz2 file of concatenated streams."""
    one = bz2.compress(repeated.encode())
    with path.open("wb") as out:
        out.write(bz2.compress(before.encode()))
        for _ in range(times):
            out.write(one)
        out.write(bz2.compress(after.encode()))
    return path


def sync(url: str, folder: Path, *more: str) -> list[str]:
    (folder / "c.toml").write_text('[store]\npath = "kb.db"\n')
    return [sys.executable, "-m", "kbgraph", "sync", "--mediawiki", url, "--kb", KB,
            "--config", str(folder / "c.toml"), "--manifest", str(folder / "m.sqlite"),
            "--retries", "0", *more]  # fmt: skip


def concepts(path: Path) -> dict[str, str]:
    with Store(path) as store:
        kbs = store.load().kbs
    return {c.id: c.text for c in kbs[KB].concepts} if KB in kbs else {}

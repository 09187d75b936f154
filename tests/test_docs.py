"""The commands in README.md and docs/*.md are run against a real demo service.

The convention (docs/README.md, "How the docs are tested"): a fenced block whose info string
is ``sh test`` (or ``python test``) is run; ``sh no-test`` is shown only (a benchmark, a
command that serves forever, the test suite itself). Every ``sh`` block carries one of the two,
so no command is left unchecked by oversight. A ``text output`` block right after a run block
is what it prints: each piece between ``…`` must appear, in order, in its output (whitespace
runs count as one space).

Each run block runs on its own (a fresh ``bash -e -o pipefail``, or the venv's Python) in a
folder that looks like the repository's root (its entries linked in) with a ``demo/`` folder
of its own, served by ``kbgraph demo --dir demo --port 0`` on 127.0.0.1. The one substitution:
``localhost:8080`` and ``127.0.0.1:8080`` become the port the service chose. The token and the
webhook secret are read from ``demo/kbgraph.toml`` by the blocks themselves, as a reader's are.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from markdown_it import MarkdownIt

from tests.support import STARTUP_SECONDS, ServerProcess, scripts, stop

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HISTORY = sorted((ROOT / "docs" / "history").rglob("*.md"))  # dated records: links checked only
SHELLS = {"sh", "bash", "shell", "console", "zsh"}
RUNNERS = {"sh": ["bash", "-e", "-o", "pipefail", "-c"], "python": [sys.executable, "-c"]}
RUNNABLE = {*RUNNERS, "json"}  # a ``json test`` block is an MCP client config, connected to
CHECKOUT = "/path/to/kbgraph/"  # in a ``json test`` block: the repository's root
DEMO_PORT = re.compile(r"\b(?:localhost|127\.0\.0\.1):8080\b")
BLOCK_SECONDS = 60


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str  # "test", "no-test" or ""
    code: str
    output: str | None  # the ``text output`` block right after it, if any

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one document, from markdown-it-py's tokens."""
    fences = [t for t in MarkdownIt("commonmark").parse(path.read_text()) if t.type == "fence"]
    found = []
    for index, token in enumerate(fences):
        words = token.info.split()
        lang, marker = [*words, "", ""][:2]
        if lang == "text" and marker == "output":
            continue
        following = fences[index + 1] if index + 1 < len(fences) else None
        output = None
        if following is not None and following.info.split() == ["text", "output"]:
            assert token.map and following.map
            if following.map[0] - token.map[1] <= 2:  # right after it, at most a blank line
                output = following.content
        assert token.map is not None
        found.append(Block(path, token.map[0] + 1, lang, marker, token.content, output))
    return found


ALL = [block for path in DOCS for block in blocks(path)]
RUN = [block for block in ALL if block.marker == "test"]


def test_the_docs_have_run_blocks() -> None:
    assert len(DOCS) >= 10, DOCS
    assert len(RUN) >= 10, [b.where for b in RUN]


def test_the_shell_tools_are_there() -> None:
    """What the shell examples use (scripts/setup.sh installs curl and openssl when it can)."""
    import shutil

    missing = [
        tool
        for tool in ("bash", "curl", "openssl", "sed", "od", "base64")
        if not shutil.which(tool)
    ]
    assert not missing, f"the docs' shell examples need {missing}"


def test_every_shell_block_is_marked() -> None:
    """A shell block is either run (``sh test``) or says it is not (``sh no-test``)."""
    unmarked = [b.where for b in ALL if b.lang in SHELLS and b.marker not in ("test", "no-test")]
    assert not unmarked, f"shell blocks neither `sh test` nor `sh no-test`: {unmarked}"
    other = [b.where for b in ALL if b.lang in SHELLS and b.lang != "sh"]
    assert not other, f"shell blocks are tagged sh: {other}"
    stray = [b.where for b in ALL if b.marker == "test" and b.lang not in RUNNABLE]
    assert not stray, f"`test` on a language the test cannot run: {stray}"
    orphans = [
        f"{path.relative_to(ROOT)}:{t.map[0] + 1}"
        for path in DOCS
        for t in MarkdownIt("commonmark").parse(path.read_text())
        if t.type == "fence" and t.info.split() == ["text", "output"] and t.map
        if not any(b.path == path and b.output == t.content for b in RUN)
    ]
    assert not orphans, f"`text output` blocks not right after a run block: {orphans}"


FILE_FORM = re.compile(r"python\S*\s+(?:\S*/)?loadtest/\w+\.py")


def test_scripts_are_shown_one_way() -> None:
    """Every loadtest script is shown as ``python -m loadtest.<name>``, never as a file."""
    shown: set[str] = set()
    for path in DOCS:
        for token in MarkdownIt("commonmark").parse(path.read_text()):
            texts = [token.content] + [child.content for child in token.children or []]
            shown |= {
                f"{path.relative_to(ROOT)}: {m[0]}" for t in texts for m in FILE_FORM.finditer(t)
            }
    assert not shown, sorted(shown)
    text = " ".join(path.read_text() for path in DOCS)
    unshown = [name for name in scripts() if f"python -m loadtest.{name}" not in text]
    assert not unshown, f"loadtest scripts the docs never show: {unshown}"


SHOWN_SCRIPT = re.compile(r"python -m loadtest\.(\w+)")
REPO_PATH = re.compile(r"`((?:kbgraph|loadtest|tests|scripts|examples)/[^`*<>…\s]*)`")


def test_what_the_docs_name_is_there() -> None:
    """Every ``python -m loadtest.<name>`` the docs show is a script, and every path of this
    repository they name in code quotes (``kbgraph/…``, ``tests/…``, ``tests/x.py::test_y``)
    exists: a module, test or script moved or removed leaves no page pointing at it. The history
    pages are dated records and may name what has since gone."""
    gone = []
    for path in DOCS:
        text = path.read_text()
        gone += [
            f"{path.relative_to(ROOT)}: python -m loadtest.{name}"
            for name in SHOWN_SCRIPT.findall(text)
            if name not in scripts()
        ]
        for named in REPO_PATH.findall(text):
            file, _, test = named.partition("::")
            there = (ROOT / file).exists()
            if there and test:
                there = f"def {test.split('[')[0]}(" in (ROOT / file).read_text()
            if not there:
                gone.append(f"{path.relative_to(ROOT)}: {named}")
    assert not gone, gone


def test_the_docs_index_names_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    pages = [p.name for p in DOCS if p.parent.name == "docs" and p.name != "README.md"]
    missing = [name for name in pages if f"({name})" not in index]
    assert not missing, f"docs/README.md does not link {missing}"


def config_keys() -> dict[str, str]:
    """Every key of ``kbgraph/config.py`` as configuration.md names it, with its default as
    TOML writes it ("(required)" for a key without one)."""
    import json

    import msgspec

    from kbgraph import config

    def toml(value: object) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, (str, list)):
            return json.dumps(value)
        return repr(value)

    def walk(struct: type, prefix: str) -> Iterator[tuple[str, str]]:
        for field in msgspec.structs.fields(struct):
            if struct is config.WebhooksConfig and field.name == "kbs":
                yield from walk(config.KBWebhooksConfig, f"{prefix}kbs.<kb>.")
                continue
            if field.default is not msgspec.NODEFAULT:
                default = field.default
            elif field.default_factory is not msgspec.NODEFAULT:
                default = field.default_factory()
            else:
                default = None
            if isinstance(default, msgspec.Struct):
                yield from walk(type(default), f"{prefix}{field.name}.")
                continue
            yield (
                f"{prefix}{field.name}",
                "(required)"
                if field.required
                else ("(none)" if default is None else toml(default)),
            )
            if struct is config.Config and field.name == "tokens":
                yield from walk(config.TokenConfig, "tokens[].")
            if struct is config.TokenConfig and field.name == "rules":
                yield from walk(config.RuleConfig, "tokens[].rules[].")

    return {key: default for key, default in walk(config.Config, "") if key != "tokens"}


def table_rows(path: Path) -> list[list[str]]:
    """The body rows of every table in a document, each a list of its cells' text."""
    tokens = MarkdownIt("commonmark").enable("table").parse(path.read_text())
    rows: list[list[str]] = []
    in_body = False
    for token in tokens:
        if token.type in ("tbody_open", "tbody_close"):
            in_body = token.type == "tbody_open"
        elif in_body and token.type == "tr_open":
            rows.append([])
        elif in_body and token.type == "inline":
            rows[-1].append(token.content.strip())
    return rows


def test_configuration_names_every_key_with_its_default() -> None:
    rows = {
        row[0].strip("`"): row[1].strip("`")
        for row in table_rows(ROOT / "docs" / "configuration.md")
        if len(row) == 3 and row[0].startswith("`") and not row[0].startswith("`kbgraph")
    }
    keys = config_keys()
    assert {"store.path", "log.jetstream.replicas", "tokens[].rules[].kb"} <= set(keys), keys
    assert rows == keys


def test_architecture_names_every_module() -> None:
    """Each module of ``kbgraph/`` is in the module table: a top-level module by its path, a
    package's module by its name in its own package's row or by its path in a row of its own."""
    rows = {row[0]: row[1] for row in table_rows(ROOT / "docs" / "architecture.md")}
    missing = []
    for path in sorted((ROOT / "kbgraph").rglob("*.py")):
        parts = path.relative_to(ROOT / "kbgraph").parts
        if parts[-1] == "__init__.py":
            continue
        if len(parts) == 1:
            named = any(f"`kbgraph/{parts[0]}`" in module for module in rows)
        else:
            package = f"`kbgraph/{'/'.join(parts[:-1])}/`"
            named = f"`{path.stem}`" in rows.get(package, "") or any(
                f"`kbgraph/{'/'.join(parts)}`" in module for module in rows
            )
        if not named:
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"modules not named in docs/architecture.md: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    return {
        slug("".join(child.content for child in tokens[i + 1].children or []))
        for i, token in enumerate(tokens)
        if token.type == "heading_open"
    }


def test_links_reach_their_pages_and_headings() -> None:
    broken = []
    for path in [*DOCS, *HISTORY]:
        for token in MarkdownIt("commonmark").parse(path.read_text()):
            for child in token.children or []:
                href = child.attrGet("href") if child.type == "link_open" else None
                if not isinstance(href, str) or "://" in href:
                    continue
                page, _, anchor = href.partition("#")
                target = (path.parent / page).resolve() if page else path
                if not target.exists():
                    broken.append(f"{path.relative_to(ROOT)}: {href}")
                elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                    broken.append(f"{path.relative_to(ROOT)}: {href} (no such heading)")
    assert not broken, broken


# --- running them -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Demo:
    folder: Path  # looks like the repository's root, with a demo/ of its own
    port: int


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    folder = tmp_path_factory.mktemp("docs")
    for entry in ROOT.iterdir():
        if entry.name not in ("demo", ".git", ".venv"):
            (folder / entry.name).symlink_to(entry)
    (folder / ".venv").symlink_to(sys.prefix)  # the venv running the tests
    command = [sys.executable, "-m", "kbgraph", "demo", "--dir", str(folder / "demo")]
    proc = ServerProcess([*command, "--port", "0"])
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        while not proc.bound.wait(0.2):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"demo did not start: {proc.tail()[-2000:]}")
        assert proc.port is not None
        while httpx.get(f"{proc.url}/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "demo not ready"
            time.sleep(0.2)
        yield Demo(folder, proc.port)
    finally:
        stop(proc)


def matches(expected: str, actual: str) -> bool:
    """Each piece of ``expected`` between ``…`` appears in ``actual``, in order."""
    flat = " ".join(actual.split())
    at = 0
    for piece in expected.split("…"):
        piece = " ".join(piece.split())
        if not piece:
            continue
        found = flat.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_run_block(block: Block, demo: Demo) -> None:
    code = DEMO_PORT.sub(f"127.0.0.1:{demo.port}", block.code)
    if block.lang == "json":
        return connect_mcp_clients(block, code, demo)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [*RUNNERS[block.lang], code],
        cwd=demo.folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_SECONDS,
    )
    said = (
        f"{block.where}:\n{code}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-3000:]}"
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {said}"
    if block.output is not None:
        assert matches(block.output, proc.stdout), f"output is not as documented: {said}"


def connect_mcp_clients(block: Block, code: str, demo: Demo) -> None:
    """Each server of an MCP client config (``mcpServers``), started or reached as the client
    would, answers a ``graph_path`` call over the demo's KB ``homelab``."""
    import json

    import anyio
    import httpx2
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

    token = re.search(r'^token = "(.*)"', (demo.folder / "demo" / "kbgraph.toml").read_text(), re.M)
    assert token is not None
    code = code.replace(CHECKOUT, f"{demo.folder}/").replace("<token>", token[1])
    servers = json.loads(code)["mcpServers"]
    arguments = {"source": "services/Immich", "target": "infra/power/UPS"}

    async def call(server: dict) -> dict:
        if "command" in server:
            params = StdioServerParameters(command=server["command"], args=server["args"])
            async with stdio_client(params) as streams, ClientSession(*streams) as session:
                await session.initialize()
                result = await session.call_tool("graph_path", arguments)
        else:
            async with (
                httpx2.AsyncClient(headers=server.get("headers", {}), timeout=30) as client,
                streamable_http_client(server["url"], http_client=client) as streams,
                ClientSession(*streams) as session,
            ):
                await session.initialize()
                result = await session.call_tool("graph_path", arguments)
        assert not result.is_error, f"{block.where}: {result.content}"
        assert result.structured_content is not None
        return result.structured_content

    assert servers, f"{block.where}: no mcpServers"
    for name, server in servers.items():
        answer = anyio.run(call, server)
        assert answer["hops"] == 2, f"{block.where}: {name}: {answer}"


def test_matches() -> None:
    assert matches('{"a": 1, …, "seq": …}', '{"a": 1, "b": 2, "seq": 85}\n')
    assert matches("x … y", "x\n\n   y")
    assert not matches("y … x", "x y")
    assert not matches('{"accepted": 1}', '{"accepted": 2}')

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from markdown_it import MarkdownIt

from tests.support import ROOT, STARTUP_SECONDS, ServerProcess, scripts, stop

pytestmark = pytest.mark.slow

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


def test_architecture_names_every_loadtest_module() -> None:
    """The ``loadtest/`` row names what is there (a module, ``bench_*`` for many, a folder
    with its ``/``), and every module of ``loadtest/`` is named in it."""
    rows = {row[0]: row[1] for row in table_rows(ROOT / "docs" / "architecture.md")}
    named = set(re.findall(r"`([\w*]+/?)`", rows["`loadtest/`"]))
    there = {
        name: list(
            (ROOT / "loadtest").glob(name.rstrip("/") if name.endswith("/") else f"{name}.py")
        )
        for name in named
    }
    gone = sorted(name for name, found in there.items() if not found)
    assert not gone, f"docs/architecture.md's loadtest/ row names what is not there: {gone}"
    unnamed = [
        path.name
        for path in sorted((ROOT / "loadtest").glob("*.py"))
        if path.stem not in ("__init__", "__main__")
        if not any(path in found for found in there.values())
    ]
    assert not unnamed, f"loadtest modules not in docs/architecture.md's loadtest/ row: {unnamed}"


# --- what the docs show of the command lines and the config -----------------------------------

COMMAND = re.compile(r"python -m loadtest(?:\.(\w+))?\b|(?<![\w.-])kbgraph(?= )")
OPTION = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
SEPARATORS = "|;&>)`\n"  # where a shell command ends (outside square brackets)


def shown_code(path: Path) -> Iterator[str]:
    """The code a page shows: each fenced block's lines (``\\`` continuations joined) and
    each inline code span, tables' cells among them."""
    for token in MarkdownIt("commonmark").enable("table").parse(path.read_text()):
        if token.type == "fence":
            yield from token.content.replace("\\\n", " ").splitlines()
        yield from (c.content for c in token.children or [] if c.type == "code_inline")


def command_tail(text: str) -> str:
    """``text`` up to where its first shell command ends (a ``|`` between ``[...]`` is the
    usage's either-or, not a pipe)."""
    depth = 0
    for at, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth <= 0 and char in SEPARATORS:
            return text[:at]
    return text


def help_of(run: Callable[[], object], argv: list[str]) -> str | None:
    """What ``run()`` prints with ``sys.argv`` set to ``argv``, in this process, when it exits
    with 0 (``--help``), else None."""
    import contextlib
    import io

    printed = io.StringIO()
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
            run()
    except SystemExit as exit:
        return printed.getvalue() if exit.code in (0, None) else None
    finally:
        sys.argv = saved
    raise AssertionError(f"{argv} did not exit")


def accepted_options(match: re.Match[str], tail: str) -> tuple[str, set[str]] | None:
    """The command a docs line shows and the options its parser accepts (from its ``--help``,
    built in this process), or None when ``kbgraph`` there is a word, not a command."""
    import importlib

    from kbgraph.cli import build_parser

    if match[0].startswith("python"):
        name = match[1] or "driver"  # python -m loadtest: loadtest/__main__.py runs the driver
        module = importlib.import_module(f"loadtest.{name}")
        shown = help_of(module.main, [name, "--help"])
        command = match[0]
    else:
        words = []
        for word in tail.split():
            if word.startswith(("-", "[")):
                break
            words.append(word)
        shown = None
        while words and shown is None:
            shown = help_of(lambda: build_parser().parse_args([*words, "--help"]), ["kbgraph"])
            command = " ".join(["kbgraph", *words])
            words.pop()
        if shown is None:
            return None
    assert shown is not None, f"{command} --help failed"
    return command, set(OPTION.findall(shown))


def test_the_options_the_docs_show_are_accepted() -> None:
    """Every ``--option`` a docs line shows for ``python -m loadtest[.<name>]`` or
    ``kbgraph <command>`` (run or not) is one its parser accepts."""
    wrong = []
    checked = 0
    for path in DOCS:
        for code in shown_code(path):
            for match in COMMAND.finditer(code):
                tail = command_tail(code[match.end() :])
                found = accepted_options(match, tail)
                if found is None:
                    continue
                command, accepted = found
                checked += 1
                wrong += [
                    f"{path.relative_to(ROOT)}: {command} {option}"
                    for option in OPTION.findall(tail)
                    if option not in accepted
                ]
    assert checked >= 50, checked
    assert not wrong, f"options the docs show that their command does not accept: {wrong}"


SECTION_KEY = re.compile(r"\[([a-z][\w.]*)\] ([a-z][\w*]*)(?: = .*)?")


def toml_keys(table: dict[str, object], prefix: str, keys: set[str]) -> Iterator[str]:
    """The keys of a parsed TOML table as ``config_keys`` names them (``tokens[].name``,
    ``webhooks.kbs.<kb>.secrets``), tables walked while the config has keys below them."""
    for name, value in table.items():
        key = "webhooks.kbs.<kb>" if prefix == "webhooks.kbs." else f"{prefix}{name}"
        if isinstance(value, dict) and any(k.startswith(f"{key}.") for k in keys):
            yield from toml_keys(value, f"{key}.", keys)
        elif isinstance(value, list) and any(k.startswith(f"{key}[].") for k in keys):
            for item in value:
                yield from toml_keys(item, f"{key}[].", keys)
        else:
            yield key


def test_the_config_keys_the_docs_name_are_keys() -> None:
    """Every key a docs page sets in a ``toml`` block, or names as ``[section] key``, is a key
    of ``kbgraph/config.py`` (or a section of them; ``*`` matching any part of a name)."""
    import tomllib

    keys = set(config_keys())
    known = keys | {key.rsplit(".", n)[0] for key in keys for n in range(1, key.count(".") + 1)}
    wrong = []
    named = 0
    for path in DOCS:
        where = path.relative_to(ROOT)
        shown = [
            key
            for block in blocks(path)
            if block.lang == "toml"
            for key in toml_keys(tomllib.loads(block.code), "", keys)
        ]
        for code in shown_code(path):
            if match := SECTION_KEY.fullmatch(code):
                section = re.sub(r"^webhooks\.kbs\.[^.]+", "webhooks.kbs.<kb>", match[1])
                shown.append(f"{section}.{match[2]}")
        named += len(shown)
        for key in shown:
            pattern = re.compile(".*".join(re.escape(part) for part in key.split("*")))
            if not any(pattern.fullmatch(k) for k in known):
                wrong.append(f"{where}: {key}")
    assert named >= 50, named
    assert not wrong, f"config keys the docs name that kbgraph/config.py has not: {wrong}"


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

"""One meaning of a link count: a vault's import summary, ``/status``, ``GET /v1/kbs`` (which
the explorer shows) all count pairs of notes linked either way, checked against an oracle
computed from the vault as generated (not from the reader)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from kbgraph.api import context_of, create_app
from kbgraph.config import load_config
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sync import sync_once
from tests.support import ADMIN, bearer, write_config
from tests.vault_files import VAULT, AppSink

# note i -> the notes it links to; an index past the last note is a link to no note
vaults = st.integers(1, 7).flatmap(
    lambda n: st.lists(st.lists(st.integers(0, n + 1), max_size=6), min_size=n, max_size=n)
)


def counts_seen(root: Path, folder: Path) -> tuple[int, int, int, str]:
    """(summary's links, /status links, /v1/kbs links, summary) for ``root`` imported into an
    empty KB of a fresh service."""
    app = create_app(load_config(write_config(folder)))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        with Manifest(folder / "manifest.sqlite") as manifest:
            report = sync_once(root, "kb", AppSink(context_of(app).service.store), manifest)
        headers = {**bearer(ADMIN), "X-Min-Seq": "1"}
        status = client.get("/v1/kbs/kb/status", headers=headers).json()
        listed = client.get("/v1/kbs", headers=headers).json()["kbs"]
    summary = report.summary()
    written = re.match(r"\d+ notes, (\d+) links between them", summary)
    assert written is not None, summary
    (kb,) = [entry for entry in listed if entry["kb"] == "kb"]
    return int(written.group(1)), status["links"], kb["links"], summary


@settings(max_examples=12)
@given(vaults)
def test_import_summary_and_status_count_links_alike(links: list[list[int]]) -> None:
    n = len(links)
    pairs = {frozenset((i, j)) for i, targets in enumerate(links) for j in targets}
    want = sum(1 for pair in pairs if len(pair) == 2 and max(pair) < n)  # the oracle
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        root = folder / "vault"
        root.mkdir()
        for i, targets in enumerate(links):
            (root / f"n{i}.md").write_text(" ".join(f"[[n{j}]]" for j in targets) + "\n")
        summary_links, status_links, listed_links, summary = counts_seen(root, folder)
    assert summary_links == status_links == listed_links == want, summary


def test_the_example_vault_counts_alike(tmp_path: Path) -> None:
    summary_links, status_links, listed_links, summary = counts_seen(VAULT, tmp_path)
    assert summary_links == status_links == listed_links > 400, summary

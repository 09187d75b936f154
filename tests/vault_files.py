"""Vaults for the tests: fixture vaults written from {relative path: text or bytes}, the
example vault, a sink straight into a store, and a vault's import read back as a KB's state."""

from __future__ import annotations

from pathlib import Path

from kbgraph.events import Event
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import LocalSink
from kbgraph.sources.sync import sync_once
from kbgraph.store import ConceptState, DeliveryResult, Store


def write_vault(root: Path, files: dict[str, str | bytes]) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


def comparable(concepts: list[ConceptState]) -> dict[str, tuple]:
    """A KB's state without versions: what a sync and a fresh import must agree on."""
    return {
        c.id: (c.title, c.aliases, c.type, c.status, c.tags, c.text, sorted(c.links))
        for c in concepts
    }


VAULT = Path(__file__).resolve().parent.parent / "examples" / "vault"


class AppSink:
    """Deliveries straight into the running app's store (``Store.append``)."""

    def __init__(self, store: Store) -> None:
        self.store, self.dest = store, "app"

    def send(self, kb: str, events: list[Event]) -> DeliveryResult:
        return self.store.append(kb, events)

    def kb_seq(self, kb: str) -> int | None:
        return self.store.kb_seq(kb)

    def close(self) -> None:
        pass


def state(store: Store, kb: str = "kb") -> dict[str, tuple]:
    kbstate = store.load().kbs.get(kb)
    return comparable(kbstate.concepts) if kbstate else {}


def versions(store: Store, kb: str = "kb") -> dict[str, int]:
    kbstate = store.load().kbs.get(kb)
    return {c.id: c.version for c in kbstate.concepts} if kbstate else {}


def fresh_import(root: Path, store_path: Path) -> dict[str, tuple]:
    sink = LocalSink(store_path)
    try:
        with Manifest(store_path.with_suffix(".manifest")) as manifest:
            sync_once(root, "kb", sink, manifest)
        return state(sink.store)
    finally:
        sink.close()

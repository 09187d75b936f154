"""Write fixture vaults for the vault tests: {relative path: text or bytes}."""

from __future__ import annotations

from pathlib import Path

from kbgraph.store import ConceptState


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

"""The demo's data: the synthetic KB ``demo`` and where the example vault (KB ``homelab``) is.

- ``seed_kb(n, seed)``: concept ``i`` is ``f"{col}/c{i:04d}"`` (``c%07d`` when n > 10,000) with
  ``col = COLLECTIONS[i % 9]``, 8 out-links to uniform random other concepts, 5% of them to
  concepts that never exist. Deterministic for ``(n, seed)``. The load tests and benchmarks
  build on the same generator (``loadtest.synthetic``).
- ``demo_concepts(n)``: ``seed_kb(n)`` with a line of text per concept, as ``kbgraph demo``
  seeds it.
- ``example_vault()``: the example vault: inside the installed package (``example_vault/``,
  copied there when the wheel is built), else the checkout's ``examples/vault``.
"""

from __future__ import annotations

import random
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np

COLLECTIONS: Final = (
    "infra",
    "apps",
    "network",
    "storage",
    "security",
    "people",
    "vendors",
    "ops",
    "journal",
)
TYPES: Final = ("Runbook", "Service", "Host", "Note", "Person", "Vendor", "Decision")
LINKS_PER_CONCEPT: Final = 8
MISSING_SHARE: Final = 0.05
WORDS: Final = (
    "dns",
    "backup",
    "router",
    "cluster",
    "vpn",
    "certificate",
    "disk",
    "ingress",
    "monitoring",
    "firewall",
    "database",
    "mail",
    "proxy",
    "storage",
    "upgrade",
    "incident",
)
PACKAGED_VAULT: Final = "example_vault"  # the folder inside the package (see setup.py)
CHECKOUT_VAULT: Final = ("examples", "vault")  # beside the package in a source checkout


def concept_id(i: int, n: int) -> str:
    """Id of concept ``i`` in a KB of ``n`` concepts."""
    col = COLLECTIONS[i % len(COLLECTIONS)]
    return f"{col}/c{i:07d}" if n > 10_000 else f"{col}/c{i:04d}"


def missing_id(j: int) -> str:
    """An id that no synthetic concept ever has (a declared link to a missing concept)."""
    return f"{COLLECTIONS[j % len(COLLECTIONS)]}/missing-{j}"


def kb_ids(n: int) -> list[str]:
    return [concept_id(i, n) for i in range(n)]


def seed_links(n: int, seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """The seed KB's links as int arrays ``(src, dst)``; ``dst == -1`` marks a missing target."""
    rng = np.random.default_rng(seed)
    src = np.repeat(np.arange(n, dtype=np.int64), LINKS_PER_CONCEPT)
    # uniform over the other n - 1 concepts
    dst = rng.integers(0, max(n - 1, 1), size=src.shape[0], dtype=np.int64)
    dst = np.where(dst >= src, dst + 1, dst) if n > 1 else np.zeros_like(src)
    missing = rng.random(src.shape[0]) < MISSING_SHARE
    dst[missing] = -1
    return src, dst


def concepts_from_links(
    n: int, src: np.ndarray, dst: np.ndarray, seed: int
) -> list[dict[str, Any]]:
    """``[{"id", "title", "type", "links"}]`` for ``n`` concepts linked ``src[k] -> dst[k]``."""
    ids = kb_ids(n)
    rng = random.Random(seed)
    links: list[list[str]] = [[] for _ in range(n)]
    for k, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
        links[s].append(ids[d] if d >= 0 else missing_id(k))
    out = []
    for i in range(n):
        title = f"{rng.choice(WORDS).title()} {rng.choice(WORDS)} {i}"
        out.append(
            {
                "id": ids[i],
                "title": title,
                "type": TYPES[rng.randrange(len(TYPES))],
                "links": links[i],
            }
        )
    return out


def seed_kb(n: int = 1000, seed: int = 42) -> list[dict[str, Any]]:
    """The seed's synthetic KB: ``[{"id", "title", "type", "links"}]`` (no ``text``)."""
    src, dst = seed_links(n, seed)
    return concepts_from_links(n, src, dst, seed)


def demo_concepts(size: int) -> list[dict[str, Any]]:
    """``seed_kb(size)``, each concept given a line of text naming its type and first links."""
    concepts = seed_kb(size)
    for concept in concepts:
        collection = concept["id"].split("/", 1)[0]
        related = ", ".join(concept["links"][:3]) or "nothing yet"
        concept["text"] = (
            f"{concept['title']}: a {concept['type']} in the {collection} collection. "
            f"Related: {related}."
        )
    return concepts


def example_vault() -> Path:
    """The example vault's folder: the installed package's copy, else the checkout's."""
    package = Path(str(resources.files("kbgraph")))
    packaged = package / PACKAGED_VAULT
    if packaged.is_dir():
        return packaged
    return package.resolve().parent.joinpath(*CHECKOUT_VAULT)

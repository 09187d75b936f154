"""The model check: what every acknowledged delivery must have done, compared with the service."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from loadtest.httpload import HTTPLoadError, Pool
from loadtest.recorder import Recorder
from loadtest.service import KB, Credentials


@dataclass
class ModelConcept:
    version: int | None = None  # the last applied version (also of a deletion); None: never
    exists: bool = False
    fields: dict[str, Any] = field(default_factory=dict)
    links: set[str] = field(default_factory=set)


class Counts(msgspec.Struct):
    accepted: int = 0
    applied: int = 0
    duplicates: int = 0
    stale: int = 0
    ignored: int = 0


class Model:
    """The contract's rules (docs/events.md), applied to acknowledged deliveries in order."""

    def __init__(self) -> None:
        self.accepted: set[tuple[str, str]] = set()
        self.concepts: dict[str, ModelConcept] = {}
        self.applied = 0
        self._backlinks: dict[str, list[str]] | None = None  # target -> linkers, on demand

    def apply(self, events: Sequence[dict[str, Any]]) -> Counts:
        self._backlinks = None
        counts = Counts(accepted=len(events))
        for event in events:
            key = (event["source"], event["id"])
            if key in self.accepted:
                counts.duplicates += 1
                continue
            self.accepted.add(key)
            subject = event["subject"]
            data = event["data"]
            concept = self.concepts.setdefault(subject, ModelConcept())
            version = data["version"]
            if concept.version is not None and version <= concept.version:
                counts.stale += 1
                continue
            kind = event["type"]
            if kind in ("link.added", "link.removed"):
                if not concept.exists:
                    counts.ignored += 1
                    continue
                target = data["target"]
                if kind == "link.removed":
                    concept.links.discard(target)
                elif target != subject:
                    concept.links.add(target)
            elif kind == "concept.upserted":
                concept.exists = True
                concept.fields = {
                    "title": data.get("title", ""),
                    "aliases": list(data.get("aliases", [])),
                    "type": data.get("type", ""),
                    "status": data.get("status", ""),
                    "tags": list(data.get("tags", [])),
                    "text": data.get("text", ""),
                }
                concept.links = set(data.get("links", [])) - {subject}
            elif kind == "concept.deleted":
                concept.exists = False
                concept.fields = {}
                concept.links = set()
            else:
                raise ValueError(f"unknown event type {kind}")
            concept.version = version
            counts.applied += 1
        self.applied += counts.applied
        return counts

    def expected(self, concept_id: str) -> dict[str, Any] | None:
        """The admin's ``GET concepts/{id}`` body, or None for a 404."""
        concept = self.concepts.get(concept_id)
        if concept is None or not concept.exists:
            return None
        links = sorted(t for t in concept.links if self._exists(t))
        if self._backlinks is None:
            self._backlinks = {}
            for source, other in sorted(self.concepts.items()):
                if other.exists:
                    for target in other.links:
                        self._backlinks.setdefault(target, []).append(source)
        backlinks = self._backlinks.get(concept_id, [])
        return {
            "id": concept_id,
            **concept.fields,
            "version": concept.version,
            "links": links,
            "backlinks": backlinks,
        }

    def _exists(self, concept_id: str) -> bool:
        concept = self.concepts.get(concept_id)
        return concept is not None and concept.exists

    def status(self) -> tuple[int, int]:
        """(existing concepts, undirected edges between existing concepts)."""
        edges: set[tuple[str, str]] = set()
        count = 0
        for cid, concept in self.concepts.items():
            if not concept.exists:
                continue
            count += 1
            for target in concept.links:
                if target != cid and self._exists(target):
                    edges.add((cid, target) if cid < target else (target, cid))
        return count, len(edges)


async def verify(pool: Pool, model: Model, creds: Credentials, rec: Recorder) -> dict[str, Any]:
    """Compare the service with the model as admin: every concept, the status, the log length."""
    headers = {"authorization": f"Bearer {creds.admin}", "x-min-seq": str(rec.max_seq)}
    response = await pool.request("GET", f"/v1/kbs/{KB}/status", headers, timeout=30.0)
    rec.status("verify", response.status)
    status = msgspec.json.decode(response.body) if response.status == 200 else {}
    found_seq = int(response.headers.get("x-kb-seq", "-1"))
    want_concepts, want_links = model.status()
    mismatches: list[str] = []
    ids = sorted(model.concepts)
    checked = 0

    async def check(concept_id: str) -> None:
        nonlocal checked
        path = f"/v1/kbs/{KB}/concepts/{urllib.parse.quote(concept_id, safe='/')}"
        for _ in range(3):
            try:
                answer = await pool.request("GET", path, headers, retry=True, timeout=30.0)
                break
            except (HTTPLoadError, TimeoutError) as exc:
                rec.failures.append(f"verify {concept_id}: {exc!r}")
        else:
            mismatches.append(f"{concept_id}: no answer")
            return
        rec.status("verify", answer.status)
        checked += 1
        want = model.expected(concept_id)
        if want is None:
            if answer.status != 404:
                mismatches.append(f"{concept_id}: expected 404, got {answer.status}")
            return
        if answer.status != 200:
            mismatches.append(f"{concept_id}: expected 200, got {answer.status}")
            return
        got = msgspec.json.decode(answer.body)
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            detail = {k: {"service": got.get(k), "model": want.get(k)} for k in diff[:3]}
            mismatches.append(f"{concept_id}: {json.dumps(detail)[:400]}")

    for start in range(0, len(ids), 64):
        await asyncio.gather(*(check(cid) for cid in ids[start : start + 64]))

    return {
        "concepts_checked": checked,
        "concept_mismatches": len(mismatches),
        "mismatch_samples": mismatches[:20],
        "status_concepts": {"expected": want_concepts, "found": status.get("concepts")},
        "status_links": {"expected": want_links, "found": status.get("links")},
        "applied_expected": model.applied,
        "applied_found": found_seq,
        "last_acknowledged_seq": rec.max_seq,
    }

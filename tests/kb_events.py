"""Build CloudEvents structs for tests without spelling out envelopes."""

from __future__ import annotations

import itertools

from kbgraph.events import (
    ConceptDeleted,
    ConceptUpserted,
    DeleteData,
    Event,
    LinkAdded,
    LinkData,
    LinkRemoved,
    UpsertData,
)

_ids = itertools.count()
SOURCE = "test://kb"


def _envelope() -> dict[str, str]:
    return {"specversion": "1.0", "id": f"e{next(_ids)}", "source": SOURCE}


def upsert(
    subject: str,
    version: int = 1,
    *,
    links: list[str] | None = None,
    title: str | None = None,
    type: str = "",
    status: str = "",
    text: str = "",
    tags: list[str] | None = None,
    aliases: list[str] | None = None,
) -> ConceptUpserted:
    data = UpsertData(
        version=version,
        title=subject if title is None else title,
        aliases=aliases or [],
        type=type,
        status=status,  # type: ignore[arg-type]
        tags=tags or [],
        text=text,
        links=links or [],
    )
    return ConceptUpserted(subject=subject, data=data, **_envelope())


def delete(subject: str, version: int) -> ConceptDeleted:
    return ConceptDeleted(subject=subject, data=DeleteData(version=version), **_envelope())


def link_added(subject: str, target: str, version: int) -> LinkAdded:
    return LinkAdded(subject=subject, data=LinkData(version, target), **_envelope())


def link_removed(subject: str, target: str, version: int) -> LinkRemoved:
    return LinkRemoved(subject=subject, data=LinkData(version, target), **_envelope())


def as_json(events: list[Event]) -> list[dict]:
    """The events as the JSON objects a KB would send (for real webhook deliveries)."""
    import msgspec

    return [msgspec.to_builtins(event) for event in events]

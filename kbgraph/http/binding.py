"""The CloudEvents HTTP binding: which content mode a request is in, and its events.

The binding (CloudEvents 1.0, HTTP Protocol Binding, section 3) tells the modes apart by the
``Content-Type``: ``application/cloudevents+json`` is structured (one event),
``application/cloudevents-batch+json`` batched (an array), and any other content type with a
``ce-specversion`` header is binary: the event's attributes are the ``ce-*`` headers, their
values percent-encoded (section 3.1.3.2), the ``Content-Type`` is its ``datacontenttype``
(section 3.1.1), and the body is the event's ``data``, here JSON.
``application/json`` without ``ce-specversion`` holds an event or an array (docs/events.md).
Every mode ends in the same validation (``kbgraph.events``), so an event means the same
whichever way it came.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final
from urllib.parse import unquote

import msgspec

from kbgraph.events import (
    BATCH_TYPES,
    SINGLE_TYPES,
    TOO_DEEP,
    DeliveryError,
    Event,
    check_event,
    decode_delivery,
    media_type,
    name_where,
    raise_if_too_deep,
)

ATTRIBUTES: Final = ("specversion", "id", "source", "type", "subject", "time", "dataschema")
REQUIRED: Final = ("specversion", "id", "source", "type", "subject")

_data_decoder = msgspec.json.Decoder()


def is_binary(headers: Mapping[str, str]) -> bool:
    """Binary content mode: a ``ce-specversion`` header and no CloudEvents content type."""
    kind = media_type(headers.get("content-type"))
    return "ce-specversion" in headers and kind not in SINGLE_TYPES | BATCH_TYPES


def decode_events(body: bytes, headers: Mapping[str, str]) -> list[Event]:
    """The events of one delivery in any content mode, or ``DeliveryError`` naming what is
    wrong and, where it helps, the mode the request was taken to be in."""
    if is_binary(headers):
        return [_binary_event(body, headers)]
    try:
        return decode_delivery(body, headers.get("content-type"))
    except DeliveryError as exc:
        ce = sorted(name for name in headers if name.startswith("ce-"))
        if ce and "ce-specversion" not in headers and exc.status in (415, 422):
            # the sender meant binary mode and left out the header that tells it apart
            raise DeliveryError(
                exc.status,
                f"{exc.message}; the request has {', '.join(ce)} but no ce-specversion header,"
                " which binary mode needs",
            ) from None
        raise


def _binary_event(body: bytes, headers: Mapping[str, str]) -> Event:
    content_type = headers.get("content-type", "")
    kind = media_type(content_type) or "(none)"
    mode = f"binary mode (a ce-specversion header, Content-Type {kind})"
    ce: dict[str, str] = {}
    repeated: set[str] = set()
    for name, value in headers.items():  # Starlette's headers list a repeated header each time
        if name.startswith("ce-"):
            if name in ce:
                repeated.add(name)
            ce[name] = value
    if repeated:
        raise DeliveryError(
            422,
            f"{mode}: header {', '.join(sorted(repeated))} sent more than once: an attribute"
            " has one value",
        )
    missing = [f"ce-{name}" for name in REQUIRED if f"ce-{name}" not in ce]
    if missing:
        raise DeliveryError(422, f"{mode}: missing header {', '.join(missing)}")
    if kind != "application/json" and not kind.endswith("+json"):
        raise DeliveryError(415, f"{mode}: the data must be JSON (application/json)")
    attributes: dict[str, object] = {"datacontenttype": content_type}
    for name in ATTRIBUTES:
        raw = ce.get(f"ce-{name}")
        if raw is not None:
            try:
                attributes[name] = unquote(raw, errors="strict") if "%" in raw else raw
            except UnicodeDecodeError:
                raise DeliveryError(
                    422, f"ce-{name} header: its percent-encoding is not UTF-8"
                ) from None
    try:
        data = _data_decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise DeliveryError(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise DeliveryError(400, TOO_DEEP) from None
    raise_if_too_deep(data)
    try:
        event = msgspec.convert({**attributes, "data": data}, Event)
    except msgspec.ValidationError as exc:
        where = name_where(str(exc), "event")
        for name in ATTRIBUTES:  # an attribute's fault is its header's
            if where.startswith(f"event.{name}:"):
                where = f"ce-{name} header:" + where.removeprefix(f"event.{name}:")
        raise DeliveryError(422, where) from None
    return check_event(event, "event")

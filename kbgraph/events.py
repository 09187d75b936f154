"""Events in: the CloudEvents 1.0 envelope, the four event types, and webhook signatures.

A delivery is one event or a JSON array of events (docs/events.md). Decoding is strict: every
problem is reported as ``<where>: <what>``, with ``events[i]`` naming the event in a batch
(``event`` for a single one), so a KB operator can find the offending field at once.
"""

from __future__ import annotations

import itertools
import operator
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Annotated, Final, Literal

import msgspec
from standardwebhooks.webhooks import Webhook

from kbgraph.names import all_plain_ids, concept_id_problem

MAX_TEXT_BYTES: Final = 1 << 20
# a text of at most this many characters is under MAX_TEXT_BYTES in UTF-8 (4 bytes a character
# at most): only a longer one is encoded to be measured
SURELY_SHORT_CHARS: Final = MAX_TEXT_BYTES // 4
MAX_VERSION: Final = (1 << 63) - 1
MAX_ALIASES: Final = 64
MAX_ALIAS_CHARS: Final = 1024
# Bounds per concept (docs/operations.md "Limits"): past one, 422 naming the field.
MAX_TITLE_CHARS: Final = 1024
MAX_TYPE_CHARS: Final = 256
MAX_TAGS: Final = 256
MAX_TAG_CHARS: Final = 256
MAX_LINKS: Final = 10_000

Version = Annotated[int, msgspec.Meta(ge=0, le=MAX_VERSION)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Alias = Annotated[str, msgspec.Meta(max_length=MAX_ALIAS_CHARS)]
Aliases = Annotated[list[Alias], msgspec.Meta(max_length=MAX_ALIASES)]
Title = Annotated[str, msgspec.Meta(max_length=MAX_TITLE_CHARS)]
TypeName = Annotated[str, msgspec.Meta(max_length=MAX_TYPE_CHARS)]
Tags = Annotated[list[Annotated[str, msgspec.Meta(max_length=MAX_TAG_CHARS)]],
                 msgspec.Meta(max_length=MAX_TAGS)]  # fmt: skip
Links = Annotated[list[str], msgspec.Meta(max_length=MAX_LINKS)]
Status = Literal["", "draft", "active", "superseded", "disputed", "deprecated"]


class UpsertData(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The full current state of a concept: an omitted field is empty, not "unchanged"."""

    version: Version
    title: Title = ""
    aliases: Aliases = []
    type: TypeName = ""
    status: Status = ""
    tags: Tags = []
    text: str = ""
    links: Links = []


class DeleteData(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    version: Version


class LinkData(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    version: Version
    target: str


class _Envelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """CloudEvents 1.0 attributes; unknown extension attributes are ignored, as the spec allows."""

    specversion: Literal["1.0"]
    id: NonEmpty
    source: NonEmpty
    subject: str
    time: str | None = None
    datacontenttype: str | None = None
    dataschema: str | None = None


class ConceptUpserted(_Envelope, frozen=True, tag="concept.upserted"):
    data: UpsertData


class ConceptDeleted(_Envelope, frozen=True, tag="concept.deleted"):
    data: DeleteData


class LinkAdded(_Envelope, frozen=True, tag="link.added"):
    data: LinkData


class LinkRemoved(_Envelope, frozen=True, tag="link.removed"):
    data: LinkData


Event = ConceptUpserted | ConceptDeleted | LinkAdded | LinkRemoved
LinkEvent = LinkAdded | LinkRemoved

SINGLE_TYPES: Final = frozenset({"application/cloudevents+json"})
BATCH_TYPES: Final = frozenset({"application/cloudevents-batch+json"})
_EITHER_TYPES: Final = frozenset({"application/json"})

_single_decoder = msgspec.json.Decoder(Event)
_batch_decoder = msgspec.json.Decoder(list[Event])
_either_decoder = msgspec.json.Decoder(Event | list[Event])
_DeliveryDecoder = (  # whichever of the three a content type selects
    msgspec.json.Decoder[Event]
    | msgspec.json.Decoder[list[Event]]
    | msgspec.json.Decoder[Event | list[Event]]
)
_log_encoder = msgspec.msgpack.Encoder()
_log_decoder = msgspec.msgpack.Decoder(Event)

_MSGSPEC_PATH = re.compile(r"^(?P<what>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)


ECHO_CHARS: Final = 200  # of a value an error repeats (a caller's could be a megabyte)


class Refused(Exception):
    """A refusal: the ``status``, ``message`` and ``headers`` of its ``{"error": message}``
    answer. The service's one refusal type (as Starlette has one ``HTTPException``); the
    subclasses name where a refusal came from, for the code that catches one kind only."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class DeliveryError(Refused):
    """A delivery refused as a whole."""


def media_type(content_type: str | None) -> str:
    """The media type of a Content-Type header, lower-cased, without parameters."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def decode_delivery(body: bytes, content_type: str | None) -> list[Event]:
    """Decode and validate a delivery body, or raise DeliveryError (400, 415 or 422)."""
    kind = media_type(content_type)
    if kind in SINGLE_TYPES:
        decoder: _DeliveryDecoder = _single_decoder
    elif kind in BATCH_TYPES:
        decoder = _batch_decoder
    elif kind in _EITHER_TYPES:
        decoder = _either_decoder
    else:
        raise DeliveryError(
            415,
            f"unsupported content type {kind or '(none)'!r}: expected application/json, "
            "application/cloudevents+json or application/cloudevents-batch+json (or binary "
            "mode: the event's attributes as ce-* headers, its data as the body)",
        )
    try:
        decoded = decoder.decode(body)
    except msgspec.ValidationError as exc:
        _raise_if_malformed(body)
        root = "events" if body.lstrip()[:1] == b"[" else "event"
        where = name_where(str(exc), root)
        missing = _TOP_MISSING.match(where)
        if missing:  # e.g. the data alone sent without the binary mode's ce-* headers
            where += (
                f" (structured mode, Content-Type {kind}: each event is an object with the "
                "attributes specversion, id, source, type, subject and data; to send the data "
                "alone, use binary mode: the attributes as ce-* headers)"
            )
        raise DeliveryError(422, where) from None
    except msgspec.DecodeError as exc:
        raise DeliveryError(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise DeliveryError(400, TOO_DEEP) from None
    if isinstance(decoded, list):
        return check_events(decoded)
    return [check_event(decoded, "event")]


_TOP_MISSING: Final = re.compile(r"^events?(\[\d+\])?: Object missing required field")


def _raise_if_malformed(body: bytes) -> None:
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise DeliveryError(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise DeliveryError(400, TOO_DEEP) from None
    raise_if_too_deep(value)


# JSON nested deeper than this is refused as malformed (400) on every platform. Without a
# bound of our own the answer would hang on the interpreter: msgspec stops at Python's
# recursion limit, which on 3.11 is hit near 1,000 levels (400) and on 3.12+ much further
# (the body decodes, then fails validation: 422). A valid delivery nests 4 levels deep.
MAX_JSON_DEPTH: Final = 64
TOO_DEEP: Final = f"malformed JSON: nested too deeply (more than {MAX_JSON_DEPTH} levels)"


def raise_if_too_deep(value: object) -> None:
    """``DeliveryError`` 400 when ``value`` (decoded JSON) nests past ``MAX_JSON_DEPTH``."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise DeliveryError(400, TOO_DEEP)
        stack.extend((child, depth + 1) for child in children)


def name_where(message: str, root: str) -> str:
    """Turn msgspec's "Expected `int`, got `str` - at `$[3].data.version`" into
    "events[3].data.version: Expected int, got str"."""
    match = _MSGSPEC_PATH.match(message)
    if match is None:
        return f"{root}: {message.replace('`', '')}"
    return f"{root}{match['path']}: {match['what'].replace('`', '')}"


def _nfc(concept_id: str) -> str:
    return concept_id if concept_id.isascii() else unicodedata.normalize("NFC", concept_id)


def check_event(event: Event, where: str) -> Event:
    """The checks a JSON schema cannot express (id syntax, the text's size), and ids in NFC:
    "café" typed on one keyboard and stored as a macOS file name is one concept, not two."""
    problem = concept_id_problem(event.subject)
    if problem:
        raise DeliveryError(422, f"{where}.subject: {problem}")
    data = event.data
    if isinstance(data, LinkData):
        problem = concept_id_problem(data.target)
        if problem:
            raise DeliveryError(422, f"{where}.data.target: {problem}")
        if not (event.subject.isascii() and data.target.isascii()):
            data = msgspec.structs.replace(data, target=_nfc(data.target))
    elif isinstance(data, UpsertData):
        for index, link in enumerate(data.links):
            problem = concept_id_problem(link)
            if problem:
                raise DeliveryError(422, f"{where}.data.links[{index}]: {problem}")
        if len(data.text) > SURELY_SHORT_CHARS and len(data.text.encode()) > MAX_TEXT_BYTES:
            raise DeliveryError(422, f"{where}.data.text: longer than 1 MiB")
        if not all(link.isascii() for link in data.links):
            data = msgspec.structs.replace(data, links=[_nfc(link) for link in data.links])
    if data is not event.data or not event.subject.isascii():
        event = msgspec.structs.replace(event, subject=_nfc(event.subject), data=data)
    return event


_DATA: Final = operator.attrgetter("data")
_SUBJECT: Final = operator.attrgetter("subject")
_LINKS: Final = operator.attrgetter("links")
_TARGET: Final = operator.attrgetter("target")
_TEXT: Final = operator.attrgetter("text")


def check_events(events: list[Event]) -> list[Event]:
    """``check_event`` of each event of a batch (``events[i]``). The common delivery, every id
    valid and ASCII and every text short, is checked at once (``all_plain_ids``: one regex
    call for its thousands of ids, not a call an id) and its events are returned as they are,
    which is what ``check_event`` returns for each; any other is checked event by event, the
    first problem refusing it as before."""
    datas = list(map(_DATA, events))
    kinds = set(map(type, datas))
    ids = list(map(_SUBJECT, events))
    plain = True
    if UpsertData in kinds:
        upserts = datas if len(kinds) == 1 else [d for d in datas if type(d) is UpsertData]
        plain = max(map(len, map(_TEXT, upserts))) <= SURELY_SHORT_CHARS
        ids.extend(itertools.chain.from_iterable(map(_LINKS, upserts)))
    if LinkData in kinds:
        ids.extend(map(_TARGET, datas if len(kinds) == 1 else filter(_is_link_data, datas)))
    if plain and all_plain_ids(ids):
        return events
    return [check_event(event, f"events[{index}]") for index, event in enumerate(events)]


def _is_link_data(data: object) -> bool:
    return type(data) is LinkData


def encode_for_log(event: Event) -> bytes:
    """The event as the log stores it (MessagePack; decoded by ``decode_from_log``)."""
    return _log_encoder.encode(event)


def decode_from_log(payload: bytes) -> Event:
    return _log_decoder.decode(payload)


class SignatureVerifier:
    """Standard Webhooks signature checks with several secrets accepted at once (rotation).

    The HMAC and timestamp rules (5 minutes either way) are the ``standardwebhooks`` package's;
    a delivery passes when any configured secret verifies it. Every error the package can raise
    on hostile headers or bodies (bad base64, malformed entries, non-UTF-8) counts as "not
    verified": the caller answers 401 and stores nothing.
    """

    HEADERS: Final = ("webhook-id", "webhook-timestamp", "webhook-signature")
    TOLERANCE_SECONDS: Final = 300  # the package's own tolerance, checked early here

    def __init__(self, secrets: list[str]) -> None:
        self._webhooks = [Webhook(secret) for secret in secrets]

    @property
    def enabled(self) -> bool:
        return bool(self._webhooks)

    def header_problem(self, headers: Mapping[str, str], now: float) -> str | None:
        """What is wrong with the signature headers alone, checked before a body byte is read,
        so an unsigned or stale upload costs nothing; None when they may verify."""
        missing = [name for name in self.HEADERS if not headers.get(name)]
        if missing:
            return f"missing webhook header {', '.join(missing)}"
        stamp = headers["webhook-timestamp"]
        if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
            return "webhook-timestamp: expected Unix seconds"
        if abs(now - int(stamp)) > self.TOLERANCE_SECONDS:
            return "webhook-timestamp outside the 5-minute tolerance"
        return None

    def verify(self, body: bytes, headers: Mapping[str, str]) -> bool:
        wanted = {
            name: headers.get(name, "")
            for name in ("webhook-id", "webhook-timestamp", "webhook-signature")
        }
        for webhook in self._webhooks:
            try:
                webhook.verify(body, wanted, json_parse=False)
            except Exception:
                continue
            return True
        return False

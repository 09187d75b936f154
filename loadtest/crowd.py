"""The crowd: closed-loop agents asking the tools, and paced webhook writers with lag probes."""

from __future__ import annotations

import asyncio
import functools
import random
import time
import urllib.parse
from typing import Any, Final

import msgspec

from loadtest import kbgen
from loadtest.httpload import HTTPLoadError, Pool, Response
from loadtest.model import Counts, Model
from loadtest.recorder import Recorder
from loadtest.service import KB, NARROW_COLLECTIONS, NARROW_TYPES, Credentials

WRITE_ATTEMPTS: Final = 6
REQUEST_TIMEOUT: Final = 20.0
MAX_IN_FLIGHT: Final = 8  # deliveries per writer awaiting their 200 (never two per concept)
_encode = msgspec.json.Encoder().encode


AGENT_MIX: Final = (
    ("graph_context_query", 30),
    ("graph_context_ids", 20),
    ("graph_context_query_ids", 8),
    ("link_suggest", 15),
    ("graph_path", 12),
    ("search", 15),
)


class AgentPlan:
    """Random agent requests (tool, token) over the loaded KB's ids and queries."""

    def __init__(self, concepts: list[dict[str, Any]], creds: Credentials, seed: int) -> None:
        self.ids = [c["id"] for c in concepts]
        self.narrow_ids = [
            c["id"]
            for c in concepts
            if c["id"].split("/", 1)[0] in NARROW_COLLECTIONS or c.get("type") in NARROW_TYPES
        ] or self.ids
        self.queries = kbgen.queries(400, seed)
        self.creds = creds
        names, weights = zip(*AGENT_MIX, strict=True)
        self.names: tuple[str, ...] = names
        self.weights: tuple[int, ...] = weights

    def make(self, rng: random.Random, pool: Pool, narrowed: bool) -> tuple[str, bytes]:
        tool = rng.choices(self.names, self.weights)[0]
        ids = self.narrow_ids if narrowed else self.ids
        token = self.creds.agent if narrowed else self.creds.admin
        headers = {"authorization": f"Bearer {token}"}
        if tool == "search":
            q = urllib.parse.quote(rng.choice(self.queries), safe="")
            return tool, pool.build("GET", f"/v1/kbs/{KB}/search?q={q}&limit=10", headers)
        body: dict[str, Any]
        if tool == "graph_context_query":
            body = {"query": rng.choice(self.queries), "limit": rng.choice((0, 5, 10, 20))}
        elif tool == "graph_context_ids":
            body = {"ids": rng.sample(ids, rng.randint(1, 3))}
        elif tool == "graph_context_query_ids":
            body = {"query": rng.choice(self.queries), "ids": [rng.choice(ids)]}
        elif tool == "link_suggest":
            body = {"id": rng.choice(ids), "limit": rng.choice((0, 5, 10))}
        else:
            body = {"source": rng.choice(ids), "target": rng.choice(ids)}
            if rng.random() < 0.3:
                body["direction"] = "out"
            if rng.random() < 0.3:
                body["max_hops"] = 4
        name = "graph_context" if tool.startswith("graph_context") else tool
        headers["content-type"] = "application/json"
        return tool, pool.build("POST", f"/v1/kbs/{KB}/tools/{name}", headers, _encode(body))


async def agent(
    index: int, plan: AgentPlan, pool: Pool, rec: Recorder, stop_at: float, seed: int
) -> None:
    rng = random.Random(seed * 7717 + index)
    narrowed = index % 2 == 1  # half the agents use the narrowed token
    token_kind = "narrowed" if narrowed else "admin"
    for _ in range(100_000_000):
        if time.perf_counter() >= stop_at:
            return
        tool, raw = plan.make(rng, pool, narrowed)
        started = time.perf_counter()
        try:
            response = await pool.send(raw, retry=True, timeout=REQUEST_TIMEOUT)
        except (HTTPLoadError, TimeoutError) as exc:
            rec.failures.append(f"agent {tool}: {exc!r}")
            await asyncio.sleep(0.05)
            continue
        end = time.perf_counter()
        rec.agent.append((tool, token_kind, end - rec.t0, end - started, response.status))
        rec.status(tool, response.status)


async def post_delivery(
    pool: Pool, signer: kbgen.Signer, delivery: kbgen.Delivery
) -> tuple[Response, float]:
    """One attempt: (answer, seconds until it came)."""
    raw = pool.build("POST", f"/v1/kbs/{KB}/events", signer.headers(delivery), delivery.body)
    started = time.perf_counter()
    response = await pool.send(raw, timeout=REQUEST_TIMEOUT)
    return response, time.perf_counter() - started


async def deliver(
    pool: Pool,
    signer: kbgen.Signer,
    delivery: kbgen.Delivery,
    model: Model,
    rec: Recorder,
    what: str,
) -> tuple[int, float] | None:
    """Send until acknowledged (bounded); apply it to the model; (seq, ack seconds) or None.

    A connection error, timeout or 5xx leaves the outcome unknown: the same delivery (same
    event ids) is sent again, so whether or not it was stored the end state is the same; the
    per-delivery counts are then not compared. A 4xx is a refusal that changed nothing.
    """
    uncertain = False
    for attempt in range(WRITE_ATTEMPTS):
        try:
            response, seconds = await post_delivery(pool, signer, delivery)
        except (HTTPLoadError, TimeoutError) as exc:
            rec.failures.append(f"{what} {delivery.msg_id}: {exc!r}")
            uncertain = True
            await asyncio.sleep(0.2 * (attempt + 1))
            continue
        rec.status(what, response.status)
        if response.status == 200:
            result = msgspec.json.decode(response.body)
            counts = model.apply(delivery.events)
            got = Counts(
                result["accepted"],
                result["applied"],
                result["duplicates"],
                result["stale"],
                result["ignored"],
            )
            if not uncertain and got != counts and len(rec.ack_mismatches) < 50:
                rec.ack_mismatches.append(
                    f"{delivery.msg_id} ({delivery.kind}): service {msgspec.to_builtins(got)} "
                    f"model {msgspec.to_builtins(counts)}"
                )
            seq = int(result["seq"])
            rec.max_seq = max(rec.max_seq, seq)
            rec.acknowledged += 1
            rec.deliveries[delivery.kind] = rec.deliveries.get(delivery.kind, 0) + 1
            return seq, seconds
        if response.status < 500:
            rec.failures.append(
                f"{what} {delivery.msg_id} refused {response.status}: {response.body[:200]!r}"
            )
            return None
        uncertain = True
        await asyncio.sleep(0.2 * (attempt + 1))
    rec.unresolved.append(delivery.msg_id)
    return None


async def lag_probe(pool: Pool, raw: bytes, seq: int, acked_at: float, rec: Recorder) -> None:
    """Time from the 200 (carrying ``seq``) to an agent answer reflecting at least ``seq``."""
    for _ in range(10):
        try:
            response = await pool.send(raw, retry=True, timeout=REQUEST_TIMEOUT)
        except (HTTPLoadError, TimeoutError) as exc:
            rec.failures.append(f"lag probe: {exc!r}")
            return
        rec.status("lag_probe", response.status)
        if response.status == 200:
            answered = int(response.headers.get("x-kb-seq", "-1"))
            if answered < seq:
                rec.min_seq_violations.append(f"X-Min-Seq {seq} answered X-KB-Seq {answered}")
                return
            rec.lags.append(time.perf_counter() - acked_at)
            return
        if response.status != 503:
            return
        await asyncio.sleep(0.05)


async def writer(
    stream: kbgen.WriterStream,
    pool: Pool,
    probes: Pool,
    signer: kbgen.Signer,
    model: Model,
    rec: Recorder,
    rate: float,
    stop_at: float,
    probe_tasks: set[asyncio.Task[None]],
    probe_query: str,
    creds: Credentials,
    max_in_flight: int = MAX_IN_FLIGHT,
) -> None:
    """Paced deliveries (``rate`` per second) until ``stop_at``, several in flight at once.

    Deliveries in flight at the same time never share a subject: one that touches a concept
    of an unanswered delivery waits for it. So per concept the service sees the writer's own
    order, every delivery's outcome depends only on deliveries already answered, and the
    model can apply each at its 200 (deliveries over disjoint subjects commute).
    """
    started = time.perf_counter()
    interval = 1.0 / rate if rate > 0 else 1.0
    q = urllib.parse.quote(probe_query, safe="")
    busy: dict[str, asyncio.Task[None]] = {}
    in_flight: set[asyncio.Task[None]] = set()

    async def send(delivery: kbgen.Delivery) -> None:
        outcome = await deliver(pool, signer, delivery, model, rec, "webhook")
        if outcome is None:
            return
        stream.acknowledged(delivery)
        seq, seconds = outcome
        acked_at = time.perf_counter()
        rec.acks.append((acked_at - rec.t0, seconds))
        if probes.idle() == 0:
            rec.probes_skipped += 1
            return
        headers = {"authorization": f"Bearer {creds.agent}", "x-min-seq": str(seq)}
        raw = probes.build("GET", f"/v1/kbs/{KB}/search?q={q}&limit=3", headers)
        task = asyncio.ensure_future(lag_probe(probes, raw, seq, acked_at, rec))
        probe_tasks.add(task)
        task.add_done_callback(probe_tasks.discard)

    def release(task: asyncio.Task[None], subjects: set[str]) -> None:
        in_flight.discard(task)
        for subject in subjects:
            if busy.get(subject) is task:
                del busy[subject]

    try:
        for k in range(10_000_000):
            due = started + k * interval
            now = time.perf_counter()
            if due >= stop_at or now >= stop_at:
                break
            if due > now:
                await asyncio.sleep(due - now)
            delivery = stream.next()
            subjects = {event["subject"] for event in delivery.events}
            conflicts = {busy[s] for s in subjects if s in busy}
            if conflicts:
                await asyncio.wait(conflicts)
            while len(in_flight) >= max_in_flight:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            task = asyncio.ensure_future(send(delivery))
            in_flight.add(task)
            for subject in subjects:
                busy[subject] = task
            task.add_done_callback(functools.partial(release, subjects=subjects))
    finally:
        if in_flight:
            await asyncio.wait(set(in_flight), timeout=REQUEST_TIMEOUT * WRITE_ATTEMPTS)

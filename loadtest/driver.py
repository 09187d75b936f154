"""Load-test driver: a real ``kbgraph serve``, agents and webhook writers, then a zero-loss check.

Phases:

1. Start the service (``python -m kbgraph serve``, uvicorn, loopback, ``--workers N``) in a
   temp dir with a generated config: a webhook secret, an admin token and a narrowed agent
   token (collections infra/network/ops, and type Runbook); wait for ``/readyz``.
2. Load the generated KB (``kbgen.make_kb``) as signed batches of upserts.
3. For ``seconds``: ``agents`` closed-loop agent clients (graph_context with query and/or ids,
   link_suggest, graph_path, search; admin and narrowed tokens) and ``writers`` webhook
   writers (``write_rate`` deliveries/s in total, paced) sending ``kbgen.WriterStream``
   deliveries. After each applied delivery a probe asks with ``X-Min-Seq: <seq of the 200>``
   and times 200 -> visible (lag).
4. Check: the driver's ``Model`` applied every acknowledged delivery by the contract's rules
   (highest version wins, duplicates and stale are no-ops, link events for missing concepts
   are ignored); as admin, every concept the model knows must read back exactly (or 404),
   the status counts and the KB's log length (``X-KB-Seq`` = applied events) must match, and
   no request may have had a 5xx.

``run(Options(...))`` returns the report dict (the test suite calls it); ``main(argv)`` is
the command line (``python -m loadtest --help``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import msgspec

from loadtest import kbgen, report
from loadtest.httpload import HTTPLoadError, Pool, Response

KB: Final = "loadtest"
HOST: Final = "127.0.0.1"
ROOT: Final = Path(__file__).resolve().parent.parent
NARROW_COLLECTIONS: Final = ("infra", "network", "ops")
NARROW_TYPES: Final = ("Runbook",)
WRITE_ATTEMPTS: Final = 6
REQUEST_TIMEOUT: Final = 20.0
MAX_IN_FLIGHT: Final = 8  # deliveries per writer awaiting their 200 (never two per concept)
_encode = msgspec.json.Encoder().encode


# --- options ---------------------------------------------------------------------------------


@dataclass
class Options:
    seconds: float = 30.0
    agents: int = 8
    writers: int = 2
    write_rate: float = 100.0
    workers: int = 1
    kind: str = "seed"
    n: int = 1000
    seed: int = 42
    out: str | None = str(ROOT / "loadtest" / "out")
    short: bool = False
    progress: bool = True
    chart: bool = True
    load_batch: int = 100
    keep: bool = False  # keep the temp dir (config, store, server log)

    def resolved(self) -> Options:
        """Short mode: a few seconds, a small crowd (values above the short ones are capped)."""
        if not self.short:
            return self
        return replace(
            self,
            seconds=min(self.seconds, 3.0),
            agents=min(self.agents, 4),
            writers=min(self.writers, 2),
            write_rate=min(self.write_rate, 40.0),
        )


# --- the service process ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


@dataclass
class Credentials:
    secret: str = field(default_factory=new_secret)
    admin: str = field(default_factory=lambda: "adm-" + secrets.token_urlsafe(18))
    agent: str = field(default_factory=lambda: "agt-" + secrets.token_urlsafe(18))


def write_config(folder: Path, creds: Credentials, kb: str = KB) -> Path:
    """The service config: a secret, an admin token and a narrowed agent token."""
    collections = ", ".join(f'"{c}"' for c in NARROW_COLLECTIONS)
    types = ", ".join(f'"{t}"' for t in NARROW_TYPES)
    path = folder / "kbgraph.toml"
    path.write_text(
        f"""[store]
path = "kbgraph.db"

[webhooks]
secrets = ["{creds.secret}"]

[[tokens]]
name = "admin"
token = "{creds.admin}"
admin = true

[[tokens]]
name = "agent"
token = "{creds.agent}"
rules = [{{ kb = "{kb}", collections = [{collections}] }}, {{ kb = "{kb}", types = [{types}] }}]
"""
    )
    return path


class ServiceProcess:
    """``python -m kbgraph serve`` in its own process group, logging to a file."""

    ready_path = "/readyz"

    def __init__(self, config: Path, workers: int = 1, port: int | None = None) -> None:
        self.config = config
        self.workers = workers
        self.port = port or free_port()
        self.log_path = config.parent / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "kbgraph", "serve", "--config", str(self.config),
            "--host", HOST, "--port", str(self.port), "--workers", str(self.workers),
            "--log-level", "warning",
        ]  # fmt: skip

    def start(self) -> None:
        command = self.command()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                start_new_session=True,
            )  # fmt: skip

    async def wait_ready(self, timeout: float = 90.0) -> None:
        """Poll ``ready_path`` (fresh connections, so every worker gets asked) until ready."""
        deadline = time.monotonic() + timeout
        streak = 0
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            pool = Pool(HOST, self.port, 1, timeout=5.0)
            try:
                response = await pool.request("GET", self.ready_path)
                streak = streak + 1 if response.status == 200 else 0
            except (HTTPLoadError, OSError, TimeoutError):
                streak = 0
            finally:
                await pool.close()
            if streak >= 3 * self.workers:
                return
            await asyncio.sleep(0.05 if streak else 0.2)
        raise RuntimeError(f"server not ready after {timeout:.0f} s:\n{self.tail()}")

    def stop(self, timeout: float = 15.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # the group this object started
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        return proc.returncode

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# --- the model: what every acknowledged delivery must have done ------------------------------


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
    """The contract's rules (SPEC section 2), applied to acknowledged deliveries in order."""

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


# --- recording -------------------------------------------------------------------------------


@dataclass
class Recorder:
    """Every request's outcome; times are seconds since the start of the timed phase."""

    t0: float = 0.0
    agent: list[tuple[str, str, float, float, int]] = field(default_factory=list)
    acks: list[tuple[float, float]] = field(default_factory=list)  # (t_end, latency)
    lags: list[float] = field(default_factory=list)
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    five_xx: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # connection errors, timeouts
    deliveries: dict[str, int] = field(default_factory=dict)  # by kind, acknowledged
    ack_mismatches: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    min_seq_violations: list[str] = field(default_factory=list)
    probes_skipped: int = 0
    acknowledged: int = 0
    max_seq: int = 0

    def status(self, what: str, status: int) -> None:
        by = self.statuses.setdefault(what, {})
        by[str(status)] = by.get(str(status), 0) + 1
        if status >= 500 and len(self.five_xx) < 1000:
            self.five_xx.append(f"{what}: {status}")

    def now(self) -> float:
        return time.perf_counter() - self.t0


# --- agents ----------------------------------------------------------------------------------

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


# --- writers ---------------------------------------------------------------------------------


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
            task.add_done_callback(lambda t, subjects=subjects: release(t, subjects))
    finally:
        if in_flight:
            await asyncio.wait(set(in_flight), timeout=REQUEST_TIMEOUT * WRITE_ATTEMPTS)


# --- the check -------------------------------------------------------------------------------


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


# --- the run ---------------------------------------------------------------------------------


async def run_async(opts: Options, tmp: Path) -> dict[str, Any]:
    creds = Credentials()
    config = write_config(tmp, creds)
    service = ServiceProcess(config, opts.workers)
    rec = Recorder()
    model = Model()
    signer = kbgen.Signer(creds.secret)
    concepts = kbgen.make_kb(opts.kind, opts.n, opts.seed)
    service.start()
    pools: list[Pool] = []
    try:
        await service.wait_ready()
        port = service.port
        write_pool = Pool(HOST, port, max(1, opts.writers) * MAX_IN_FLIGHT)
        load_pool = Pool(HOST, port, 2)
        agent_pool = Pool(HOST, port, max(1, opts.agents))
        probe_pool = Pool(HOST, port, 8)
        verify_pool = Pool(HOST, port, 8)
        pools = [write_pool, load_pool, agent_pool, probe_pool, verify_pool]

        # load
        load_started = time.perf_counter()
        load_acks: list[float] = []
        for delivery in kbgen.initial_load(concepts, batch=opts.load_batch):
            outcome = await deliver(load_pool, signer, delivery, model, rec, "load")
            if outcome is not None:
                load_acks.append(outcome[1])
        load_seconds = time.perf_counter() - load_started

        # timed phase
        plan = AgentPlan(concepts, creds, opts.seed)
        streams = [
            kbgen.WriterStream(i, opts.writers, concepts, opts.seed) for i in range(opts.writers)
        ]
        probe_query = kbgen.queries(1, opts.seed + 1)[0]
        rec.t0 = time.perf_counter()
        stop_at = rec.t0 + opts.seconds
        probe_tasks: set[asyncio.Task[None]] = set()
        rate = opts.write_rate / max(1, opts.writers)
        tasks = [
            asyncio.ensure_future(agent(i, plan, agent_pool, rec, stop_at, opts.seed))
            for i in range(opts.agents)
        ]
        tasks += [
            asyncio.ensure_future(
                writer(
                    stream,
                    write_pool,
                    probe_pool,
                    signer,
                    model,
                    rec,
                    rate,
                    stop_at,
                    probe_tasks,
                    probe_query,
                    creds,
                )
            )
            for stream in streams
        ]
        ticker = asyncio.ensure_future(progress(opts, rec, stop_at))
        done, pending = await asyncio.wait(tasks, timeout=opts.seconds + 60)
        for task in pending:
            task.cancel()
            rec.failures.append("a client task did not finish in time")
        for task in done:
            if task.exception() is not None:
                rec.failures.append(f"client task crashed: {task.exception()!r}")
        if probe_tasks:
            await asyncio.wait(list(probe_tasks), timeout=30)
        await ticker
        elapsed = max(time.perf_counter() - rec.t0, 1e-9)
        timed = min(elapsed, opts.seconds) if opts.seconds > 0 else elapsed

        verification = await verify(verify_pool, model, creds, rec)
    finally:
        for pool in pools:
            await pool.close()
        code = service.stop()
    return build_report(opts, rec, verification, load_acks, load_seconds, timed, code, service)


async def progress(opts: Options, rec: Recorder, stop_at: float) -> None:
    """A tqdm bar on stderr, one tick per second of the timed phase."""
    from tqdm import tqdm

    total = max(1, round(opts.seconds))
    with tqdm(
        total=total, file=sys.stderr, unit="s", disable=not opts.progress, leave=False,
        desc=f"load w={opts.workers}",
    ) as bar:  # fmt: skip
        shown = 0
        for _ in range(total + 5):
            left = stop_at - time.perf_counter()
            if left <= 0:
                break
            await asyncio.sleep(min(1.0, left))
            tick = min(total, round(rec.now()))
            bar.update(tick - shown)
            shown = tick
            bar.set_postfix(
                req=len(rec.agent), dlv=rec.acknowledged, err=len(rec.failures),
                x5=len(rec.five_xx), refresh=False,
            )  # fmt: skip
        bar.update(total - shown)


def build_report(
    opts: Options,
    rec: Recorder,
    verification: dict[str, Any],
    load_acks: list[float],
    load_seconds: float,
    seconds: float,
    exit_code: int | None,
    service: ServiceProcess,
) -> dict[str, Any]:
    tools: dict[str, Any] = {}
    by_tool: dict[str, list[float]] = {}
    ok_by_tool: dict[str, list[float]] = {}
    for tool, _, _, latency, status in rec.agent:
        by_tool.setdefault(tool, []).append(latency)
        if status == 200:
            ok_by_tool.setdefault(tool, []).append(latency)
    for tool, _ in AGENT_MIX:
        tools[tool] = report.summary(by_tool.get(tool, []), seconds)
        tools[tool]["ok"] = len(ok_by_tool.get(tool, []))
        tools[tool]["statuses"] = rec.statuses.get(tool, {})
    all_agent = [latency for _, _, _, latency, _ in rec.agent]
    by_token: dict[str, Any] = {}
    for kind in ("admin", "narrowed"):
        values = [lat for _, tk, _, lat, _ in rec.agent if tk == kind]
        by_token[kind] = report.summary(values, seconds)
    acks = [latency for _, latency in rec.acks]
    unexpected = {
        what: {s: n for s, n in statuses.items() if s not in ("200", "404")}
        for what, statuses in rec.statuses.items()
    }
    unexpected = {what: s for what, s in unexpected.items() if s}
    v = verification
    zero_loss = (
        v["concept_mismatches"] == 0
        and v["status_concepts"]["expected"] == v["status_concepts"]["found"]
        and v["status_links"]["expected"] == v["status_links"]["found"]
        and v["applied_expected"] == v["applied_found"]
        and not rec.ack_mismatches
        and not rec.unresolved
    )
    no_5xx = not rec.five_xx
    checks = {
        "zero_loss": zero_loss,
        "no_5xx": no_5xx,
        "min_seq_honoured": not rec.min_seq_violations,
        "acknowledged_deliveries": rec.acknowledged,
        **v,
        "ack_count_mismatches": rec.ack_mismatches[:20],
        "unresolved_deliveries": rec.unresolved[:20],
        "five_xx": len(rec.five_xx),
        "five_xx_samples": rec.five_xx[:20],
        "min_seq_violations": rec.min_seq_violations[:20],
    }
    write_rate = round(len(rec.acks) / seconds, 1) if seconds > 0 else 0.0
    full = {
        "options": asdict(opts),
        "seconds": round(seconds, 3),
        "agents": {
            "rps": round(len(all_agent) / seconds, 1) if seconds > 0 else 0.0,
            "all": report.summary(all_agent, seconds),
            "by_token": by_token,
            "tools": tools,
        },
        "webhooks": {
            "load": {
                "deliveries": len(load_acks),
                "seconds": round(load_seconds, 3),
                **report.percentiles(load_acks),
            },
            "ack": report.summary(acks, seconds),
            "write_rate_target": opts.write_rate,
            "write_rate": write_rate,
            "deliveries_by_kind": rec.deliveries,
            "lag": {
                "count": len(rec.lags),
                "probes_skipped": rec.probes_skipped,
                **report.percentiles(rec.lags),
            },
        },
        "statuses": rec.statuses,
        "unexpected_statuses": unexpected,
        "failures": {"count": len(rec.failures), "samples": rec.failures[:20]},
        "checks": checks,
        "timeline": {
            "agents": report.timeline(((t, lat) for _, _, t, lat, _ in rec.agent), seconds),
            "deliveries": report.timeline(rec.acks, seconds),
        },
        "server_exit_code": exit_code,
    }
    if not (zero_loss and no_5xx):
        full["server_log_tail"] = service.tail()
    full["headline"] = headline(opts, full)
    return full


def headline(opts: Options, full: dict[str, Any]) -> dict[str, Any]:
    """The figures for the README: one flat-ish JSON object."""
    checks = full["checks"]
    hooks = full["webhooks"]
    return {
        "kind": "loadtest",
        "workers": opts.workers,
        "kb": f"{opts.kind}-{opts.n}",
        "seconds": full["seconds"],
        "agents": opts.agents,
        "writers": opts.writers,
        "write_rate_target": opts.write_rate,
        "write_rate": hooks["write_rate"],
        "agents_rps": full["agents"]["rps"],
        "tools": {
            tool: {"rps": row["rps"], "p50_ms": row["p50"], "p99_ms": row["p99"]}
            for tool, row in full["agents"]["tools"].items()
        },
        "ack_ms": {"p50": hooks["ack"]["p50"], "p99": hooks["ack"]["p99"]},
        "lag_ms": {"p50": hooks["lag"]["p50"], "p99": hooks["lag"]["p99"]},
        "zero_loss": checks["zero_loss"],
        "acknowledged_deliveries": checks["acknowledged_deliveries"],
        "applied_expected": checks["applied_expected"],
        "applied_found": checks["applied_found"],
        "concepts_checked": checks["concepts_checked"],
        "no_5xx": checks["no_5xx"],
    }


def summary_table(full: dict[str, Any]) -> str:
    rows = []
    for tool, row in full["agents"]["tools"].items():
        rows.append([tool, row["count"], row["rps"], row["p50"], row["p95"], row["p99"]])
    hooks = full["webhooks"]
    ack = hooks["ack"]
    rows.append(["webhook ack", ack["count"], ack["rps"], ack["p50"], ack["p95"], ack["p99"]])
    lag = hooks["lag"]
    rows.append(["lag 200->visible", lag["count"], "", lag["p50"], lag["p95"], lag["p99"]])
    text = report.table(rows, ["what", "count", "per s", "p50 ms", "p95 ms", "p99 ms"])
    checks = full["checks"]
    lines = [
        text,
        f"agents: {full['agents']['rps']} req/s; writers: {hooks['write_rate']} deliveries/s "
        f"(target {hooks['write_rate_target']}); deliveries by kind: "
        f"{hooks['deliveries_by_kind']}",
        f"unexpected statuses: {full['unexpected_statuses'] or 'none'}; "
        f"client failures: {full['failures']['count']}",
        f"zero loss: {checks['zero_loss']} ({checks['acknowledged_deliveries']} acknowledged, "
        f"applied expected {checks['applied_expected']} found {checks['applied_found']}, "
        f"{checks['concepts_checked']} concepts checked, "
        f"{checks['concept_mismatches']} mismatches); no 5xx: {checks['no_5xx']}; "
        f"X-Min-Seq honoured: {checks['min_seq_honoured']}",
    ]
    return "\n".join(lines)


def run(opts: Options) -> dict[str, Any]:
    """Run the whole load test; write the JSON report and chart under ``opts.out``."""
    opts = opts.resolved()
    tmp = Path(tempfile.mkdtemp(prefix="kbgraph-loadtest-"))
    try:
        full = _run_loop(run_async(opts, tmp))
    finally:
        if opts.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if opts.out:
        out = Path(opts.out)
        name = f"loadtest-w{opts.workers}"
        report.write_json(out / f"{name}.json", full)
        full["report_path"] = str(out / f"{name}.json")
        if opts.chart:
            png = out / f"{name}.png"
            report.chart(
                png,
                full["timeline"]["agents"],
                full["timeline"]["deliveries"],
                f"kbgraph load test: {opts.agents} agents, {opts.writers} writers at "
                f"{opts.write_rate:g}/s, {opts.workers} worker(s), {opts.kind}-{opts.n}",
            )
            full["chart_path"] = str(png)
    return full


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest",
        description="Load-test a real kbgraph service: agents and signed webhook writers at "
        "once, then check that every acknowledged delivery was applied and nothing else.",
    )
    defaults = Options()
    parser.add_argument(
        "--seconds",
        type=float,
        default=defaults.seconds,
        help="length of the timed phase (default %(default)s)",
    )
    parser.add_argument(
        "--agents",
        type=int,
        default=defaults.agents,
        help="concurrent agent clients (default %(default)s)",
    )
    parser.add_argument(
        "--writers",
        type=int,
        default=defaults.writers,
        help="concurrent webhook writers (default %(default)s)",
    )
    parser.add_argument(
        "--write-rate",
        type=float,
        default=defaults.write_rate,
        help="target deliveries per second, all writers (default %(default)s)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=defaults.workers,
        help="uvicorn worker processes of the service (default %(default)s)",
    )
    parser.add_argument(
        "--kind",
        choices=("seed", "hub"),
        default=defaults.kind,
        help="KB shape: the seed's uniform links or hub-heavy",
    )
    parser.add_argument("--n", type=int, default=defaults.n, help="concepts (default 1000)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="RNG seed")
    parser.add_argument(
        "--out",
        default=defaults.out,
        help="folder for the JSON report and PNG chart (default loadtest/out)",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="a few seconds with a small crowd (what the test suite runs)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-chart", action="store_true", help="no PNG chart")
    parser.add_argument(
        "--keep", action="store_true", help="keep the temp dir (config, store, server log)"
    )
    return parser  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.agents < 0 or args.writers < 0 or args.workers < 1 or args.seconds <= 0:
        print("loadtest: --agents/--writers >= 0, --workers >= 1, --seconds > 0", file=sys.stderr)
        return 2
    opts = Options(
        seconds=args.seconds, agents=args.agents, writers=args.writers,
        write_rate=args.write_rate, workers=args.workers, kind=args.kind, n=args.n,
        seed=args.seed, out=args.out, short=args.short, progress=not args.no_progress,
        chart=not args.no_chart, keep=args.keep,
    )  # fmt: skip
    try:
        full = run(opts)
    except RuntimeError as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 3
    print(summary_table(full))
    if "report_path" in full:
        print(f"report: {full['report_path']}" + (
            f"  chart: {full['chart_path']}" if "chart_path" in full else ""))  # fmt: skip
    print(json.dumps(full["headline"], separators=(",", ":")))
    checks = full["checks"]
    return 0 if checks["zero_loss"] and checks["no_5xx"] else 1

"""Faults under load (``python -m loadtest --nodes 3 --faults``; issue 25; docs/faults.md).

Three kbgraph nodes over a real 3-server NATS JetStream cluster (TLS, accounts:
``tests.nats_cluster``), snapshots every ``SNAPSHOT_SECONDS``, a steady load of webhook
writers and agent readers (``Load``), and four faults in turn:

a. the NATS server leading the stream paused (SIGSTOP) for ``--fault-seconds``, then resumed;
b. a kbgraph node paused as long, then resumed;
c. a node killed (SIGKILL) while it applies the load, then started again on its store;
d. a node killed, its store and checkpoints deleted, and started again while writes go on:
   it restores the newest snapshot from the Object Store and follows the stream from there.

The writers act as a webhook sender does: a delivery that times out or gets a 503 is sent
again, the same webhook-id and body, to the next node, until a node answers 200. Every
delivery carries new concepts (version 1), so the KB's ``seq`` counts each event once: a
retried delivery applied twice would show. After each fault, with the load stopped and every
node at the same ``X-KB-Seq``: ``lost`` (deliveries answered 200 missing on some node),
``divergent`` (nodes whose tool answers differ from node 0's, byte for byte), ``extra``
(``seq`` minus the events acknowledged: double-applied), the ``/readyz`` samples per node,
``ready_while_refusing_s`` (the longest time a node said ready while refusing every delivery
sent to it), and the seconds until writes are taken again after the fault ends.

``Load`` and ``compare`` also serve ``tests/test_jetstream_faults.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec

from tests import webhook_client as wc

Targets = Callable[[], list[tuple[int, str]]]  # the live nodes: (index, base URL)

WRITE_TIMEOUT = 3.0  # a writer gives up on an answer after this, and sends again
SETTLE_SECONDS = 120.0  # a delivery no node takes within this is reported, not retried on
SNAPSHOT_SECONDS = 2  # the nodes' [log.jetstream] snapshot_every_seconds in the load test
AIM_LEADER_TAKEN_AGAIN = 5.0  # writes taken again after a paused NATS leader resumes
AIM_READY_WHILE_REFUSING = 6.0  # kbgraph.log.jetstream.node.SILENT_SECONDS + a sample or two


@dataclass
class Load:
    """Webhook writers and agent readers against the live nodes, and a sampler of every
    node's ``/readyz``; every answer with its time (``time.monotonic``)."""

    targets: Targets
    secret: str
    auth: dict[str, str]  # an admin's Authorization header (reads, checks)
    kb: str
    tag: str
    acked: dict[str, list[dict[str, Any]]]  # webhook-id -> events, shared across loads
    writers: int = 2
    readers: int = 1
    pause: float = 0.01  # between a writer's deliveries
    # (answered, node, code, sent): code 0 is no answer within WRITE_TIMEOUT
    writes: list[tuple[float, int, int, float]] = field(default_factory=list)
    readyz: list[tuple[float, int, int]] = field(default_factory=list)  # (asked, node, code)
    reads: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    max_seq: int = 0  # the highest seq an acknowledgement named
    mine: list[str] = field(default_factory=list)  # webhook-ids this load got acknowledged
    stopping: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        jobs: list[tuple[Callable[..., None], tuple[int, ...]]] = [
            (self._writer, (k,)) for k in range(self.writers)
        ]
        jobs += [(self._reader, (k,)) for k in range(self.readers)]
        jobs.append((self._sampler, ()))
        self.threads = [threading.Thread(target=job, args=a, daemon=True) for job, a in jobs]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()  # each writer still finishes (retries) the delivery it holds
        for thread in self.threads:
            thread.join(SETTLE_SECONDS + 30)
        if any(thread.is_alive() for thread in self.threads):
            self.errors.append("a load thread did not finish")

    def wait_acked(self, more: int, timeout: float = SETTLE_SECONDS) -> None:
        """Until ``more`` deliveries more than now are taken (AssertionError after
        ``timeout``)."""
        count = len(self.mine) + more
        deadline = time.monotonic() + timeout
        while len(self.mine) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        if len(self.mine) < count:
            raise AssertionError(f"{len(self.mine)} of {count} taken: {self.writes[-5:]}")

    def taken_again(self, since: float, node: int | None = None, timeout: float = 120.0) -> float:
        """Seconds from ``since`` to the first delivery taken (by ``node``, or any) after it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            after = [
                at
                for at, index, code, _ in list(self.writes)
                if code == 200 and at >= since and node in (None, index)
            ]
            if after:
                return min(after) - since
            time.sleep(0.02)
        raise AssertionError(f"no delivery taken {timeout:.0f} s after the fault ended")

    def readyz_counts(self, since: float, until: float) -> dict[str, dict[str, int]]:
        """Per node, the ``/readyz`` answers sampled in [since, until]: 200, 503, none."""
        out: dict[str, dict[str, int]] = {}
        for at, node, code in list(self.readyz):
            if since <= at <= until:
                counts = out.setdefault(str(node), {"200": 0, "503": 0, "none": 0})
                key = str(code) if code else "none"
                counts[key] = counts.get(key, 0) + 1
        return dict(sorted(out.items()))

    def ready_while_refusing(self, since: float) -> float:
        """The longest time, from ``since`` (a fault's start) on, that a node said ready
        (``/readyz`` 200) while refusing: from the sending of a delivery it did not take (503
        or no answer in time) with none taken since, to the next it took, after its last
        ``/readyz`` that was not 200."""
        longest = 0.0
        for node in {n for _, n, _ in self.readyz}:
            spans: list[tuple[float, float]] = []
            opened: float | None = None
            last_ok = since
            for answered, n, code, sent in sorted(self.writes):
                if n != node:
                    continue
                if code == 200:
                    if opened is not None:
                        spans.append((opened, answered))
                    opened, last_ok = None, max(last_ok, answered)
                elif opened is None:
                    opened = max(sent, last_ok)
            if opened is not None:
                spans.append((opened, float("inf")))
            samples = sorted((at, code) for at, n, code in self.readyz if n == node)
            for start, end in spans:
                honest = start
                for at, code in samples:
                    if start <= at <= end:
                        if code != 200:
                            honest = at
                        else:
                            longest = max(longest, at - honest)
        return round(longest, 2)

    def _writer(self, k: int) -> None:
        turn = itertools.count(k)
        with httpx.Client(timeout=WRITE_TIMEOUT) as client:
            for i in itertools.count():
                if self.stopping.is_set():
                    return
                events = [
                    wc.upsert(
                        f"{self.tag}/w{k}/{i}/{j}",
                        1,
                        title=f"{self.tag} writer {k} delivery {i}",
                        text="alpha concept text",
                        links=[f"{self.tag}/w{k}/{max(0, i - 1)}/0"],
                    )
                    for j in range(1 + i % 2)
                ]
                body, headers = wc.delivery(self.secret, events)
                if not self._send(client, turn, body, headers, events):
                    return
                time.sleep(self.pause)

    def _send(
        self,
        client: httpx.Client,
        turn: Iterator[int],
        body: bytes,
        headers: dict[str, str],
        events: list[dict[str, Any]],
    ) -> bool:
        """The same delivery, to the next live node each time, until one answers 200."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            live = self.targets()
            if not live:
                time.sleep(0.05)
                continue
            index, url = live[next(turn) % len(live)]
            text, sent = "", time.monotonic()
            try:
                answer = client.post(
                    f"{url}/v1/kbs/{self.kb}/events", content=body, headers=headers
                )
                code, text = answer.status_code, answer.text
            except httpx.HTTPError:
                code = 0  # no answer in time, or the node is gone
            self.writes.append((time.monotonic(), index, code, sent))
            if code == 200:
                self.acked[headers["webhook-id"]] = events
                self.mine.append(headers["webhook-id"])
                self.max_seq = max(self.max_seq, int(json.loads(text)["seq"]))
                return True
            if code != 503 and code != 0:
                self.errors.append(f"{code}: {text[:300]}")
            time.sleep(0.05)
        self.errors.append(f"delivery {headers['webhook-id']} taken by no node in time")
        return False

    def _reader(self, k: int) -> None:
        body = msgspec.json.encode({"query": "alpha concept text", "limit": 5})
        rng = random.Random(k)
        # acknowledged by one node, the KB's first delivery may not be applied yet by the node
        # read (a 404 for a KB it does not know yet): wait for it there, as an agent would
        headers = {**self.auth, "X-Min-Seq": "1"}
        with httpx.Client(timeout=WRITE_TIMEOUT) as client:
            while not self.stopping.is_set():
                live = self.targets()
                if live and self.acked:  # the KB exists
                    _, url = rng.choice(live)
                    with contextlib.suppress(httpx.HTTPError):
                        answer = client.post(
                            f"{url}/v1/kbs/{self.kb}/tools/graph_context",
                            content=body,
                            headers=headers,
                        )
                        self.reads.append(answer.status_code)
                time.sleep(0.02)

    def _sampler(self) -> None:
        with httpx.Client(timeout=1.0) as client:
            while not self.stopping.is_set():
                for index, url in self.targets():
                    asked = time.monotonic()
                    try:
                        code = client.get(f"{url}/readyz").status_code
                    except httpx.HTTPError:
                        code = 0  # a paused node does not answer
                    self.readyz.append((asked, index, code))
                time.sleep(0.2)


def tool_requests(ids: list[str]) -> list[tuple[str, bytes]]:
    """Tool requests over a few of ``ids`` (the bytes compared across nodes)."""
    enc = msgspec.json.encode
    rng = random.Random(7)
    chosen = rng.sample(sorted(ids), min(6, len(ids)))
    out = [("graph_context", enc({"query": "alpha concept text", "limit": 10}))]
    for cid in chosen:
        out.append(("graph_context", enc({"ids": [cid], "limit": 10})))
        out.append(("link_suggest", enc({"id": cid})))
        out.append(("graph_path", enc({"source": cid, "target": rng.choice(ids)})))
    return out


def compare(
    urls: list[str], kb: str, auth: dict[str, str], ids: list[str], timeout: float = 120.0
) -> dict[str, int]:
    """Once every node is at one ``X-KB-Seq`` (the load stopped): ``seq``, ``lost`` (of
    ``ids``, the concepts missing on some node), ``divergent`` (nodes whose tool answers
    differ from node 0's bytes)."""
    with httpx.Client(timeout=30) as client:

        def seqs() -> list[int]:
            return [
                int(client.get(f"{url}/v1/kbs/{kb}/status", headers=auth).headers["X-KB-Seq"])
                for url in urls
            ]

        deadline = time.monotonic() + timeout
        found = seqs()
        while len(set(found)) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
            found = seqs()
        if len(set(found)) > 1:
            raise AssertionError(f"the nodes did not reach one seq: {found}")
        seq = found[0]
        at = {**auth, "X-Min-Seq": str(seq)}
        lost = 0
        for cid in ids:
            for url in urls:
                if client.get(f"{url}/v1/kbs/{kb}/concepts/{cid}", headers=at).status_code != 200:
                    lost += 1
                    break
        answers = []
        for url in urls:
            mine = []
            for tool, body in tool_requests(ids):
                answer = client.post(f"{url}/v1/kbs/{kb}/tools/{tool}", content=body, headers=at)
                mine.append((answer.status_code, answer.headers.get("X-KB-Seq"), answer.content))
            answers.append(mine)
    divergent = sum(1 for mine in answers[1:] if mine != answers[0])
    return {"seq": seq, "lost": lost, "divergent": divergent}


# --- the load test's run ----------------------------------------------------------------------


@contextlib.contextmanager
def paused(pgid_or_pid: int, group: bool) -> Iterator[None]:
    kill = os.killpg if group else os.kill
    kill(pgid_or_pid, signal.SIGSTOP)
    try:
        yield
    finally:
        kill(pgid_or_pid, signal.SIGCONT)


def run(nodes: int, seconds: float, writers: int, quiet: bool = False) -> dict[str, Any]:
    """Every fault in turn, under load; a report per fault and the aims."""
    from loadtest.service import KB, Credentials, ServiceProcess, write_config
    from tests.nats_cluster import STREAM, NatsCluster

    tmp = Path(tempfile.mkdtemp(prefix="kbgraph-faults-"))
    creds = Credentials()
    auth = {"Authorization": f"Bearer {creds.admin}"}
    cluster = NatsCluster(tmp / "nats", 3)
    services: list[ServiceProcess] = []
    down: set[int] = set()
    acked: dict[str, list[dict[str, Any]]] = {}
    reports: list[dict[str, Any]] = []

    def say(text: str) -> None:
        if not quiet:
            print(text, flush=True)

    def targets() -> list[tuple[int, str]]:
        return [(i, f"http://127.0.0.1:{s.port}") for i, s in enumerate(services) if i not in down]

    def restart(index: int) -> float:
        started = time.monotonic()
        services[index].start()
        _run_async(services[index].wait_ready(300))
        down.discard(index)
        return time.monotonic() - started

    try:
        cluster.start()
        for index in range(nodes):
            folder = tmp / f"node{index}"
            folder.mkdir()
            extra = f"snapshot_every_seconds = {SNAPSHOT_SECONDS}\n"
            config = write_config(folder, creds, log_toml=cluster.log_toml() + extra)
            services.append(ServiceProcess(config, 1))
        for service in services:
            service.start()
        for service in services:
            _run_async(service.wait_ready(300))

        def fault(name: str, strike: Callable[[Load], dict[str, Any]]) -> None:
            say(f"fault {name} ...")
            with Load(targets, creds.secret, auth, KB, name, acked, writers=writers) as load:
                load.wait_acked(20)
                figures = strike(load)
                began, ended = figures.pop("began"), figures.pop("ended")
                figures["taken_again_s"] = round(load.taken_again(ended), 2)
                if "victim" in figures:
                    victim = figures.pop("victim")
                    figures["victim_taken_again_s"] = round(load.taken_again(ended, victim), 2)
                time.sleep(min(5.0, seconds))  # the load goes on after the fault
            ids = sorted({e["subject"] for wid in load.mine for e in acked[wid]})
            urls = [url for _, url in targets()]
            result = compare(urls, KB, auth, ids)
            events = sum(len(each) for each in acked.values())
            report = {
                "fault": name,
                "acknowledged": len(load.mine),
                "retries": sum(1 for _, _, code, _ in load.writes if code != 200),
                "lost": result["lost"],
                "divergent": result["divergent"],
                "extra_applied": result["seq"] - events,
                "seq": result["seq"],
                "readyz": load.readyz_counts(began, time.monotonic()),
                "ready_while_refusing_s": load.ready_while_refusing(began),
                "reads": len(load.reads),
                "reads_5xx_other_than_503": sum(1 for c in load.reads if c >= 500 and c != 503),
                "errors": load.errors[:3],
                **figures,
            }
            reports.append(report)
            say(json.dumps(report, separators=(",", ":")))

        def leader(load: Load) -> dict[str, Any]:
            time.sleep(min(3.0, seconds))
            index = cluster.leader(STREAM)
            proc = cluster.procs[index]
            assert proc is not None
            began = time.monotonic()
            with paused(proc.pid, group=False):
                time.sleep(seconds)
            return {"began": began, "ended": time.monotonic(), "paused_server": f"n{index}"}

        def node_pause(load: Load) -> dict[str, Any]:
            time.sleep(min(3.0, seconds))
            proc = services[1].proc
            assert proc is not None
            began = time.monotonic()
            with paused(proc.pid, group=True):
                time.sleep(seconds)
            return {"began": began, "ended": time.monotonic(), "victim": 1}

        def kill(wipe: bool) -> Callable[[Load], dict[str, Any]]:
            def strike(load: Load) -> dict[str, Any]:
                index = 2
                if wipe:  # a snapshot exists and the stream was trimmed below it
                    deadline = time.monotonic() + 120
                    while _first_seq(cluster, STREAM) <= 1 and time.monotonic() < deadline:
                        time.sleep(0.2)
                time.sleep(min(3.0, seconds))
                down.add(index)
                proc = services[index].proc
                assert proc is not None
                began = time.monotonic()
                os.killpg(proc.pid, signal.SIGKILL)  # mid-apply: the load streams in
                proc.wait(30)
                folder = services[index].config.parent
                if wipe:
                    for path in folder.iterdir():
                        if path.name not in ("kbgraph.toml", "server.log"):
                            shutil.rmtree(path) if path.is_dir() else path.unlink()
                time.sleep(min(3.0, seconds))  # writes go on to the others
                ended = time.monotonic()
                ready = restart(index)
                figures: dict[str, Any] = {"began": began, "ended": ended, "victim": index}
                figures["restart_ready_s"] = round(ready, 2)
                if wipe:
                    figures["restored_from_snapshot"] = "restored from snapshot" in (
                        services[index].log_path.read_text(errors="replace")
                    )
                return figures

            return strike

        fault("leader-paused", leader)
        fault("node-paused", node_pause)
        fault("node-killed", kill(wipe=False))
        fault("node-wiped", kill(wipe=True))
    finally:
        for service in services:
            service.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    leader_again = reports[0]["taken_again_s"]
    refusing = max(r["ready_while_refusing_s"] for r in reports)
    aims = {
        "lost": 0,
        "divergent": 0,
        "extra_applied": 0,
        "leader_taken_again_s": AIM_LEADER_TAKEN_AGAIN,
        "ready_while_refusing_s": AIM_READY_WHILE_REFUSING,
    }
    met = {
        "lost": all(r["lost"] == 0 for r in reports),
        "divergent": all(r["divergent"] == 0 for r in reports),
        "extra_applied": all(r["extra_applied"] == 0 for r in reports),
        "leader_taken_again_s": leader_again <= AIM_LEADER_TAKEN_AGAIN,
        "ready_while_refusing_s": refusing <= AIM_READY_WHILE_REFUSING,
        "restored_from_snapshot": bool(reports[3].get("restored_from_snapshot")),
        "no_errors": not any(r["errors"] or r["reads_5xx_other_than_503"] for r in reports),
    }
    return {
        "benchmark": "faults",
        "nodes": nodes,
        "fault_seconds": seconds,
        "faults": {
            r["fault"]: {k: r[k] for k in ("acknowledged", "lost", "divergent", "taken_again_s")}
            for r in reports
        },
        "leader_taken_again_s": leader_again,
        "ready_while_refusing_s": refusing,
        "aims": aims,
        "met": met,
        "reports": reports,
    }


def table(result: dict[str, Any]) -> str:
    """The per-fault figures as a text table (printed before the JSON line)."""
    rows = [
        "fault          acked  lost  diverg  extra  ready-while-refusing  taken again: any / "
        "victim   readyz per node (200/503/none)"
    ]
    for r in result["reports"]:
        victim = r.get("victim_taken_again_s")
        readyz = " ".join(
            f"{node}:{c['200']}/{c['503']}/{c['none']}" for node, c in r["readyz"].items()
        )
        rows.append(
            f"{r['fault']:<14} {r['acknowledged']:>5} {r['lost']:>5} {r['divergent']:>7}"
            f" {r['extra_applied']:>6} {r['ready_while_refusing_s']:>20.2f} s"
            f" {r['taken_again_s']:>8.2f} s / {'-' if victim is None else f'{victim:.2f} s':>8}"
            f"   {readyz}"
        )
    return "\n".join(rows)


def _first_seq(cluster: Any, stream: str) -> int:
    async def read() -> int:
        nc = await cluster.connect()
        try:
            return int((await nc.jetstream(timeout=5).stream_info(stream)).state.first_seq)
        finally:
            await nc.close()

    return int(_run_async(read()))


def _run_async(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)

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
the command line (``python -m loadtest --help``). The parts live beside it: ``service`` (the
process under test), ``options`` (what a run is asked), ``crowd`` (agents and writers),
``recorder``, ``model`` (the model and the check of phase 4) and ``summary`` (the report).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest import kbgen, report
from loadtest.crowd import MAX_IN_FLIGHT, AgentPlan, agent, deliver, writer
from loadtest.httpload import Pool
from loadtest.model import Model, verify
from loadtest.options import Options
from loadtest.recorder import Recorder
from loadtest.service import HOST, Credentials, ServiceProcess, write_config
from loadtest.summary import build_report, summary_table


async def run_async(opts: Options, tmp: Path) -> dict[str, Any]:
    creds = Credentials()
    cluster = None
    if opts.nodes > 1 or opts.jetstream:  # nodes, each a full replica, over a JetStream stream
        from tests.nats_cluster import NatsCluster

        cluster = NatsCluster(tmp / "nats", 3)
        await asyncio.to_thread(cluster.start)
        services = []
        for index in range(opts.nodes):
            folder = tmp / f"node{index}"
            folder.mkdir()
            config = write_config(folder, creds, log_toml=cluster.log_toml())
            services.append(ServiceProcess(config, opts.workers))
    else:
        config = write_config(tmp, creds)
        services = [ServiceProcess(config, opts.workers, port=opts.port)]
    service = services[0]
    rec = Recorder()
    model = Model()
    signer = kbgen.Signer(creds.secret)
    concepts = kbgen.make_kb(opts.kind, opts.n, opts.seed)
    for each in services:
        each.start()
    pools: list[Pool] = []
    try:
        for each in services:
            await each.wait_ready()
        ports = [each.port for each in services]
        nodes = len(ports)
        # writer i sends to node i and probes the next node's X-Min-Seq (the replica lag);
        # agent i asks node i (mod the number of nodes)
        write_pools = [Pool(HOST, p, max(1, opts.writers) * MAX_IN_FLIGHT) for p in ports]
        load_pool = Pool(HOST, ports[0], 2)
        agent_pools = [Pool(HOST, p, max(1, -(-opts.agents // nodes))) for p in ports]
        probe_pools = [Pool(HOST, p, 8) for p in ports]
        verify_pools = [Pool(HOST, p, 8) for p in ports]
        pools = [*write_pools, load_pool, *agent_pools, *probe_pools, *verify_pools]

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
        groups = {"nodes": [each.proc.pid for each in services if each.proc is not None]}
        if cluster is not None:
            groups["nats"] = [proc.pid for proc in cluster.procs if proc is not None]
        cpu_before = cpu_seconds(groups)
        rec.t0 = time.perf_counter()
        stop_at = rec.t0 + opts.seconds
        probe_tasks: set[asyncio.Task[None]] = set()
        rate = opts.write_rate / max(1, opts.writers)
        tasks = [
            asyncio.ensure_future(agent(i, plan, agent_pools[i % nodes], rec, stop_at, opts.seed))
            for i in range(opts.agents)
        ]
        tasks += [
            asyncio.ensure_future(
                writer(
                    stream,
                    write_pools[index % nodes],
                    probe_pools[(index + 1) % nodes],
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
            for index, stream in enumerate(streams)
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
        cpu_after = cpu_seconds(groups)
        cpu = {
            what: round((cpu_after[what] - cpu_before[what]) / elapsed, 2) for what in cpu_before
        }
        cpu["other"] = round(max(0.0, cpu["machine"] - sum(cpu[w] for w in (*groups, "client"))), 2)

        verification = await verify(verify_pools[0], model, creds, rec)
        for index, pool in enumerate(verify_pools[1:], 1):  # every node, the same answers
            other = await verify(pool, model, creds, rec)
            verification = merge_verifications(verification, other, index)
    finally:
        for pool in pools:
            await pool.close()
        codes = [each.stop() for each in services]
        code = next((c for c in codes if c), codes[0])
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
    full = build_report(opts, rec, verification, load_acks, load_seconds, timed, code, service)
    full["cpu_cores"] = full["headline"]["cpu_cores"] = cpu
    return full


def cpu_seconds(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far: each group's processes with their children, this client process,
    and the whole machine (busy, any process: other work on it shows as the rest)."""
    import psutil

    out: dict[str, float] = {}
    for what, pids in groups.items():
        total = 0.0
        for pid in pids:
            try:
                root = psutil.Process(pid)
                for proc in (root, *root.children(recursive=True)):
                    times = proc.cpu_times()
                    total += times.user + times.system
            except psutil.Error:
                continue
        out[what] = total
    out["client"] = time.process_time()
    machine = psutil.cpu_times()
    out["machine"] = sum(
        getattr(machine, name, 0.0) for name in ("user", "system", "nice", "irq", "softirq")
    )
    return out


def merge_verifications(first: dict[str, Any], other: dict[str, Any], node: int) -> dict[str, Any]:
    """One verification for several nodes: any node's mismatch is a mismatch."""
    merged = dict(first)
    merged["concepts_checked"] += other["concepts_checked"]
    merged["concept_mismatches"] += other["concept_mismatches"]
    merged["mismatch_samples"] = (
        first["mismatch_samples"] + [f"node {node}: {m}" for m in other["mismatch_samples"]]
    )[:20]
    for key in ("status_concepts", "status_links"):
        if other[key]["found"] != other[key]["expected"]:
            merged[key] = other[key]
    if other["applied_found"] != other["applied_expected"]:
        merged["applied_found"] = other["applied_found"]
    return merged


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


def run(opts: Options) -> dict[str, Any]:
    """Run the whole load test; write the JSON report and chart under ``opts.out``."""
    opts = opts.resolved()
    tmp = Path(tempfile.mkdtemp(prefix="kbgraph-loadtest-"))
    try:
        full: dict[str, Any] = run_loop(run_async(opts, tmp))
    finally:
        if opts.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if opts.out:
        out = Path(opts.out)
        clustered = opts.nodes > 1 or opts.jetstream
        name = f"loadtest-w{opts.workers}" + (f"-n{opts.nodes}" if clustered else "")
        report.write_json(out / f"{name}.json", full)
        full["report_path"] = str(out / f"{name}.json")
        if opts.chart:
            png = out / f"{name}.png"
            serving = (
                f"{opts.nodes} node(s) of {opts.workers} worker(s) (JetStream)"
                if clustered
                else f"{opts.workers} worker(s)"
            )
            report.chart(
                png,
                full["timeline"]["agents"],
                full["timeline"]["deliveries"],
                f"kbgraph load test: {opts.agents} agents, {opts.writers} writers at "
                f"{opts.write_rate:g}/s, {serving}, {opts.kind}-{opts.n}",
            )
            full["chart_path"] = str(png)
    return full


def run_loop(coro: Any) -> Any:
    """Run ``coro`` to its end on uvloop when it is installed (as the service runs), else on
    asyncio's own loop; the benchmarks' one way in."""
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
    parser.add_argument(
        "--port", type=int, default=None, help="the service port on 127.0.0.1 (default: a free one)"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="kbgraph nodes over a 3-server NATS JetStream cluster on loopback, each of "
        "--workers workers (default 1: one service on SQLite alone)",
    )
    parser.add_argument(
        "--jetstream",
        action="store_true",
        help="the NATS JetStream cluster even for one node (as --nodes N > 1 has it)",
    )
    parser.add_argument(
        "--faults",
        action="store_true",
        help="with --nodes 3: pause the stream's NATS leader, pause a node, kill a node, "
        "wipe a node (it restarts from a snapshot), each under load; checks after each",
    )
    parser.add_argument(
        "--fault-seconds",
        type=float,
        default=defaults.fault_seconds,
        help="how long a paused NATS leader or node stays paused (default %(default)s)",
    )
    return parser  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.agents < 0 or args.writers < 0 or args.workers < 1 or args.seconds <= 0:
        print("loadtest: --agents/--writers >= 0, --workers >= 1, --seconds > 0", file=sys.stderr)
        return 2
    if args.nodes < 1 or ((args.nodes > 1 or args.jetstream) and args.port is not None):
        print("loadtest: --nodes >= 1; with JetStream, no --port", file=sys.stderr)
        return 2
    if args.faults:
        if args.nodes < 3 or args.fault_seconds <= 0:
            print("loadtest: --faults needs --nodes 3 (or more), --fault-seconds > 0",
                  file=sys.stderr)  # fmt: skip
            return 2
        from loadtest import faults

        result = faults.run(args.nodes, args.fault_seconds, max(1, args.writers),
                            quiet=args.no_progress)  # fmt: skip
        print(faults.table(result))
        print(json.dumps({k: v for k, v in result.items() if k != "reports"},
                         separators=(",", ":")))  # fmt: skip
        return 0 if all(result["met"].values()) else 1
    if args.port is not None and not 1 <= args.port <= 65535:
        print(f"loadtest: --port {args.port}: expected 1-65535", file=sys.stderr)
        return 2
    opts = Options(
        seconds=args.seconds, agents=args.agents, writers=args.writers,
        write_rate=args.write_rate, workers=args.workers, kind=args.kind, n=args.n,
        seed=args.seed, out=args.out, short=args.short, progress=not args.no_progress,
        chart=not args.no_chart, keep=args.keep, port=args.port, nodes=args.nodes,
        jetstream=args.jetstream,
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

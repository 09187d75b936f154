"""The load test's report: the full JSON, its headline and the table printed at the end."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from loadtest import report
from loadtest.crowd import AGENT_MIX
from loadtest.options import Options
from loadtest.recorder import Recorder
from loadtest.service import ServiceProcess


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
        "nodes": opts.nodes,
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

"""What the load test records: every request's outcome and timing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


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

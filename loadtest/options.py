"""What a load test run is asked (``loadtest.driver`` runs it, ``loadtest.summary`` reports it)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from loadtest import ROOT


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
    port: int | None = None  # the service's port (None: a free one)
    nodes: int = 1  # >1: that many nodes over a 3-server NATS JetStream cluster on loopback
    faults: bool = False  # with nodes >= 3: the faults of loadtest.faults, under load
    fault_seconds: float = 10.0  # how long a paused NATS leader or node stays paused
    jetstream: bool = False  # the NATS JetStream cluster with one node too

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

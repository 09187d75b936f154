"""Progress of long work on a terminal: an import, shared by every source (a folder, a Logseq
graph, a MediaWiki dump, a corpus), and ``kbgraph backup`` of a large store.

A source reports ``(stage, done, total)`` as it goes ("read", "sent"; ``total`` None when not
known yet, as while a dump is read); ``Progress`` draws a tqdm bar per stage on stderr, a line
each (a folder's notes are sent while the rest are read). Only
when stderr is a terminal and ``--quiet`` was not given: a pipe or a log file gets the summary
alone, never a carriage return. Runs shorter than ``MIN_TOTAL`` items draw nothing.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final, TextIO

if TYPE_CHECKING:
    from types import TracebackType

MIN_TOTAL: Final = 200  # fewer items than this: over before a bar would say anything


class Progress:
    """A callable ``(stage, done, total)`` drawing bars on ``stream`` when it is a terminal."""

    def __init__(
        self,
        unit: str,
        *,
        quiet: bool,
        stream: TextIO | None = None,
        min_total: int = MIN_TOTAL,
        scaled: bool = False,
    ) -> None:
        """``scaled``: counts shown as 1.5k, 2.1M (in 1024s: bytes)."""
        self.stream = sys.stderr if stream is None else stream
        self.enabled = not quiet and self.stream.isatty()
        self.unit = unit
        self.min_total = min_total
        self.scaled = scaled
        self._bars: dict[str, Any] = {}  # stage -> its tqdm bar (tqdm ships no types)

    def __call__(self, stage: str, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        bar = self._bars.get(stage)
        if bar is None:
            if (total if total is not None else done) < self.min_total:
                return
            from tqdm import tqdm

            # a line per stage, in the order they start: reading and sending overlap
            bar = self._bars[stage] = tqdm(
                desc=f"  {stage}",
                total=total,
                unit=self.unit if self.scaled else f" {self.unit}",
                unit_scale=self.scaled,
                unit_divisor=1024 if self.scaled else 1000,
                file=self.stream,
                position=len(self._bars),
                mininterval=0.2,
                dynamic_ncols=True,
            )
        if total is not None and bar.total != total:  # a source may learn its total late
            bar.total = total
        bar.update(done - bar.n)

    def close(self) -> None:
        """End the bars (their last state stays on the screen)."""
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

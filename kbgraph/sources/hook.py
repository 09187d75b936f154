"""How a source plugs into ``kbgraph import`` / ``kbgraph sync`` (``kbgraph.sources.command``):
it adds its options to each command and, when the command line names it (in place of the
vault folder, the default source), runs with the destination the command opens for it.

A source's package gives one ``SourceHook`` (``kbgraph.sources.mediawiki.command.HOOK``, say)
and ``kbgraph.sources.command.SOURCES`` lists it. Its run imports its own packages only when it
runs, so the CLI starts without its extra and names the extra when one is missing.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kbgraph.extras import EXIT_USAGE
from kbgraph.names import KB_NAME_PATTERN, is_kb_name

if TYPE_CHECKING:
    from kbgraph.sources.sinks import Sink

OpenSink = Callable[[argparse.Namespace], "Sink | str"]  # the destination, or why there is none


@dataclass(frozen=True, slots=True)
class SourceHook:
    """A source's face to the commands."""

    # add its options to the command named ("import" or "sync")
    add_arguments: Callable[[argparse.ArgumentParser, str], None]
    wanted: Callable[[argparse.Namespace], bool]  # does the command line name this source?
    # run it to the end (``--watch``: until stopped); the exit code
    run: Callable[[argparse.Namespace, OpenSink, threading.Event | None], int]


def fail(message: str, code: int = EXIT_USAGE) -> int:
    """Say on stderr why a source's command stops, and give its exit code."""
    print(f"kbgraph: {message}", file=sys.stderr)
    return code


def options_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the options every source's command shares (``--kb``, ``--retries``),
    if anything."""
    if not is_kb_name(args.kb):
        return f"--kb {args.kb!r}: expected a KB name matching {KB_NAME_PATTERN}"
    if args.retries < 0:
        return "--retries: expected at least 0"
    return None

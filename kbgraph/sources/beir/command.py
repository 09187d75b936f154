"""``kbgraph import --beir FILE --kb KB``: a BEIR corpus in place of the folder.

The vault commands' options hold (``--kb``, ``--config`` or ``--url``, ``--retries``,
``--manifest``, ``--quiet``). The file is checked whole first (``corpus.check``): a bad line
refuses the import with every problem named, and nothing is sent. Then its concepts are read
again, one by one, and what changed since the manifest's record is sent; a passage gone from
the file is deleted. The manifest defaults to ``.kbgraph/beir.sqlite`` in the working folder.
"""

from __future__ import annotations

import argparse
import threading
from functools import partial
from pathlib import Path
from typing import Final

from kbgraph.extras import EXIT_FAILED
from kbgraph.sources.beir.corpus import MAX_PROBLEMS, CorpusError, check, concepts
from kbgraph.sources.deliver import deliver
from kbgraph.sources.hook import OpenSink, SourceHook, fail, options_problem
from kbgraph.sources.manifest import open_manifest
from kbgraph.sources.progress import Progress
from kbgraph.sources.sinks import SyncError
from kbgraph.sources.sync import printable

DEFAULT_MANIFEST: Final = Path(".kbgraph") / "beir.sqlite"
SOURCE: Final = "kbgraph-beir"  # the events' CloudEvents source


def add_arguments(command: argparse.ArgumentParser, name: str) -> None:
    """``kbgraph import --beir FILE`` (a corpus is imported, not followed)."""
    if name != "import":
        return
    command.add_argument(
        "--beir",
        metavar="FILE",
        help="a BEIR corpus (corpus.jsonl, or .jsonl.gz: _id, title, text a line) in place of DIR",
    )


def wanted(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "beir", None))


def run(
    args: argparse.Namespace, open_sink: OpenSink, stop_event: threading.Event | None = None
) -> int:
    """The import (``stop_event`` unused: it runs to the end)."""
    path = Path(args.beir)
    if args.dir:
        return fail("--beir: give either DIR or --beir, not both")
    problem = options_problem(args)
    if problem:
        return fail(problem)
    if getattr(args, "max_page_bytes", None) is not None:  # a wiki's and a folder's bound
        return fail("--max-page-bytes: bounds a wiki's pages or a folder's notes, not a corpus")
    if not path.is_file():
        return fail(f"--beir {args.beir}: no such file")
    try:
        checked = check(path)
    except CorpusError as exc:
        return fail(str(exc), EXIT_FAILED)
    if checked.problems:
        more = f" (the first {MAX_PROBLEMS})" if len(checked.problems) >= MAX_PROBLEMS else ""
        lines = "\n".join(f"  {printable(p)}" for p in checked.problems)
        return fail(f"{path}: bad lines{more}, nothing sent:\n{lines}", EXIT_FAILED)
    sink = open_sink(args)
    if isinstance(sink, str):
        return fail(sink)
    manifest_path = Path(args.manifest) if args.manifest else DEFAULT_MANIFEST
    manifest = open_manifest(manifest_path)
    if isinstance(manifest, str):
        sink.close()
        return fail(manifest)
    try:
        with manifest:
            seq = sink.kb_seq(args.kb)  # a store replaced since: everything is sent again
            if seq is not None:
                manifest.forget_if_behind(sink.dest, args.kb, seq)
            with Progress("passages", quiet=args.quiet) as progress:
                sent = deliver(
                    args.kb,
                    sink,
                    manifest,
                    concepts(path),
                    source=SOURCE,
                    everything=True,
                    progress=partial(progress, "sent"),
                )
    except (CorpusError, SyncError) as exc:
        return fail(str(exc), EXIT_FAILED)
    finally:
        sink.close()
    if not args.quiet:
        print(
            f"{checked.passages} passages; sent {sent.upserted} upserts and {sent.deleted}"
            f" deletes, {sent.unchanged} passages unchanged"
        )
    return 0


HOOK: Final = SourceHook(add_arguments, wanted, run)  # listed in kbgraph.sources.command

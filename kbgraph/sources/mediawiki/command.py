"""``kbgraph import --mediawiki-dump FILE`` and ``kbgraph sync --mediawiki URL [--watch]``.

The vault commands' options hold (``--kb``, ``--config`` or ``--url``, ``--retries``,
``--manifest``, ``--quiet``); these add a dump or a wiki in place of the folder. The manifest
defaults to ``.kbgraph/mediawiki.sqlite`` in the working folder: a dump import and a follower
of the same wiki sharing it send nothing twice. This module imports the wiki's packages only
when a command runs, so the CLI starts without them and names the extra when one is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

from kbgraph.extras import EXIT_FAILED
from kbgraph.extras import problem as extra_problem
from kbgraph.sources.hook import OpenSink, SourceHook, fail, options_problem
from kbgraph.sources.mediawiki.bounds import CALL_SECONDS, MAX_DUMP_BYTES, MAX_PAGE_BYTES

if TYPE_CHECKING:
    from kbgraph.sources.manifest import Manifest
    from kbgraph.sources.sinks import Sink

DEFAULT_MANIFEST: Final = Path(".kbgraph") / "mediawiki.sqlite"
DEFAULT_INTERVAL: Final = 10.0


def add_arguments(command: argparse.ArgumentParser, name: str) -> None:
    """The wiki options of ``kbgraph import`` (a dump) and ``kbgraph sync`` (a live wiki)."""
    command.add_argument(
        "--max-page-bytes",
        type=int,
        metavar="N",
        help=(
            f"a wiki's page of more wikitext (default {MAX_PAGE_BYTES}), or a folder's note"
            " of a larger file (default and most: the note bound, 2 MiB + 4 KiB), is skipped"
            " and reported, not parsed"
        ),
    )
    if name == "import":
        command.add_argument(
            "--mediawiki-dump",
            metavar="FILE",
            help="a MediaWiki XML dump (.xml, .xml.bz2, .xml.gz) in place of DIR",
        )
        command.add_argument(
            "--max-dump-bytes",
            type=int,
            default=MAX_DUMP_BYTES,
            metavar="N",
            help="the most bytes a dump may decompress to (past it the import stops)",
        )
    else:
        command.add_argument(
            "--mediawiki",
            metavar="URL",
            help="follow a live MediaWiki's recent changes (its base URL or api.php)",
        )
        command.add_argument(
            "--interval",
            type=float,
            default=DEFAULT_INTERVAL,
            help="seconds between polls of the wiki with --mediawiki --watch",
        )
        command.add_argument(
            "--wiki-timeout",
            type=float,
            default=CALL_SECONDS,
            metavar="SECONDS",
            help="the most one request to the wiki may take, its whole answer included",
        )


def wanted(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "mediawiki_dump", None) or getattr(args, "mediawiki", None))


def run(
    args: argparse.Namespace, open_sink: OpenSink, stop_event: threading.Event | None = None
) -> int:
    dump = getattr(args, "mediawiki_dump", None)
    flag = "--mediawiki-dump" if dump else "--mediawiki"
    needs = extra_problem("mediawiki", f"kbgraph {args.command} {flag}")
    if needs:
        return fail(needs)
    if args.dir:
        return fail(f"{flag}: give either DIR or {flag}, not both")
    problem = options_problem(args)
    if problem:
        return fail(problem)
    if args.max_page_bytes is None:
        args.max_page_bytes = MAX_PAGE_BYTES
    if args.max_page_bytes <= 0 or (dump and args.max_dump_bytes <= 0):
        which = "--max-page-bytes" if args.max_page_bytes <= 0 else "--max-dump-bytes"
        return fail(f"{which}: expected a number of bytes above 0")
    if dump and not Path(dump).is_file():
        return fail(f"--mediawiki-dump {dump}: no such file")
    if not dump and not args.mediawiki.startswith(("http://", "https://")):
        return fail(f"--mediawiki {args.mediawiki!r}: expected an http:// or https:// URL")
    if not dump and args.interval <= 0:
        return fail("--interval: expected a number of seconds above 0")
    if not dump and args.wiki_timeout <= 0:
        return fail("--wiki-timeout: expected a number of seconds above 0")
    sink = open_sink(args)
    if isinstance(sink, str):
        return fail(sink)
    from kbgraph.sources.manifest import open_manifest

    path = Path(args.manifest) if args.manifest else DEFAULT_MANIFEST
    manifest = open_manifest(path)
    if isinstance(manifest, str):
        sink.close()
        return fail(manifest)
    try:
        with manifest:
            if dump:
                return _import(Path(dump), args, sink, manifest)
            return _follow(args, sink, manifest, path, stop_event)
    finally:
        sink.close()


def _import(path: Path, args: argparse.Namespace, sink: Sink, manifest: Manifest) -> int:
    from kbgraph.sources.deliver import deliver
    from kbgraph.sources.mediawiki.concepts import SOURCE
    from kbgraph.sources.mediawiki.dump import DumpError, read_dump
    from kbgraph.sources.progress import Progress
    from kbgraph.sources.sinks import SyncError
    from kbgraph.sources.sync import printable

    try:
        with Progress("pages", quiet=args.quiet) as progress:
            read = read_dump(
                path,
                partial(progress, "read"),
                max_page_bytes=args.max_page_bytes,
                max_bytes=args.max_dump_bytes,
            )
            sent = deliver(
                args.kb,
                sink,
                manifest,
                read.concepts,
                source=SOURCE,
                everything=True,
                progress=partial(progress, "sent"),
            )
    except (DumpError, SyncError) as exc:
        return fail(str(exc), EXIT_FAILED)
    lines = [
        f"{read.summary()}; sent {sent.upserted} upserts and {sent.deleted} deletes,"
        f" {sent.unchanged} pages unchanged"
    ]
    lines += [f"warning {printable(w)}" for w in read.warnings]
    _print(lines, args.quiet)
    return 0


def _follow(
    args: argparse.Namespace,
    sink: Sink,
    manifest: Manifest,
    path: Path,
    stop_event: threading.Event | None,
) -> int:
    from kbgraph.sources.mediawiki.api import WikiApi, WikiError
    from kbgraph.sources.mediawiki.follow import FollowState, WikiFollower, follow
    from kbgraph.sources.sinks import SyncError
    from kbgraph.sources.sync import printable

    api = WikiApi(args.mediawiki, attempts=args.retries + 1, deadline=args.wiki_timeout)
    state = FollowState(path)
    follower = WikiFollower(api, args.kb, sink, manifest, state, max_page_bytes=args.max_page_bytes)

    polls = 0

    def poll() -> None:
        """One pass, reported; under ``--watch``, a later pass that sent nothing is not."""
        nonlocal polls
        report = follower.poll()
        polls += 1
        idle = polls > 1 and not (report.sent.upserted or report.sent.deleted)
        if not args.quiet and not idle:
            print(report.summary())
        if report.warnings:
            warnings = "\n".join(f"warning {printable(w)}" for w in report.warnings)
            print(warnings, file=sys.stderr if args.quiet else sys.stdout)

    try:
        try:
            poll()
        except (WikiError, SyncError) as exc:
            return fail(str(exc), EXIT_FAILED)
        if args.watch:
            print(f"following {api.url} (Ctrl-C stops)", file=sys.stderr)
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the cursor is as sent
                follow(
                    poll,
                    args.interval,
                    lambda exc: print(f"kbgraph: {exc}", file=sys.stderr),
                    stop_event or threading.Event(),
                )
        return 0
    finally:
        state.close()
        api.close()


def _print(lines: list[str], quiet: bool) -> None:
    if quiet:
        lines = lines[1:]
    if lines:
        print("\n".join(lines), file=sys.stderr if quiet else sys.stdout)


HOOK: Final = SourceHook(add_arguments, wanted, run)  # listed in kbgraph.sources.command

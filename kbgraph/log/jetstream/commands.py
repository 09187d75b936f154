"""``kbgraph cluster ...`` on the command line, without nats-py: the parser is built for every
``kbgraph`` command, the decision's code (``kbgraph.log.jetstream.admin``) is imported when run."""

from __future__ import annotations

import argparse
import asyncio
import sys

from kbgraph.config import JETSTREAM_SECTION, ConfigError, load_config


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``kbgraph cluster skip`` on the CLI's subcommands."""
    cluster = sub.add_parser("cluster", help="operate a JetStream cluster of nodes")
    commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    cmd = commands.add_parser(
        "skip",
        help="record in the stream that the message at POSITION applies nothing on any node",
        description="Run it only once every node's /readyz names the same failing position:"
        " a node that applied the message would then differ, and stops.",
    )
    cmd.add_argument(
        "--config",
        required=True,
        help=f"a node's TOML config (its [log] and [{JETSTREAM_SECTION}])",
    )
    cmd.add_argument("--position", required=True, type=int, help="the stream sequence to skip")
    cmd.add_argument("--reason", required=True, help="why (noted in every node's store)")
    cmd.set_defaults(func=cmd_skip)


def cmd_skip(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"kbgraph: config {args.config}: {exc}", file=sys.stderr)
        return 2
    if config.log.kind != "jetstream":
        print(f'kbgraph: config {args.config}: [log] kind is not "jetstream"', file=sys.stderr)
        return 2
    from kbgraph.log.jetstream import admin  # nats-py: only for this command

    try:
        seq = asyncio.run(admin.skip(config.log.jetstream, args.position, args.reason))
    except admin.DecisionRefused as exc:
        print(f"kbgraph: cluster skip: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"kbgraph: cluster skip: not recorded: {exc!r}", file=sys.stderr)
        return 1
    print(f"recorded at position {seq}: skip {args.position} ({args.reason})")
    return 0

"""What mention edges cost: the follower's CPU per event, a rename named in 10,000 texts, and
the first build, each with and without mentions, side by side in one run.

A synthetic KB (``--concepts``, default 20,000) whose concepts are named by two words of a
5,000-word vocabulary and whose texts are ``TEXT_WORDS`` random words of it with
``NAMES_PER_TEXT`` other concepts' names among them (so names overlap, and some are contested,
as in real text); ``RENAMED_IN`` of the texts also name the concept ``target`` ("Target Name")
and hold the words "Other Label".

1. **First build**: ``KBProjection.build`` of the state, then ``attach_mentions`` (the
   follower does the same after a build or a checkpoint load), process CPU; with / without.
   **Restart**: that KB written as a checkpoint and loaded, then ``attach_mentions``' CPU when
   it restores the checkpoint's occurrences, against scanning every text as a checkpoint
   without them needs.
2. **Follower CPU per event**: a stream of ``--events`` single-event deliveries applied by
   ``KBProjection.apply`` (the follower's apply, two visibility masks cached and patched; each
   upsert carries its analysis as the log does): 50% text edits naming other concepts, 15% new
   concepts, 10% renames, 10% aliases given, 5% link adds, 10% deletes; the applying thread's
   CPU per event, the same stream on a KB with and one without mentions. The same on real
   text: 2WikiMultihopQA's 6,119 passages (``loadtest/questions/2wiki``), a stream of passages
   given another passage's text (90%) or another passage's title (10%). Each figure is
   measured in a fresh process (the heap holds nothing of the other figures), after a full
   collection (a build's objects are walked by the collector once, after the build: no cost
   of an event), fed one of two ways:

   - **in turns** (the default): both KBs in one process, fed ``CHUNK`` deliveries each in
     turn, each its own copy of the stream, as a follower serving several KBs: each KB's work
     evicts the other's memory, and a collection falling in one KB's turn walks the other's
     young objects too.
   - **alone** (``--alone``; with ``--turns`` both ways): each KB in a process of its own,
     fed its whole stream, as a follower of that one KB; the two processes of a pair run one
     after the other (their order swapped every round), so the load weighs less alike on
     the two sides than in turns: run several ``--rounds``.

   ``--rounds N`` measures each figure N times (the medians; each ratio the median of the
   rounds' ratios). ``--peer CHECKOUT`` measures only these figures, with this checkout's and
   that one's code (its ``.venv``, else this Python, run in that checkout), the sides
   alternating, their order swapped every round.
3. **graph_context**: the tool (``kbgraph.agent.tools.graph_context``, lexical seeds) for
   ``QUESTIONS`` questions naming two concepts each, median wall time with and without (with:
   ``ranked`` walks links and mentions in Python).
4. **Rename**: ``target`` renamed to "Other Label" (named in ``RENAMED_IN`` texts before and
   after): the apply's wall and CPU time, and that every one of those texts mentions it after.

Aims (issue 44): CPU per event with mentions <= 1.2x without, a follower of one KB (alone: the
figure to read; in turns the KB without mentions also pays for the memory the other evicts);
first build <= 1.3x; the rename applied in <= 1 s. The last line is one JSON object with every
figure and the aims; ``fed`` says which feeds it holds (``apply_*`` in turns, ``alone_apply_*``
alone; ``real_`` for 2Wiki's), ``load_1min`` the load average at its start and end.

    .venv/bin/python -m loadtest.bench_mentions [--concepts 20000] [--events 5000]
        [--alone [--turns]] [--rounds 1] [--peer CHECKOUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from kbgraph.access import Rule, canonical
from kbgraph.agent import tools
from kbgraph.agent.shapes import GraphContextRequest
from kbgraph.events import (
    ConceptDeleted,
    ConceptUpserted,
    DeleteData,
    Event,
    LinkAdded,
    LinkData,
    UpsertData,
)
from kbgraph.projection import KBProjection, checkpoint, warm_up
from kbgraph.projection.bulk import gc_paused
from kbgraph.search.document import decode, encode
from kbgraph.store import KBState, LogRecord
from kbgraph.store.model import ConceptState
from loadtest.eval_2wiki import load_corpus
from loadtest.report import checkout_python, child_json

VOCABULARY: Final = 5_000
TEXT_WORDS: Final = 60
NAMES_PER_TEXT: Final = 3
RENAMED_IN: Final = 10_000
QUESTIONS: Final = 50
CHUNK: Final = 100  # deliveries applied to one KB before the other's turn
STREAMS: Final = {"synthetic": "", "2wiki": "real_"}  # a stream's prefix in the figures' names
FEEDS: Final = {"turns": "", "alone": "alone_"}
# This file run in another checkout, with that checkout's code first on the path.
RUNNER: Final = (
    "import runpy, sys; sys.argv[:2] = sys.argv[1:2]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
WORDS: Final = [f"w{i}" for i in range(VOCABULARY)]
SIDES: Final = {False: "without", True: "with"}


def title_of(i: int) -> str:
    rng = random.Random(i)
    return f"{rng.choice(WORDS)} {rng.choice(WORDS)}"


def text_of(rng: random.Random, n: int, extra: str = "") -> str:
    words = rng.choices(WORDS, k=TEXT_WORDS)
    for _ in range(NAMES_PER_TEXT):
        words.insert(rng.randrange(len(words)), title_of(rng.randrange(n)))
    return " ".join(words) + extra


def cid(i: int) -> str:
    return f"c/{i:07d}"


def state(n: int) -> KBState:
    rng = random.Random(1)
    extra = " about Target Name and Other Label"
    concepts = [
        ConceptState(
            cid(i), 1, title_of(i), "", "", [], text_of(rng, n, extra * (i < RENAMED_IN)), []
        )
        for i in range(n)
    ]
    concepts.append(ConceptState("target", 1, "Target Name", "", "", [], "", []))
    return KBState(1, sorted(concepts, key=lambda c: c.id))


def _upsert(subject: str, version: int, title: str, text: str, aliases: list[str]) -> Event:
    data = UpsertData(version=version, title=title, text=text, aliases=aliases)
    return ConceptUpserted(specversion="1.0", id=f"{subject}@{version}", source="bench",
                           subject=subject, data=data)  # fmt: skip


def stream(n: int, count: int) -> list[list[LogRecord]]:
    """Single-event deliveries, each upsert with its analysis as the log carries it."""
    rng = random.Random(2)
    versions: dict[int, int] = {}
    events: list[Event] = []
    alive = set(range(n))
    fresh = n
    for _ in range(count):
        roll = rng.random()
        u = rng.randrange(fresh)
        v = versions[u] = versions.get(u, 1) + 1
        if roll < 0.5 or u not in alive:
            alive.add(u)
            events.append(_upsert(cid(u), v, title_of(u), text_of(rng, n), []))
        elif roll < 0.65:
            fresh += 1
            alive.add(fresh - 1)
            events.append(_upsert(cid(fresh - 1), 1, title_of(fresh - 1), text_of(rng, n), []))
        elif roll < 0.75:
            events.append(_upsert(cid(u), v, title_of(n + u), text_of(rng, n), []))
        elif roll < 0.85:
            events.append(_upsert(cid(u), v, title_of(u), text_of(rng, n), [title_of(2 * n + u)]))
        elif roll < 0.9:
            data = LinkData(v, cid(rng.randrange(n)))
            events.append(LinkAdded(specversion="1.0", id=f"l{u}@{v}", source="bench",
                                    subject=cid(u), data=data))  # fmt: skip
        else:
            alive.discard(u)
            events.append(ConceptDeleted(specversion="1.0", id=f"d{u}@{v}", source="bench",
                                         subject=cid(u), data=DeleteData(v)))  # fmt: skip
    records = []
    for i, e in enumerate(events):
        analysis = None
        if isinstance(e, ConceptUpserted):
            d = e.data
            analysis = decode(encode(d.title, d.text, d.aliases, d.tags))
        records.append([LogRecord(i + 1, "bench", i + 2, e, True, analysis)])
    return records


def real() -> tuple[KBState, list[list[LogRecord]]]:
    """2Wiki's passages as concepts, and a stream of real text edits and renames."""
    passages = load_corpus()
    concepts = [
        ConceptState(cid(i), 1, p.title, "", "", [], p.text, []) for i, p in enumerate(passages)
    ]
    rng = random.Random(4)
    records = []
    for k in range(len(passages)):
        i, j = rng.randrange(len(passages)), rng.randrange(len(passages))
        title, text = passages[i].title, passages[j].text
        if rng.random() < 0.1:
            title, text = passages[j].title, passages[i].text
        event = _upsert(cid(i), k + 2, title, text, [])
        records.append(
            [LogRecord(k + 1, "bench", k + 2, event, True, decode(encode(title, text, [], [])))]
        )
    return KBState(1, concepts), records


def built(kb_state: KBState, mentions: bool) -> tuple[KBProjection, float]:
    gc.collect()
    kb = KBProjection("bench")
    cpu = time.process_time()
    with gc_paused():  # as the follower builds
        kb.build(kb_state)
    kb.attach_mentions(mentions)
    return kb, time.process_time() - cpu


def attach_cpu(folder: Path, restore: bool) -> float:
    """``attach_mentions``' CPU on the KB of the checkpoint in ``folder``: its occurrences
    restored, or (``restore`` false) every text scanned, as for a checkpoint without them."""
    (path, *_) = checkpoint.candidates(folder)
    header, start = checkpoint.read_header(path)
    kb = checkpoint.load(path, header, start).kbs["bench"]
    if not restore:
        kb.saved_mentions = None
    gc.collect()
    cpu = time.process_time()
    kb.attach_mentions(True)
    return time.process_time() - cpu


def apply_cpu(
    kbs: dict[bool, KBProjection], streams: dict[bool, list[list[LogRecord]]]
) -> dict[bool, float]:
    """The applying thread's CPU for each of ``kbs``, its stream (a copy of its own: a KB
    reading the records the other just read would find them in the cache, and their strings'
    hashes made) fed to them in turns, ``CHUNK`` deliveries at a time (one KB: alone): the
    machine's load, which moves from second to second here, weighs on both sides of the ratio
    alike (and each KB's work evicts the other's from the caches, as a follower of several KBs
    does)."""
    for kb in kbs.values():
        with kb.read() as snap:
            for rules in (
                canonical([Rule(frozenset({"c"}), frozenset())]),
                canonical([Rule(frozenset(), frozenset({"Runbook"}))]),
            ):
                snap.view(rules)  # cached: every event below patches it
    # The builds' objects, made with the collector paused, are walked once by its first
    # collections (~20 ms here): a cost of the build, not of an event, and without this it
    # falls in whichever KB's turn allocates first.
    gc.collect()
    spent = dict.fromkeys(kbs, 0.0)
    for at in range(0, max(map(len, streams.values())), CHUNK):
        for on, kb in kbs.items():
            rest = streams[on][at : at + CHUNK]
            cpu = time.thread_time()
            while rest:
                with gc_paused():  # as the follower applies a batch
                    rest = rest[kb.apply(rest) :]
            spent[on] += time.thread_time() - cpu
    return spent


def child(feed: str, name: str, n: int, events: int) -> dict[str, float]:
    """One figure of the follower's CPU, in this fresh process: ``feed`` "turns" (both KBs),
    "with" or "without" (that KB alone); on the ``name`` stream."""
    warm_up()
    kb_state, records = (state(n), stream(n, events)) if name == "synthetic" else real()
    sides = (False, True) if feed == "turns" else (feed == "with",)
    kbs = {on: built(kb_state, on)[0] for on in sides}
    del kb_state
    streams = {sides[0]: records}
    for on in sides[1:]:  # the same stream, in objects of its own
        streams[on] = stream(n, events) if name == "synthetic" else real()[1]
    spent = apply_cpu(kbs, streams)
    out = {SIDES[on]: round(cpu / len(records) * 1e6, 1) for on, cpu in spent.items()}
    mentions = kbs[True].mentions if True in kbs else None
    if mentions is not None and name == "synthetic":
        out["plain_edges"] = sum(len(targets) for targets in mentions.out.values())
        out["contested_texts"] = len(mentions.contested)
    return out


def run_child(checkout: Path, feed: str, name: str, args: argparse.Namespace) -> dict[str, float]:
    python = checkout_python(checkout)
    sizes = ["--concepts", str(args.concepts), "--events", str(args.events)]
    command = [python, "-c", RUNNER, __file__, "--child", feed, name, *sizes]
    return child_json(command, checkout)


def apply_figures(
    checkouts: dict[str, Path], feeds: list[str], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Each checkout's follower CPU an event, per feed and stream, over ``args.rounds``."""
    runs: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for side, checkout in list(checkouts.items())[:: 1 - 2 * (r % 2)]:
            for feed in feeds:
                for name in STREAMS:
                    got: dict[str, float] = {}
                    for part in (
                        ("turns",) if feed == "turns" else ("without", "with")[:: 1 - 2 * (r % 2)]
                    ):
                        got.update(run_child(checkout, part, name, args))
                    runs.setdefault((side, feed, name), []).append(got)
                    print(
                        json.dumps({"round": r + 1, "side": side, "fed": feed, name: got}),
                        flush=True,
                    )
    figures: dict[str, dict[str, Any]] = {side: {} for side in checkouts}
    for (side, feed, name), rounds in runs.items():
        key = f"{FEEDS[feed]}{STREAMS[name]}apply"
        figures[side][f"{key}_cpu_us_per_event"] = {
            k: round(statistics.median(g[k] for g in rounds), 1) for k in SIDES.values()
        }
        ratios = [g["with"] / g["without"] for g in rounds]
        figures[side][f"{key}_ratio"] = round(statistics.median(ratios), 3)
        if len(rounds) > 1:
            figures[side][f"{key}_ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        for k in ("plain_edges", "contested_texts"):
            if k in rounds[0]:
                figures[side][k] = rounds[0][k]
    return figures


def apply_aims(figures: dict[str, Any]) -> dict[str, bool]:
    return {
        f"{k[:-6]}_ratio_le_1_2": v <= 1.2 for k, v in figures.items() if k.endswith("apply_ratio")
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_mentions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--concepts", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--alone", action="store_true", help="feed each KB alone, not in turns")
    parser.add_argument("--turns", action="store_true", help="with --alone: in turns too")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each apply figure")
    parser.add_argument("--peer", type=Path, help="the apply figures only, beside this checkout")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = max(args.concepts, RENAMED_IN)
    if args.child:
        feed, name = args.child
        print(json.dumps(child(feed, name, n, args.events)))
        return
    # Imported here, past the child's return: this file also runs in a peer's child
    # (``RUNNER``), where ``loadtest`` is the peer's package, which may not have it.
    from loadtest import ROOT

    feeds = ["alone", "turns"][: 1 + args.turns] if args.alone else ["turns"]
    load = [round(os.getloadavg()[0], 2)]
    head = {"fed": feeds, "rounds": args.rounds, "load_1min": load}
    if args.peer is not None:
        both = apply_figures({"peer": args.peer, "this": ROOT}, feeds, args)
        over = {
            k: round(v / both["peer"][k], 3)
            for k, v in both["this"].items()
            if k.endswith("_ratio") and both["peer"].get(k)
        }
        for k, v in both["this"].items():
            if k.endswith("_per_event"):
                over.update({f"{k}_{s}": round(v[s] / both["peer"][k][s], 3) for s in v})
        load.append(round(os.getloadavg()[0], 2))
        print(
            json.dumps({**head, **both, "this_over_peer": over, "aims": apply_aims(both["this"])})
        )
        return
    warm_up()
    kb_state = state(n)
    figures: dict[str, Any] = {**head, "concepts": n + 1, "events": args.events}
    builds: dict[bool, float] = {}
    for on in (False, True, False, True):  # twice each, alternating: the best of each
        kb, seconds = built(kb_state, on)
        builds[on] = min(builds.get(on, seconds), seconds)
        del kb
    figures["build_cpu_s"] = {"without": round(builds[False], 3), "with": round(builds[True], 3)}
    figures["build_ratio"] = round(builds[True] / builds[False], 3)
    print(json.dumps({"build": figures["build_cpu_s"]}), flush=True)

    with tempfile.TemporaryDirectory() as folder:
        checkpoint.write(Path(folder), "bench", 1, None, {"bench": built(kb_state, True)[0]})
        attaches: dict[bool, float] = {}
        for restore in (False, True, False, True):
            seconds = attach_cpu(Path(folder), restore)
            attaches[restore] = min(attaches.get(restore, seconds), seconds)
    figures["restart_attach_cpu_s"] = {
        "scan": round(attaches[False], 3),
        "restore": round(attaches[True], 3),
    }
    print(json.dumps({"restart_attach": figures["restart_attach_cpu_s"]}), flush=True)

    figures.update(apply_figures({"this": ROOT}, feeds, args)["this"])

    contexts = {}
    for on in (False, True):
        kb, _ = built(kb_state, on)
        rng = random.Random(3)
        times = []
        for _ in range(QUESTIONS):
            q = f"what links {title_of(rng.randrange(n))} and {title_of(rng.randrange(n))}"
            with kb.read() as snap:
                t0 = time.perf_counter()
                tools.graph_context(snap, snap.view(None), GraphContextRequest(query=q))
                times.append(time.perf_counter() - t0)
        contexts[on] = sorted(times)[len(times) // 2]
        del kb
    figures["graph_context_ms"] = {
        "without": round(contexts[False] * 1e3, 2),
        "with": round(contexts[True] * 1e3, 2),
    }
    print(json.dumps({"graph_context_ms": figures["graph_context_ms"]}), flush=True)

    kb, _ = built(kb_state, True)
    rename = [[LogRecord(1, "bench", 2, _upsert("target", 2, "Other Label", "", []), True)]]
    wall, cpu = time.perf_counter(), time.thread_time()
    kb.apply(rename)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    with kb.read() as snap:
        target = snap.node("target")
        assert target is not None and kb.mentions is not None
        named_in = len(kb.mentions.view(snap.view(None).mask).into(target))
    figures["rename"] = {"texts": named_in, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}
    load.append(round(os.getloadavg()[0], 2))
    figures["aims"] = {
        **apply_aims(figures),
        "build_ratio_le_1_3": figures["build_ratio"] <= 1.3,
        "rename_le_1_s": wall <= 1.0 and named_in >= RENAMED_IN,
    }
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()

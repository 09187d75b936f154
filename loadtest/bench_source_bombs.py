"""Sources that answer with bombs (issue 48): each run through ``python -m kbgraph`` as a user
would, its peak RSS measured (and its growth over a benign run of the same command), its wall
time, exit code and last line. The fake wiki (``tests/hostile_wiki.py``) serves on loopback in
this process; the dumps are bz2 files of concatenated streams, a few KB each.

Aims (the issue's): each bomb bounded (peak RSS ≤ 600 MB), a clean exit (0 or 1, one clear
line, no traceback) before the case's deadline, a poisoned stamp not stopping later changes.
The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.hostile_wiki import (
    HEAD,
    Answer,
    FakeWiki,
    bomb,
    drip,
    endless_titles,
    huge,
    now,
    page,
    wrong_shape,
)
from tests.peak_rss import peak_rss_of

AIM_PEAK_MB = 600
DEADLINE_S = 300.0  # a case still running then has failed its aim
SOUP = "ab [[X]] " * ((1 << 20) // 9)
OPENED = page("Bomb", "", 2)[: -len("</text></revision></page>")]
CLOSED = "</text></revision></page></mediawiki>"


def run(command: list[str]) -> dict[str, Any]:
    began = time.monotonic()
    code, peak, output = peak_rss_of(command, DEADLINE_S)
    lines = [line for line in output.splitlines() if not line.startswith("PEAK_KB=")]
    said = [line for line in lines if line.startswith(("kbgraph: ", "warning "))]
    return {
        "exit": code,
        "peak_mb": round(peak / (1 << 20), 1),
        "wall_s": round(time.monotonic() - began, 1),
        "traceback": "Traceback" in output,
        "line": (said or lines or [""])[-1][:240],
    }


def importing(folder: Path, dump: Path) -> list[str]:
    folder.mkdir(exist_ok=True)
    (folder / "c.toml").write_text('[store]\npath = "kb.db"\n')
    return [sys.executable, "-m", "kbgraph", "import", "--mediawiki-dump", str(dump), "--kb",
            "wiki", "--config", str(folder / "c.toml"), "--manifest",
            str(folder / "m.sqlite")]  # fmt: skip


def syncing(folder: Path, url: str) -> list[str]:
    folder.mkdir(exist_ok=True)
    (folder / "c.toml").write_text('[store]\npath = "kb.db"\n')
    return [sys.executable, "-m", "kbgraph", "sync", "--mediawiki", url, "--kb", "wiki",
            "--config", str(folder / "c.toml"), "--manifest", str(folder / "m.sqlite"),
            "--retries", "0"]  # fmt: skip


def dump_cases(base: Path) -> dict[str, dict[str, Any]]:
    good = HEAD + page("Good", "A [[Bomb]].")
    benign = bomb(base / "benign.xml.bz2", good, "", 0, "</mediawiki>")
    cases = {
        "dump_benign": benign,
        "dump_link_soup_20mb": bomb(base / "soup.xml.bz2", good + OPENED, SOUP, 20, CLOSED),
        "dump_expands_300mb": bomb(base / "big.xml.bz2", HEAD + OPENED, SOUP, 300, CLOSED),
        "dump_blanks_300mb": bomb(
            base / "blank.xml.bz2", good, " " * (1 << 20), 300, "</mediawiki>"
        ),
    }
    out = {}
    for name, dump in cases.items():
        out[name] = {"file_bytes": dump.stat().st_size, **run(importing(base / name, dump))}
    return out


def wiki_case(
    base: Path, name: str, hostile: dict[str, Callable[[dict[str, str]], Answer]], *more: str
) -> dict[str, Any]:
    pages = {"Good": "A [[B]].", "Soup": "{{x|[[B]]}}" * (2_000_000 // 11)}
    wiki = FakeWiki(pages=pages if name == "live_templates_2mb" else {"Good": "A [[B]]."},
                    hostile=hostile)  # fmt: skip
    with wiki.serve() as url:
        return run([*syncing(base / name, url), *more])


def stamps_case(base: Path) -> dict[str, Any]:
    """A change stamped ``zzzz`` and one ``9999-12-31T23:59:59Z``, then a later edit."""
    wiki = FakeWiki(pages={"Good": "A [[B]]."})
    folder = base / "live_bad_stamps"
    with wiki.serve() as url:
        first = run(syncing(folder, url))
        wiki.pages.update({"Bad": "x", "Future": "y"})
        wiki.changes += [{"title": "Bad", "timestamp": "zzzz"},
                         {"title": "Future", "timestamp": "9999-12-31T23:59:59Z"}]  # fmt: skip
        second = run(syncing(folder, url))
        time.sleep(1.1)
        wiki.pages["Later"] = "written after the bad stamps"
        wiki.changes.append({"title": "Later", "timestamp": now()})
        third = run(syncing(folder, url))
    from kbgraph.store import Store

    with Store(folder / "kb.db") as store:
        ids = {c.id for c in store.load().kbs["wiki"].concepts}
    return {**third, "runs_exit": [first["exit"], second["exit"], third["exit"]],
            "refused_line": second["line"], "later_followed": "Main/Later" in ids,
            "bad_sent": bool({"Main/Bad", "Main/Future"} & ids)}  # fmt: skip


def logseq_case(base: Path) -> dict[str, Any]:
    root = base / "graph"
    (root / "logseq").mkdir(parents=True)
    (root / "pages").mkdir()
    (root / "logseq" / "config.edn").write_text("{:file/name-format :triple-lowbar :x 1/0}")
    (root / "pages" / "A.md").write_text("- a page\n")
    (base / "c.toml").write_text('[store]\npath = "kb.db"\n')
    return run([sys.executable, "-m", "kbgraph", "import", str(root), "--kb", "kb", "--config",
                str(base / "c.toml")])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_source_bombs", description=__doc__.split("\n\n")[0]
    )
    parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="source-bombs-"))
    results = dump_cases(base)
    endless_rc: dict[str, Callable[[dict[str, str]], Answer]] = {
        "list=recentchanges": _endless_changes
    }
    results["live_benign"] = wiki_case(base, "live_benign", {})
    results["live_templates_2mb"] = wiki_case(base, "live_templates_2mb", {})
    results["live_huge_answer_400mb"] = wiki_case(
        base, "live_huge_answer_400mb", {"meta=siteinfo&siprop=general": huge}
    )
    results["live_endless_allpages"] = wiki_case(
        base, "live_endless_allpages", {"list=allpages": endless_titles}
    )
    results["live_drip_20s"] = wiki_case(
        base, "live_drip_20s", {"meta=siteinfo&siprop=namespaces": drip(20.0)}
    )
    results["live_wrong_shape"] = wiki_case(
        base, "live_wrong_shape", {"meta=siteinfo&siprop=namespaces": wrong_shape}
    )
    folder = base / "live_endless_recentchanges"
    wiki = FakeWiki(pages={"Good": "A [[B]]."})
    with wiki.serve() as url:
        run(syncing(folder, url))  # the first pass reads the whole wiki
        wiki.hostile = endless_rc
        results["live_endless_recentchanges"] = run(syncing(folder, url))
    results["live_bad_stamps"] = stamps_case(base)
    results["logseq_config_1_over_0"] = logseq_case(base / "logseq")
    aims = {
        name: {
            "peak_within_600mb": r["peak_mb"] <= AIM_PEAK_MB,
            "clean_exit": r["exit"] in (0, 1) and not r["traceback"],
            "within_deadline": r["wall_s"] < DEADLINE_S,
        }
        for name, r in results.items()
    }
    aims["live_bad_stamps"]["later_followed"] = results["live_bad_stamps"]["later_followed"]
    for name, r in results.items():
        print(f"{name:28} exit {r['exit']} peak {r['peak_mb']:7.1f} MB {r['wall_s']:6.1f} s"
              f"  {r['line']}")  # fmt: skip
    met = all(all(a.values()) for a in aims.values())
    print(json.dumps({"kind": "source_bombs", "results": results, "aims": aims,
                      "all_aims_met": met}))  # fmt: skip


def _endless_changes(params: dict[str, str]) -> Answer:
    n = int(params.get("rccontinue", "0"))
    return {"continue": {"rccontinue": str(n + 1)},
            "query": {"recentchanges": [{"title": "Good", "timestamp": now()}]}}  # fmt: skip


if __name__ == "__main__":
    main()

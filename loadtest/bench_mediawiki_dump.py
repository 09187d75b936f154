"""MediaWiki dump import speed: a generated dump of 10,000 pages, imported into a fresh store.

The generator writes an XML dump as ``dumpBackup.php --current`` does (export schema 0.11)
with pages in three namespaces: articles with ~8 links each (plain, labelled, with underscores
or a lower-case first letter, to a section, inside a template's argument, to a redirect, to a
missing page), categories, a file link, templates; a tenth of the titles are redirects. It
also returns what it wrote as a model (each concept's links through redirects, tags, aliases),
which tests/test_mediawiki_dump.py holds the import to: an oracle independent of the parser.

Timed, into a fresh local store (WAL, synchronous=FULL) through ``Store.append``:
``read_dump`` alone (mwxml and mwparserfromhell), then the whole import (read and send), then
a re-import of the unchanged dump (sends nothing). CPU seconds of the process are given beside
wall seconds (the machine is shared). The last line printed is one JSON object.

    .venv/bin/python -m loadtest.bench_mediawiki_dump [--pages 10000]
"""

from __future__ import annotations

import argparse
import bz2
import json
import random
import resource
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from kbgraph.sources.deliver import deliver
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.mediawiki.concepts import SOURCE
from kbgraph.sources.mediawiki.dump import read_dump
from kbgraph.sources.sinks import LocalSink

WORDS = ["river", "bridge", "castle", "harbour", "market", "tower", "garden", "church",
         "station", "museum", "square", "forest", "valley", "island", "lake", "road"]  # fmt: skip
NAMESPACES = {0: "", 6: "File", 10: "Template", 14: "Category"}
CATEGORIES = 40
AIMS = {"pages_per_s": 200.0}


@dataclass
class Expected:
    """What the generator wrote, as concepts: id -> links (ids), tags, aliases."""

    links: dict[str, list[str]] = field(default_factory=dict)
    tags: dict[str, list[str]] = field(default_factory=dict)
    aliases: dict[str, list[str]] = field(default_factory=dict)
    redirects: int = 0


def _article(i: int) -> str:
    return f"{WORDS[i % len(WORDS)].title()} {i:05d}"


def generate(path: Path, pages: int, seed: int = 7) -> Expected:
    """A dump of ``pages`` pages at ``path`` (``.bz2`` compressed when it ends so)."""
    rng = random.Random(seed)
    articles = [_article(i) for i in range(pages * 8 // 10)]
    redirects = {f"Also {i:05d}": rng.choice(articles) for i in range(pages // 10)}
    templates = [f"Infobox {w}" for w in WORDS[:4]]
    categories = [f"Topic {i}" for i in range(CATEGORIES)]
    out = Expected(redirects=len(redirects))
    for source, target in sorted(redirects.items()):
        out.aliases.setdefault(f"Main/{target}", []).append(source)
    texts: list[tuple[int, str, str, str | None]] = []
    for title in articles:
        cid = f"Main/{title}"
        parts: list[str] = [f"'''{title}''' is a {rng.choice(WORDS)} by the {rng.choice(WORDS)}."]
        links: dict[str, None] = {}
        for _ in range(8):
            form = rng.random()
            if form < 0.1:  # a redirect's title: the link goes to its target
                alias = rng.choice(list(redirects))
                parts.append(f"See [[{alias}]].")
                target_id = f"Main/{redirects[alias]}"
            elif form < 0.15:  # no such page: kept, an edge once it exists
                missing = f"Missing {rng.randrange(pages)}"
                parts.append(f"Compare [[{missing}]].")
                target_id = f"Main/{missing}"
            else:
                target = rng.choice(articles)
                written = rng.choice([
                    f"[[{target}]]", f"[[{target}|the {rng.choice(WORDS)}]]",
                    f"[[{target.replace(' ', '_')}]]", f"[[{target[0].lower()}{target[1:]}]]",
                    f"[[{target}#History|its history]]",
                    f"{{{{{rng.choice(templates)}|near=[[{target}]]|kind=x}}}}",
                ])  # fmt: skip
                parts.append(f"Near {written}.")
                target_id = f"Main/{target}"
            if target_id != cid:
                links.setdefault(target_id, None)
        tags = list(dict.fromkeys(rng.sample(categories, rng.randint(1, 3))))
        parts.append("[[File:Photo.jpg|thumb|A photo]]")
        parts += [f"[[Category:{tag}]]" for tag in tags]
        out.links[cid], out.tags[cid] = list(links), tags
        texts.append((0, title, "\n\n".join(parts), None))
    for name in templates:
        texts.append((10, f"Template:{name}", "{| class=infobox\n| {{{near}}}\n|}", None))
        out.links[f"Template/{name}"], out.tags[f"Template/{name}"] = [], []
    for name in categories:
        texts.append((14, f"Category:{name}", f"Pages about {name.lower()}.", None))
        out.links[f"Category/{name}"], out.tags[f"Category/{name}"] = [], []
    for source, target in sorted(redirects.items()):
        texts.append((0, source, f"#REDIRECT [[{target}]]", target))
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "wt", encoding="utf-8") as file:
        file.write(_HEAD)
        for page_id, (ns, title, text, redirect_to) in enumerate(texts, 1):
            redirect = f"    <redirect title={quoteattr(redirect_to)} />\n" if redirect_to else ""
            file.write(
                f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n"
                f"    <id>{page_id}</id>\n{redirect}    <revision>\n      <id>{page_id}</id>\n"
                "      <timestamp>2026-12-06T00:00:00Z</timestamp>\n"
                "      <contributor>\n        <username>Gen</username>\n        <id>1</id>\n"
                "      </contributor>\n      <model>wikitext</model>\n"
                "      <format>text/x-wiki</format>\n"
                f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text)}'
                "</text>\n      <sha1>0</sha1>\n    </revision>\n  </page>\n"
            )
        file.write("</mediawiki>\n")
    return out


_HEAD = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11"'
    ' xml:lang="en">\n  <siteinfo>\n    <sitename>Synthetic</sitename>\n'
    "    <dbname>synthetic</dbname>\n    <base>http://127.0.0.1/index.php/Main_Page</base>\n"
    "    <generator>kbgraph loadtest</generator>\n    <case>first-letter</case>\n"
    "    <namespaces>\n"
    + "".join(
        f'      <namespace key="{key}" case="first-letter">{name}</namespace>\n'
        if name
        else f'      <namespace key="{key}" case="first-letter" />\n'
        for key, name in NAMESPACES.items()
    )
    + "    </namespaces>\n  </siteinfo>\n"
)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_mediawiki_dump", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pages", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kbgraph-mwdump-") as folder:
        base = Path(folder)
        dump = base / "wiki.xml.bz2"
        expected = generate(dump, args.pages)
        print(f"dump: {args.pages} pages, {dump.stat().st_size:,} bytes (bz2)")
        start, cpu = time.perf_counter(), _cpu()
        read = read_dump(dump)
        read_s, read_cpu = time.perf_counter() - start, _cpu() - cpu
        print(f"read_dump: {read_s:.2f} s ({read_cpu:.2f} s CPU), {read.summary()}")
        sink = LocalSink(base / "kb.db")
        try:
            with Manifest(base / "manifest.sqlite") as manifest:
                start, cpu = time.perf_counter(), _cpu()
                sent = deliver(
                    "wiki", sink, manifest, read_dump(dump).concepts, source=SOURCE, everything=True
                )
                import_s, import_cpu = time.perf_counter() - start, _cpu() - cpu
                print(f"import: {import_s:.2f} s ({import_cpu:.2f} s CPU), {sent}")
                start = time.perf_counter()
                again = deliver(
                    "wiki", sink, manifest, read_dump(dump).concepts, source=SOURCE, everything=True
                )
                again_s = time.perf_counter() - start
                print(f"re-import, unchanged: {again_s:.2f} s, {again}")
        finally:
            sink.close()
    same = len(read.concepts) == len(expected.links) and again.upserted == 0
    figures = {
        "pages": args.pages,
        "concepts": len(read.concepts),
        "redirects": read.redirects,
        "links": read.links,
        "read_s": round(read_s, 2),
        "read_cpu_s": round(read_cpu, 2),
        "import_s": round(import_s, 2),
        "import_cpu_s": round(import_cpu, 2),
        "pages_per_s": round(args.pages / import_s, 1),
        "reimport_s": round(again_s, 2),
        "aims": AIMS,
        "met": {"pages_per_s": args.pages / import_s >= AIMS["pages_per_s"], "complete": same},
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

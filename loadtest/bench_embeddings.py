"""The local embeddings model's speed at ingest (issue 24): concepts embedded per second.

``python -m loadtest.bench_embeddings [--n 20000]`` embeds, as the projection does (title,
aliases, tags and text of each concept, in batches of ``--batch``), the generated seed KB's
concepts (Zipf texts of loadtest.kbgen) and the example vault's notes repeated to ``--n``;
prints concepts/s, tokens per concept and the vectors' bytes per concept. Two passes each:
``cold`` (a fresh model: every word seen for the first time is tokenized) and ``warm`` (the same
texts again: the pieces cached, as at ingest once a KB's vocabulary has been seen). Aim: >= 5,000
concepts/s on the generated KB, reported for both. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Final

from kbgraph.embeddings import concept_text
from kbgraph.embeddings.local import LocalEmbedder
from kbgraph.graphalgo.nearest import quantize
from kbgraph.sources.demokb import example_vault
from kbgraph.sources.vault.reader import read_vault
from loadtest import kbgen

AIM: Final = 5000.0


def rate(texts: list[str], batch: int) -> dict[str, float]:
    embedder = LocalEmbedder()
    embedder.embed(["compile the pooling kernel"])
    passes = []
    for _ in ("cold", "warm"):
        start = time.perf_counter()
        for i in range(0, len(texts), batch):
            embedder.embed(texts[i : i + batch])
        passes.append(time.perf_counter() - start)
    tokens = sum(len(embedder.whole_tokens(text)) for text in texts[:2000])
    return {
        "concepts": len(texts),
        "per_second": round(len(texts) / passes[0], 1),
        "warm_per_second": round(len(texts) / passes[1], 1),
        "tokens_per_concept": round(tokens / min(len(texts), 2000), 1),
        "chars_per_concept": round(sum(map(len, texts)) / len(texts), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_embeddings", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=2000, help="a projection batch's size")
    args = parser.parse_args(argv)
    generated = [
        concept_text(c["title"], [], c.get("tags", []), c["text"])
        for c in kbgen.make_kb("seed", args.n, 42)
    ]
    notes = [concept_text(n.data.title, n.data.aliases, n.data.tags, n.data.text)
             for n in read_vault(example_vault()).notes.values()]  # fmt: skip
    vault = (notes * (args.n // len(notes) + 1))[: args.n]
    figures: dict[str, Any] = {"generated_kb": rate(generated, args.batch)}
    figures["example_vault"] = rate(vault, args.batch)
    q8, scale, codes = quantize(LocalEmbedder().embed(generated[:10]))
    figures["bytes_per_concept"] = int((q8.nbytes + scale.nbytes + codes.nbytes) // 10)
    for name in ("generated_kb", "example_vault"):
        f = figures[name]
        size = f"{f['tokens_per_concept']:>6} tokens, {f['chars_per_concept']:>7} chars a concept"
        rates = f"{f['per_second']:>8,.0f} cold, {f['warm_per_second']:>8,.0f} warm concepts/s"
        print(f"{name:14} {rates}  {size}")
    cold, warm = figures["generated_kb"]["per_second"], figures["generated_kb"]["warm_per_second"]
    figures["aims"] = {
        "local_embed_per_second_cold": {"value": cold, "aim": AIM, "met": cold >= AIM},
        "local_embed_per_second_warm": {"value": warm, "aim": AIM, "met": warm >= AIM},
    }
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What carrying an upsert's text analysis in the stream would save and cost (issue 35, item 3).

``python -m loadtest.bench_analysis [--events 10000] [--rounds 3]``: ``bench_ingest``'s
concepts (a title, 40 words, 4 links, a tag), each analysed as the store's analyser thread
does (``kbgraph.search.document.encode``: what a node computes once per event today), decoded
as the follower does, and the sizes of the analysis and of the event as the log encodes them
(what a stream message would grow by, and what it holds today). CPU time of this thread, the
best of ``--rounds``; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

from kbgraph.events import ConceptUpserted, encode_for_log
from kbgraph.http.binding import decode_events
from kbgraph.search import document
from loadtest.bench_ingest import SECRET, Concepts
from tests import webhook_client as wc


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_analysis")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    concepts = Concepts("a", 1)
    body, headers = wc.delivery(SECRET, [concepts.next() for _ in range(args.events)])
    events = [e for e in decode_events(body, headers) if isinstance(e, ConceptUpserted)]
    analyse = decode = float("inf")
    blobs: list[bytes] = []
    for _ in range(args.rounds):
        start = time.thread_time()
        blobs = [
            document.encode(e.data.title, e.data.text, e.data.aliases, e.data.tags) for e in events
        ]
        analyse = min(analyse, time.thread_time() - start)
        start = time.thread_time()
        for blob in blobs:
            document.decode(blob)
        decode = min(decode, time.thread_time() - start)
    count = len(events)
    event_bytes = sum(len(encode_for_log(e)) for e in events) / count
    analysis_bytes = sum(map(len, blobs)) / count
    print(
        json.dumps(
            {
                "events": count,
                "analyse_us_per_event": round(analyse / count * 1e6, 1),
                "decode_us_per_event": round(decode / count * 1e6, 1),
                "event_bytes": round(event_bytes),
                "analysis_bytes": round(analysis_bytes),
                "message_growth": round(analysis_bytes / event_bytes, 2),
            }
        )
    )


if __name__ == "__main__":
    main()

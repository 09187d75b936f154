"""The text an LLM reads of a tool's answer (MCP's ``content`` beside the structured body):
compact and numbered, only what the body holds. Each tool's spec names its renderer
(``kbgraph.agent.toolspecs``); a renderer takes the body as JSON values (``UNSET`` left out).
"""

from __future__ import annotations

from typing import Any, Final

TEXT_LIMIT: Final = 1500  # characters of a concept's text in the rendering (all in structured)


def named(title: str, concept_id: str) -> str:
    return f"{title} [{concept_id}]" if title and title != concept_id else f"[{concept_id}]"


def render_context(body: dict[str, Any]) -> list[str]:
    asked = []
    if "query" in body:
        asked.append(f"query {body['query']!r}")
    if "ids" in body:
        asked.append("ids " + ", ".join(body["ids"]))
    lines = [f"graph_context for {' and '.join(asked)}: {len(body['seeds'])} seeds, "
             f"{body['count']} results"]  # fmt: skip
    if body.get("mode") == "lexical":
        lines.append("seeds by words alone")
    if "note" in body:
        lines.append(body["note"])
    titles = {row["id"]: row["title"] for row in body["seeds"] + body["results"]}
    titles |= {row["id"]: row["title"] for row in body["ranked"]}
    vias = {row["id"]: row["via"] for row in body["results"]}
    vias |= {row["id"]: row["via"] for row in body["ranked"] if "via" in row}
    seeds = {row["id"] for row in body["seeds"]}
    if body["ranked"]:
        lines.append(
            "Ranked (best first; seeds are the best matches, the rest found by links or by"
            " mentions, a text naming another concept):"
        )
    for i, row in enumerate(body["ranked"], 1):
        if row["hops"] == 0:
            how = "seed"
        else:
            chain = [row["via"]]  # back towards a seed through the answer's own via links
            while chain[-1] in vias and len(chain) < row["hops"]:
                chain.append(vias[chain[-1]])
            names = [named(titles.get(c, ""), c) for c in chain]
            if chain[-1] not in seeds:
                names.append("…")
            hops = "1 hop" if row["hops"] == 1 else f"{row['hops']} hops"
            how = f"{hops} by {row.get('by', 'link')}, via {' ← '.join(names)}"
        lines.append(f"{i}. {named(row['title'], row['id'])} score {row['score']:g}, {how}")
        if row["snippet"]:
            lines.append(f"   {row['snippet']}")
    return lines


def render_suggest(body: dict[str, Any]) -> list[str]:
    lines = [f"link_suggest for [{body['id']}]: {body['count']} candidates"]
    for i, row in enumerate(body["candidates"], 1):
        evidence = f"common neighbours: {', '.join(row['common'])}" if row["common"] else ""
        lines.append(f"{i}. {named(row['title'], row['id'])} score {row['score']:g}"
                     + (f", {evidence}" if evidence else ""))  # fmt: skip
        if row.get("mention"):
            lines.append(f"   mentioned: {row['mention']}")
    return lines


def render_path(body: dict[str, Any]) -> list[str]:
    head = f"graph_path [{body['source']}] → [{body['target']}]"
    if not body["path"]:
        return [f"{head}: {body.get('note', 'no path')}"]
    steps = " → ".join(named(step["title"], step["id"]) for step in body["path"])
    return [f"{head}: {body['hops']} hops", steps]


def render_search(body: dict[str, Any]) -> list[str]:
    lines = [f"search {body['query']!r} ({body['mode']}): {body['count']} hits"]
    for i, hit in enumerate(body["hits"], 1):
        lines.append(f"{i}. {named(hit['title'], hit['id'])} score {hit['score']:g}")
        if hit["snippet"]:
            lines.append(f"   {hit['snippet']}")
    return lines


def render_concept(body: dict[str, Any]) -> list[str]:
    facts = [f"{key} {body[key]}" for key in ("type", "status") if body[key]]
    if body["aliases"]:
        facts.append("also " + ", ".join(body["aliases"]))
    if body["tags"]:
        facts.append("tags " + ", ".join(body["tags"]))
    lines = [named(body["title"], body["id"]) + (f" ({'; '.join(facts)})" if facts else "")]
    lines.append("links: " + (", ".join(body["links"]) or "none"))
    lines.append("backlinks: " + (", ".join(body["backlinks"]) or "none"))
    text = body["text"]
    if len(text) > TEXT_LIMIT:
        cut = len(text) - TEXT_LIMIT
        text = f"{text[:TEXT_LIMIT]}… ({cut} more characters in the structured content)"
    if text:
        lines += ["", text]
    return lines

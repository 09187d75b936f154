"""The 2Wiki harness's own rules: titles made concept ids, the linked reference vault, the
committed data as its README says, and recall@k."""

from __future__ import annotations

from pathlib import Path

from kbgraph.names import concept_id_problem
from kbgraph.sources.vault.reader import read_vault
from loadtest.eval_2wiki import (
    Passage,
    linked_vault,
    load_corpus,
    load_questions,
    passage_ids,
    recall,
)


def test_titles_become_valid_unique_ids() -> None:
    titles = ["Alice (film)", "AC/DC", "a//b", "/lead/", "tab\there", "bidi\u202e", "ab", "a/b", ""]
    ids = passage_ids(titles)
    assert ids["Alice (film)"] == "Alice (film)" and ids["AC/DC"] == "AC/DC"
    assert ids["a//b"] == "a/b" and ids["/lead/"] == "lead"
    assert ids["tab\there"] == "tabhere" and ids["bidi\u202e"] == "bidi"
    assert ids["a/b"] == "passage-7"  # taken by "a//b" made valid
    assert ids[""] == "passage-8"
    assert all(concept_id_problem(cid) is None for cid in ids.values())
    assert len(set(ids.values())) == len(titles)


def test_the_linked_vault_links_names_without_their_parenthetical(tmp_path: Path) -> None:
    passages = [
        Passage("Alice (film)", "Alice is a film by Mel Stuart, not Alice Springs."),
        Passage("Alice (novel)", "A novel."),
        Passage("Mel Stuart", "Mel Stuart directed Alice. Melbourne is elsewhere."),
        Passage(".hack", "A game; AA is too short a name to link."),
        Passage("AA", "Named AA."),
    ]
    titles = linked_vault(passages, tmp_path)
    assert titles == {"Alice (film)": "Alice (film)", "Alice (novel)": "Alice (novel)",
                      "Mel Stuart": "Mel Stuart", "_hack": ".hack", "AA": "AA"}  # fmt: skip
    notes = read_vault(tmp_path).notes
    links = {nid: sorted(note.data.links) for nid, note in notes.items()}
    # a passage names another's title without its parenthetical; all of a shared name
    assert links["Alice (film)"] == ["Alice (novel)", "Mel Stuart"]  # not itself
    assert links["Mel Stuart"] == ["Alice (film)", "Alice (novel)"]  # not "Melbourne"
    assert links["_hack"] == [] and links["AA"] == []
    assert notes["_hack"].data.title == ".hack"


def test_the_committed_data_is_as_its_readme_says() -> None:
    passages = load_corpus()
    questions = load_questions()
    titles = {p.title for p in passages}
    assert len(passages) == len(titles) == 6119
    assert len(questions) == 500 and len({q.id for q in questions}) == 500
    assert [q.half for q in questions] == ["tune"] * 250 + ["held-out"] * 250
    assert all(len(q.support) in (2, 4) and set(q.support) <= titles for q in questions)
    assert all(concept_id_problem(cid) is None for cid in passage_ids(sorted(titles)).values())


def test_recall_is_the_share_of_the_support_in_the_first_k() -> None:
    assert recall(["a", "x", "b"], {"a", "b"}, 2) == 0.5
    assert recall(["a", "x", "b"], {"a", "b"}, 5) == 1.0
    assert recall([], {"a", "b", "c", "d"}, 5) == 0.0

"""Who may see what (docs/api.md, tokens and visibility): a token is admin or carries rules
``{kb, collections?, types?}``.

A concept is visible when some rule for its KB matches it: ``collections`` empty or holding the
concept's collection, and ``types`` empty or holding its type. A ``RuleSet`` is the canonical,
hashable form of one token's rules for one KB; ``None`` stands for admin (everything visible).
"""

from __future__ import annotations

from typing import NamedTuple


class Rule(NamedTuple):
    collections: frozenset[str]
    types: frozenset[str]

    def matches(self, collection: str, concept_type: str) -> bool:
        return (not self.collections or collection in self.collections) and (
            not self.types or concept_type in self.types
        )


RuleSet = tuple[Rule, ...]


def canonical(rules: list[Rule]) -> RuleSet:
    """One order for the same rules, so equal rule sets share one cached visibility mask."""
    unique = {(tuple(sorted(r.collections)), tuple(sorted(r.types))): r for r in rules}
    return tuple(unique[key] for key in sorted(unique))


def visible(rules: RuleSet | None, collection: str, concept_type: str) -> bool:
    return rules is None or any(rule.matches(collection, concept_type) for rule in rules)

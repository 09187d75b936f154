"""What reading a wiki may cost at most: the defaults of the bounds the CLI's flags set, kept
apart from the modules that enforce them so the CLI names them without importing those
(docs/mediawiki.md, "Bounds before parsing" and "A wiki's answers are not trusted")."""

from __future__ import annotations

from typing import Final

CALL_SECONDS: Final = 60.0  # one request to a wiki, from connecting to its answer's last byte
MAX_PAGE_BYTES: Final = 2 << 20  # MediaWiki's own default maximum ($wgMaxArticleSize)
MAX_DUMP_BYTES: Final = 1 << 30  # the import holds every page: a bound a machine can hold

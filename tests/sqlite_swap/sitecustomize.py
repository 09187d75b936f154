"""Tests only: run this Python process, and every process it starts, on another SQLite.

``scripts/test.sh`` puts this folder on PYTHONPATH and names, in ``KBGRAPH_TEST_SQLITE``, a
folder holding a ``sqlean.py`` build from PyPI (``pip install --target``): that package is a
drop-in ``sqlite3`` module with its own SQLite, so ``import sqlite3`` anywhere (the product
included) gets it. Nothing in kbgraph knows about it. Unset: the machine's own SQLite.
"""

from __future__ import annotations

import os
import sys

_folder = os.environ.get("KBGRAPH_TEST_SQLITE")
if _folder:
    sys.path.insert(0, _folder)
    import sqlean
    import sqlean.dbapi2

    sys.modules["sqlite3"] = sqlean
    sys.modules["sqlite3.dbapi2"] = sqlean.dbapi2

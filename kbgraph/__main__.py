"""``python -m kbgraph``: the same command line as the ``kbgraph`` script."""

import sys

from kbgraph.cli import main

sys.exit(main())

"""``python -m loadtest``: the load-test driver (see ``loadtest.driver``)."""

import sys

from loadtest.driver import main

sys.exit(main())

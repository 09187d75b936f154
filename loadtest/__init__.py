"""The load test and the benchmarks (see docs/performance.md).

``ROOT``: the checkout this package belongs to. A script whose own file also runs in a peer
checkout's child process (``--peer CHECKOUT``) does not import it at its top level: there
``loadtest`` is the peer's package.
"""

from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent

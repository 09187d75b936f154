"""The peak RSS of a command, measured from a small parent process (tests and benchmarks of
bounded memory compare it with a benign run's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # not tests.support's: loadtest imports this module


# A small parent runs the command and reports its child's peak RSS: a child forked from the
# test process itself would count the test process's own pages (ru_maxrss survives exec).
_MEASURE = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(f'PEAK_KB={peak}')\n"
    "sys.exit(code)\n"
)


def peak_rss_of(command: list[str], timeout: float) -> tuple[int, int, str]:
    """(exit code, peak RSS in bytes, stdout+stderr) of ``command`` run to its end (within
    ``timeout`` seconds)."""
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, *command], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    peak = int(output.rsplit("PEAK_KB=", 1)[1].split()[0]) * 1024
    return proc.returncode, peak, output

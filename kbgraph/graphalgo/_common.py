"""Shared plumbing: array coercion for the kernels and per-thread reusable scratch arrays."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from kbgraph.graphalgo.graph import View

T = TypeVar("T")

_I64 = np.int64
_I32 = np.int32
_U8 = np.uint8


def und_arrays(view: View) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(und_off, und_len, und, mask, deg)`` as the exact dtypes the kernels were warmed with.

    ``np.ascontiguousarray`` returns the array itself when it already fits, so this is free for
    a well-formed projection and saves a request-time compile for one that is not.
    """
    g = view.graph
    return (
        np.ascontiguousarray(g.und_off, _I64),
        np.ascontiguousarray(g.und_len, _I32),
        np.ascontiguousarray(g.und, _I32),
        np.ascontiguousarray(view.mask, _U8),
        np.ascontiguousarray(view.deg, _I32),
    )


def out_arrays(view: View) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(out_off, out_len, out, mask)`` with the kernels' dtypes."""
    g = view.graph
    return (
        np.ascontiguousarray(g.out_off, _I64),
        np.ascontiguousarray(g.out_len, _I32),
        np.ascontiguousarray(g.out, _I32),
        np.ascontiguousarray(view.mask, _U8),
    )


class Scratch:
    """Arrays of size ``cap`` >= n in a fixed resting state that every kernel restores.

    ``f0`` float64 zeros, ``f1`` float64 zeros, ``b0`` / ``b1`` uint8 zeros, ``c0`` int32 zeros,
    ``dist`` int32 all -1; ``q0`` / ``q1`` int32 free (any content).
    """

    __slots__ = ("b0", "b1", "c0", "cap", "dist", "f0", "f1", "q0", "q1")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.f0 = np.zeros(cap, np.float64)
        self.f1 = np.zeros(cap, np.float64)
        self.b0 = np.zeros(cap, np.uint8)
        self.b1 = np.zeros(cap, np.uint8)
        self.c0 = np.zeros(cap, np.int32)
        self.dist = np.full(cap, -1, np.int32)
        self.q0 = np.empty(cap, np.int32)
        self.q1 = np.empty(cap, np.int32)


_local = threading.local()


def thread_scratch() -> Scratch | None:
    """This thread's scratch, if it has one (at rest between calls: the tests check)."""
    scratch: Scratch | None = getattr(_local, "scratch", None)
    return scratch


def with_scratch(n: int, fn: Callable[[Scratch], T]) -> T:
    """Run ``fn`` with this thread's scratch (grown to hold ``n`` nodes).

    Should ``fn`` fail midway, the scratch may be dirty: it is dropped, never reused.
    """
    s: Scratch | None = getattr(_local, "scratch", None)
    if s is None or s.cap < n:
        s = Scratch(max(16, n + (n >> 3)))
        _local.scratch = s
    try:
        return fn(s)
    except BaseException:
        _local.scratch = None
        raise

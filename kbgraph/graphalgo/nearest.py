"""Exact-scope vector search: sign codes scanned over the visible rows, then an int8 re-rank.

Storage per concept (dimension d): ``q8`` int8[d] (the unit vector times 127 / its largest
component, rounded), ``scale`` float32 (1 / that factor), and ``codes`` uint64[2]: 128 sign
bits, bit i the sign of the sum of the components i, i + 128, i + 256, ... (a random-hyperplane
hash with sparse planes, folded to 128 bits so that the scan reads 16 bytes a row). At d = 256
that is 256 + 4 + 16 = 276 bytes a concept, 276 MB at a million.

``nearest`` scans the codes of exactly the rows whose ``mask`` byte is set (the caller passes
the visible concepts that have a vector), keeps the ``shortlist`` rows with the smallest
Hamming distance to the query's code (and every row tied with the farthest of them: a cut by
row would depend on interning order, which a hidden concept moves by linking to a visible one
before it is written), re-ranks those by the int8 dot product with
the query (in 16 bits: integer sums, exact and alike on every CPU), and returns them best
first. A row outside the mask is never read, so no hidden vector can decide (or be pushed out
of) a visible answer; with at most ``shortlist`` rows in the mask the answer equals a full
scan of the dequantised vectors (the query's 16 bits aside).
"""

from __future__ import annotations

from typing import Final

import numba as nb
import numpy as np
from numba import types
from numba.extending import intrinsic

SHORTLIST: Final = 4096
CODE_BITS: Final = 128
NEGLIGIBLE: Final = 1e-30  # a row whose largest component is below this quantises as zero


def quantize(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q8, scale, codes) of float rows (n, d): see the module's docstring."""
    v = np.ascontiguousarray(vectors, np.float32)
    peak = np.abs(v).max(axis=1)
    peak[peak < NEGLIGIBLE] = 1.0  # zero, or so small that 127 / peak would overflow float32
    q8 = np.rint(v * (127.0 / peak)[:, None]).astype(np.int8)
    scale = (peak / 127.0).astype(np.float32)
    return q8, scale, sign_codes(v)


def sign_codes(vectors: np.ndarray) -> np.ndarray:
    """The 128-bit codes of float rows (n, d) as uint64[n, 2] (see the module's docstring)."""
    v = np.asarray(vectors, np.float32)
    pad = -v.shape[1] % CODE_BITS
    if pad:
        v = np.concatenate((v, np.zeros((len(v), pad), np.float32)), axis=1)
    folded = v.reshape(len(v), -1, CODE_BITS).sum(axis=1)
    bits = np.packbits(folded > 0, axis=1, bitorder="little")
    return np.ascontiguousarray(bits).view(np.uint64)


@intrinsic
def _popcount(typingctx, x):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """LLVM's ctpop on a uint64: one POPCNT instruction where the CPU has it (half the scan's
    time against the bit-twiddling version, which LLVM does not recognise here)."""
    signature = types.uint64(types.uint64)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        fn = builder.module.declare_intrinsic("llvm.ctpop", [args[0].type])
        return builder.call(fn, args)

    return signature, codegen


@nb.njit(cache=True, nogil=True)
def _shortlist(  # pragma: no cover - compiled
    codes: np.ndarray, mask: np.ndarray, query: np.ndarray, shortlist: int
) -> np.ndarray:
    n = codes.shape[0]
    bits = 128
    q0, q1 = query[0], query[1]
    dist = np.empty(n, np.int16)
    hist = np.zeros(bits + 1, np.int64)
    for u in range(n):
        if mask[u]:
            # numba's stubs type an intrinsic's call as its typing function's (typingctx
            # first); compiled code passes the operand alone
            d = int(_popcount(codes[u, 0] ^ q0)) + int(_popcount(codes[u, 1] ^ q1))  # type: ignore[call-arg]
            dist[u] = d
            hist[d] += 1
        else:
            dist[u] = -1
    # The smallest distance t within which at least ``shortlist`` rows lie: every row at
    # most t away is kept, those tied at t included (taking some of them would take them by
    # row, and rows are interning order, which hidden concepts move).
    total = 0
    t = 0
    while t < bits and total + hist[t] < shortlist:
        total += hist[t]
        t += 1
    out = np.empty(total + hist[t], np.int64)
    k = 0
    for u in range(n):
        d = dist[u]
        if 0 <= d <= t:
            out[k] = u
            k += 1
    return out


@nb.njit(cache=True, nogil=True)
def _rerank(  # pragma: no cover - compiled
    q8: np.ndarray, scale: np.ndarray, rows: np.ndarray, query: np.ndarray, query_scale: float
) -> np.ndarray:
    """Integer dot products (exact, vectorised, the same on every CPU), then scaled."""
    out = np.empty(len(rows), np.float64)
    d = q8.shape[1]
    narrow = d <= 512  # |sum| <= 512 * 127 * 32767 < 2**31: 32-bit sums vectorise wider
    for i in range(len(rows)):
        u = rows[i]
        if narrow:
            acc32 = np.int32(0)
            for j in range(d):
                acc32 += np.int32(q8[u, j]) * np.int32(query[j])
            acc = np.int64(acc32)
        else:
            acc = np.int64(0)
            for j in range(d):
                acc += np.int64(q8[u, j]) * np.int64(query[j])
        out[i] = acc * np.float64(scale[u]) * query_scale
    return out


def nearest(
    q8: np.ndarray,
    scale: np.ndarray,
    codes: np.ndarray,
    mask: np.ndarray,
    query: np.ndarray,
    shortlist: int = SHORTLIST,
    limit: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cosine scores) of the shortlist's rows, by score descending then row; with a
    ``limit``, only those scoring at least the limit-th best (ties kept).

    ``mask`` uint8[n] selects the rows scanned (n = len(mask) <= len(codes)); ``query`` is a
    unit float vector. Callers break ties by id, not by row (rows are interning order).
    """
    n = len(mask)
    q = np.ascontiguousarray(query, np.float32)
    rows = _shortlist(codes[:n], mask, sign_codes(q[None, :])[0], shortlist)
    peak = float(np.abs(q).max()) or 1.0
    q16 = np.rint(q * (32767.0 / peak)).astype(np.int16)  # the query in 16 bits
    scores = _rerank(q8, scale, rows, q16, peak / 32767.0)
    if 0 < limit < len(rows):
        keep = scores >= np.partition(scores, len(scores) - limit)[len(scores) - limit]
        rows, scores = rows[keep], scores[keep]
    order = np.lexsort((rows, -scores))
    return rows[order], scores[order]


def warm_up() -> None:
    """Compile the kernels once (a request never compiles)."""
    v = np.ones((2, 64), np.float32) / 8.0
    q8, scale, codes = quantize(v)
    nearest(q8, scale, codes, np.ones(2, np.uint8), v[0])

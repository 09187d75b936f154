"""Numba kernels over the flat adjacency arrays of a ``Graph`` seen through a ``View`` mask.

Every kernel is compiled ``nogil`` (readers run in worker threads at once) and cached on disk.
Kernels never allocate O(n): they work in caller-provided scratch arrays of size >= n whose
resting state is fixed (zeros, or -1 for ``dist``) and restore exactly the entries they touched
before returning, so a call costs O(nodes touched).

Loops run in block order, and every block is sorted by concept id, so the sequence of floating
point operations, hence every result bit, is the same whichever ints the ids were interned as.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def ppr_push(
    und_off: np.ndarray,
    und_len: np.ndarray,
    und: np.ndarray,
    mask: np.ndarray,
    deg: np.ndarray,
    seeds: np.ndarray,
    weights: np.ndarray,
    alpha: float,
    eps: float,
    r: np.ndarray,
    p: np.ndarray,
    inq: np.ndarray,
    seen: np.ndarray,
    queue: np.ndarray,
    touched: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Forward push (FIFO). ``seeds`` distinct and in ascending id order, ``weights`` sum 1.

    Scratch (resting state): ``r``, ``p`` float64 zeros; ``inq``, ``seen`` uint8 zeros;
    ``queue`` (ring buffer) and ``touched`` int32, any content, capacity >= n.
    Returns ``(nodes, p)`` for every node with p > 0, in first-touch order.
    """
    cap = queue.shape[0]
    nt = 0
    for i in range(seeds.shape[0]):
        s = seeds[i]
        r[s] += weights[i]
        if seen[s] == 0:
            seen[s] = 1
            touched[nt] = s
            nt += 1
    head = 0
    tail = 0
    qn = 0
    for i in range(seeds.shape[0]):
        s = seeds[i]
        if inq[s] == 0 and r[s] >= eps * deg[s]:
            inq[s] = 1
            queue[tail] = s
            tail += 1
            if tail == cap:
                tail = 0
            qn += 1
    keep = 1.0 - alpha
    while qn > 0:
        u = queue[head]
        head += 1
        if head == cap:
            head = 0
        qn -= 1
        inq[u] = 0
        ru = r[u]
        r[u] = 0.0
        d = deg[u]
        if d == 0:  # isolated: the walk stays, the node keeps its whole residual
            p[u] += ru
            continue
        p[u] += alpha * ru
        share = keep * ru / d
        start = und_off[u]
        for j in range(start, start + und_len[u]):
            v = und[j]
            if mask[v] == 0:
                continue
            r[v] += share
            if seen[v] == 0:
                seen[v] = 1
                touched[nt] = v
                nt += 1
            if inq[v] == 0 and r[v] >= eps * deg[v]:
                inq[v] = 1
                queue[tail] = v
                tail += 1
                if tail == cap:
                    tail = 0
                qn += 1
    k = 0
    for i in range(nt):
        if p[touched[i]] > 0.0:
            k += 1
    out_nodes = np.empty(k, np.int32)
    out_p = np.empty(k, np.float64)
    k = 0
    for i in range(nt):
        u = touched[i]
        if p[u] > 0.0:
            out_nodes[k] = u
            out_p[k] = p[u]
            k += 1
        p[u] = 0.0
        r[u] = 0.0
        seen[u] = 0
    return out_nodes, out_p


@njit(cache=True, nogil=True)
def bfs_targets(
    und_off: np.ndarray,
    und_len: np.ndarray,
    und: np.ndarray,
    mask: np.ndarray,
    seeds: np.ndarray,
    targets: np.ndarray,
    dist: np.ndarray,
    parent: np.ndarray,
    queue: np.ndarray,
    tflag: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-source BFS from ``seeds`` (ascending id order), stopping once every target is found.

    Parent is assigned at first discovery: with id-sorted blocks the parent chain is the
    lexicographically smallest shortest path from the seed set. Scratch: ``dist`` int32 all -1,
    ``tflag`` uint8 zeros, ``parent``/``queue`` int32 any content. Returns ``(hops, via)``.
    """
    remaining = 0
    for i in range(targets.shape[0]):
        t = targets[i]
        if mask[t] != 0 and tflag[t] == 0:
            tflag[t] = 1
            remaining += 1
    tail = 0
    for i in range(seeds.shape[0]):
        s = seeds[i]
        if mask[s] != 0 and dist[s] == -1:
            dist[s] = 0
            parent[s] = -1
            queue[tail] = s
            tail += 1
            if tflag[s] != 0:
                remaining -= 1
    head = 0
    while head < tail and remaining > 0:
        u = queue[head]
        head += 1
        du = dist[u] + 1
        start = und_off[u]
        for j in range(start, start + und_len[u]):
            v = und[j]
            if mask[v] == 0 or dist[v] != -1:
                continue
            dist[v] = du
            parent[v] = u
            queue[tail] = v
            tail += 1
            if tflag[v] != 0:
                remaining -= 1
                if remaining == 0:
                    break
    m = targets.shape[0]
    hops = np.full(m, -1, np.int32)
    via = np.full(m, -1, np.int32)
    for i in range(m):
        t = targets[i]
        if mask[t] != 0 and dist[t] >= 0:
            hops[i] = dist[t]
            via[i] = parent[t]
    for i in range(tail):
        dist[queue[i]] = -1
    for i in range(m):
        tflag[targets[i]] = 0
    return hops, via


@njit(cache=True, nogil=True)
def bfs_path(
    off: np.ndarray,
    length: np.ndarray,
    blk: np.ndarray,
    mask: np.ndarray,
    source: int,
    target: int,
    max_hops: int,
    dist: np.ndarray,
    parent: np.ndarray,
    queue: np.ndarray,
) -> np.ndarray:
    """Lexicographically smallest shortest path ``source`` .. ``target`` within ``max_hops``.

    Works on any id-sorted adjacency (undirected or out-links). Stops when the target is
    discovered or the frontier reaches ``max_hops``. Returns the path (empty when none).
    Scratch as in ``bfs_targets``.
    """
    if mask[source] == 0 or mask[target] == 0:
        return np.empty(0, np.int32)
    if source == target:
        res = np.empty(1, np.int32)
        res[0] = source
        return res
    dist[source] = 0
    parent[source] = -1
    queue[0] = source
    tail = 1
    head = 0
    found = False
    while head < tail and not found:
        u = queue[head]
        head += 1
        du = dist[u]
        if du >= max_hops:
            break
        start = off[u]
        for j in range(start, start + length[u]):
            v = blk[j]
            if mask[v] == 0 or dist[v] != -1:
                continue
            dist[v] = du + 1
            parent[v] = u
            queue[tail] = v
            tail += 1
            if v == target:
                found = True
                break
    if found:
        h = dist[target]
        res = np.empty(h + 1, np.int32)
        v = target
        for i in range(h, -1, -1):
            res[i] = v
            v = parent[v]
    else:
        res = np.empty(0, np.int32)
    for i in range(tail):
        dist[queue[i]] = -1
    return res


@njit(cache=True, nogil=True)
def ra_scores(
    und_off: np.ndarray,
    und_len: np.ndarray,
    und: np.ndarray,
    mask: np.ndarray,
    deg: np.ndarray,
    x: int,
    min_common: int,
    score: np.ndarray,
    cnt: np.ndarray,
    adj: np.ndarray,
    touched: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Resource allocation scores of every candidate of ``x``, ranked by score descending.

    Scores add ``1/deg(z)`` over the common neighbours z in block (= id) order. Ties keep
    first-touch order (stable sort); the caller breaks them by id. Scratch: ``score`` float64
    zeros, ``cnt`` int32 zeros, ``adj`` uint8 zeros, ``touched`` int32 any content.
    """
    sx = und_off[x]
    ex = sx + und_len[x]
    for j in range(sx, ex):
        adj[und[j]] = 1
    adj[x] = 1
    nt = 0
    for j in range(sx, ex):
        z = und[j]
        if mask[z] == 0:
            continue
        w = 1.0 / deg[z]
        start = und_off[z]
        for k in range(start, start + und_len[z]):
            v = und[k]
            if mask[v] == 0 or adj[v] != 0:
                continue
            if cnt[v] == 0:
                touched[nt] = v
                nt += 1
            cnt[v] += 1
            score[v] += w
    m = 0
    for i in range(nt):
        if cnt[touched[i]] >= min_common:
            m += 1
    cands = np.empty(m, np.int32)
    scores = np.empty(m, np.float64)
    m = 0
    for i in range(nt):
        v = touched[i]
        if cnt[v] >= min_common:
            cands[m] = v
            scores[m] = score[v]
            m += 1
        cnt[v] = 0
        score[v] = 0.0
    for j in range(sx, ex):
        adj[und[j]] = 0
    adj[x] = 0
    order = np.argsort(-scores, kind="mergesort")
    return cands[order], scores[order]


@njit(cache=True, nogil=True)
def ra_common(
    und_off: np.ndarray,
    und_len: np.ndarray,
    und: np.ndarray,
    mask: np.ndarray,
    x: int,
    cands: np.ndarray,
    k: int,
    adj: np.ndarray,
) -> np.ndarray:
    """The (at most) ``k`` smallest-id visible common neighbours of ``x`` and each candidate.

    Row i of the result holds them in ascending id order, padded with -1. Scratch: ``adj``
    uint8 zeros.
    """
    sx = und_off[x]
    ex = sx + und_len[x]
    for j in range(sx, ex):
        adj[und[j]] = 1
    res = np.full((cands.shape[0], k), -1, np.int32)
    for i in range(cands.shape[0]):
        v = cands[i]
        c = 0
        start = und_off[v]
        for j in range(start, start + und_len[v]):
            z = und[j]
            if adj[z] != 0 and mask[z] != 0:
                res[i, c] = z
                c += 1
                if c == k:
                    break
    for j in range(sx, ex):
        adj[und[j]] = 0
    return res


@njit(cache=True, nogil=True)
def bidir_path(
    off: np.ndarray,
    length: np.ndarray,
    blk: np.ndarray,
    mask: np.ndarray,
    source: int,
    target: int,
    max_hops: int,
    ds: np.ndarray,
    dt1: np.ndarray,
    qs: np.ndarray,
    qt: np.ndarray,
    good: np.ndarray,
) -> np.ndarray:
    """``bfs_path`` for a symmetric adjacency, by bidirectional BFS (same result, fewer nodes).

    Phase 1 expands, layer by layer, whichever frontier is smaller, until a node is labelled
    from both sides: then the distance is ``D = a + b`` (``a``, ``b`` the complete layers on
    each side) and every node with ``ds = a, dt = b`` is on a shortest path. Phase 2 marks the
    nodes on shortest paths (``good``) back from that meeting layer on both sides, and phase 3
    walks from the source taking, at each step, the first neighbour in block (= id) order that
    is good at the next position: the lexicographically smallest shortest path.
    Scratch: ``ds`` int32 all -1, ``dt1`` int32 zeros (``dt + 1``), ``good`` uint8 zeros,
    ``qs``/``qt`` int32 any content.
    """
    if mask[source] == 0 or mask[target] == 0:
        return np.empty(0, np.int32)
    if source == target:
        res = np.empty(1, np.int32)
        res[0] = source
        return res
    s_start = np.empty(max_hops + 2, np.int64)
    t_start = np.empty(max_hops + 2, np.int64)
    ds[source] = 0
    qs[0] = source
    s_start[0] = 0
    s_start[1] = 1
    dt1[target] = 1
    qt[0] = target
    t_start[0] = 0
    t_start[1] = 1
    a = 0
    b = 0
    met = False
    while not met and a + b < max_hops:
        s_lo = s_start[a]
        s_hi = s_start[a + 1]
        t_lo = t_start[b]
        t_hi = t_start[b + 1]
        if s_lo == s_hi or t_lo == t_hi:
            break
        if s_hi - s_lo <= t_hi - t_lo:
            tail = s_hi
            for i in range(s_lo, s_hi):
                u = qs[i]
                start = off[u]
                for j in range(start, start + length[u]):
                    v = blk[j]
                    if mask[v] == 0 or ds[v] != -1:
                        continue
                    ds[v] = a + 1
                    qs[tail] = v
                    tail += 1
                    if dt1[v] != 0:
                        met = True
            a += 1
            s_start[a + 1] = tail
        else:
            tail = t_hi
            for i in range(t_lo, t_hi):
                u = qt[i]
                start = off[u]
                for j in range(start, start + length[u]):
                    v = blk[j]
                    if mask[v] == 0 or dt1[v] != 0:
                        continue
                    dt1[v] = b + 2
                    qt[tail] = v
                    tail += 1
                    if ds[v] != -1:
                        met = True
            b += 1
            t_start[b + 1] = tail
    s_end = s_start[a + 1]
    t_end = t_start[b + 1]
    if met:
        d = a + b
        for i in range(s_start[a], s_end):  # the meeting layer: ds = a, dt = b
            w = qs[i]
            if dt1[w] == b + 1:
                good[w] = 1
        for layer in range(a, 0, -1):  # source side, back to the source
            for i in range(s_start[layer], s_start[layer + 1]):
                w = qs[i]
                if good[w] == 0:
                    continue
                start = off[w]
                for j in range(start, start + length[w]):
                    y = blk[j]
                    if mask[y] != 0 and ds[y] == layer - 1:
                        good[y] = 1
        for layer in range(b, 0, -1):  # target side, on to the target
            for i in range(t_start[layer], t_start[layer + 1]):
                w = qt[i]
                if good[w] == 0:
                    continue
                start = off[w]
                for j in range(start, start + length[w]):
                    y = blk[j]
                    if mask[y] != 0 and dt1[y] == layer:
                        good[y] = 1
        res = np.empty(d + 1, np.int32)
        res[0] = source
        cur = source
        for i in range(1, d + 1):
            start = off[cur]
            for j in range(start, start + length[cur]):
                v = blk[j]
                if mask[v] == 0 or good[v] == 0:
                    continue
                if (i <= a and ds[v] == i) or (i > a and dt1[v] == d - i + 1):
                    cur = v
                    break
            res[i] = cur
        for i in range(s_end):
            good[qs[i]] = 0
        for i in range(t_end):
            good[qt[i]] = 0
    else:
        res = np.empty(0, np.int32)
    for i in range(s_end):
        ds[qs[i]] = -1
    for i in range(t_end):
        dt1[qt[i]] = 0
    return res


@njit(cache=True, nogil=True)
def neighbour_sum(
    und_off: np.ndarray,
    und_len: np.ndarray,
    und: np.ndarray,
    mask: np.ndarray,
    deg: np.ndarray,
    src: np.ndarray,
    x: np.ndarray,
    targets: np.ndarray,
    gamma: float,
    pos: np.ndarray,
    slot: np.ndarray,
    out: np.ndarray,
) -> int:
    """``out[i] = sum of x[j] * (deg(src[j]) deg(targets[i])) ** -gamma`` over the visible
    sources src[j] (distinct, x[j] > 0) that are visible neighbours of targets[i]. The edges
    are found from whichever side has fewer adjacency entries to walk (the same edges either
    way: the adjacency is undirected), and each target's terms are added smallest first, so the
    bits depend on the terms alone, not on the order of the lists or the ints. A repeated target
    is filled at its first place only. Scratch: ``pos`` int32 all -1 and ``slot`` int32 zeros
    (both restored). Returns 0, or 1 (nothing done) when a node is out of range or a source is
    repeated."""
    n = mask.shape[0]
    m = targets.shape[0]
    for i in range(m):
        if targets[i] < 0 or targets[i] >= n:
            return 1
    for j in range(src.shape[0]):
        if src[j] < 0 or src[j] >= n:
            return 1
    for j in range(src.shape[0]):
        u = src[j]
        if slot[u] != 0:
            for k in range(j):
                slot[src[k]] = 0
            return 1
        slot[u] = j + 1
    for j in range(src.shape[0]):
        if mask[src[j]] == 0 or not x[j] > 0.0:
            slot[src[j]] = 0
    for i in range(m):
        v = targets[i]
        if mask[v] != 0 and pos[v] < 0:
            pos[v] = i
    walk_sources = 0
    walk_targets = 0
    for j in range(src.shape[0]):
        walk_sources += und_len[src[j]]
    for i in range(m):
        walk_targets += und_len[targets[i]]
    from_targets = walk_targets < walk_sources
    count = np.zeros(m + 1, np.int64)
    for phase in range(2):
        if phase == 1:
            for i in range(m):
                count[i + 1] += count[i]
            terms = np.empty(count[m], np.float64)
            fill = count[:m].copy()
        if from_targets:
            for i in range(m):
                v = targets[i]
                if pos[v] != i:
                    continue
                start = und_off[v]
                for k in range(start, start + und_len[v]):
                    u = und[k]
                    if mask[u] == 0 or slot[u] == 0:
                        continue
                    if phase == 0:
                        count[i + 1] += 1
                    else:
                        j = slot[u] - 1
                        terms[fill[i]] = x[j] * (float(deg[u]) * float(deg[v])) ** -gamma
                        fill[i] += 1
        else:
            for j in range(src.shape[0]):
                u = src[j]
                if slot[u] != j + 1:
                    continue
                start = und_off[u]
                for k in range(start, start + und_len[u]):
                    v = und[k]
                    if mask[v] == 0 or pos[v] < 0:
                        continue
                    if phase == 0:
                        count[pos[v] + 1] += 1
                    else:
                        terms[fill[pos[v]]] = x[j] * (float(deg[u]) * float(deg[v])) ** -gamma
                        fill[pos[v]] += 1
    for i in range(m):
        block = np.sort(terms[count[i] : count[i + 1]])
        total = 0.0
        for t in block:
            total += t
        out[i] = total
    for i in range(m):
        first = pos[targets[i]]
        if first >= 0 and first != i:  # a repeated target: its first place's sum
            out[i] = out[first]
    for i in range(m):
        pos[targets[i]] = -1
    for j in range(src.shape[0]):
        slot[src[j]] = 0
    return 0

"""Links between documents from the entries of one bucket range: exact groups, LSH candidates, image bands.

Every function here sees only the entries it is given (one bucket task's hash range) and emits
pairs of global ids; which pairs come out depends on the entries alone, never on how the corpus
was cut into partitions or bucket ranges, so any cut gives the same links.
"""

from __future__ import annotations

import numpy as np

from shardkit.duplicates.phash import close_in_runs

# A bucket with more members than this links each member to the bucket's first one instead of
# emitting all pairs: boilerplate shared by thousands of documents must not cost millions of pairs.
MAX_BUCKET_PAIRS = 64
EMPTY_PAIRS = np.empty((0, 2), np.int64)


def hash_order(h: np.ndarray, *then: np.ndarray, runs: bool = False) -> np.ndarray:
    """np.lexsort((*reversed(then), h)) — by hash, ties by then[0], then[1], … — ~3x faster: one
    sort by h, then the rare runs of equal h (the candidates) ordered by the rest. `runs`: h is a
    concatenation of sorted runs (one per partition), which a stable sort merges in near-linear time."""
    order = np.argsort(h, kind="stable" if runs else None)
    hs = h[order]
    tied = np.flatnonzero(hs[1:] == hs[:-1])
    if len(tied):
        at = np.unique(np.concatenate([tied, tied + 1]))
        sub = order[at]
        order[at] = sub[np.lexsort(tuple(t[sub] for t in reversed(then)) + (hs[at],))]
    return order


def run_starts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each run of equal values in a sorted array (structured arrays too)."""
    if not len(keys):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    return starts, np.diff(np.concatenate([starts, [len(keys)]]))


def _star(starts: np.ndarray, lens: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """(first, member) for every other member of each run (runs given by start and length)."""
    extra = lens - 1
    run = np.repeat(np.arange(len(starts)), extra)
    step = np.arange(int(extra.sum())) - np.repeat(np.cumsum(extra) - extra, extra) + 1
    return np.stack([ids[starts[run]], ids[starts[run] + step]], axis=1).astype(np.int64)


def exact_links(h: np.ndarray, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Pairs (first, other) within each group of equal 128-bit digests (h, x); first = smallest id."""
    order = hash_order(h, x, ids, runs=True)
    h, x, ids = h[order], x[order], ids[order]
    same = np.empty(len(h), bool)
    same[:1] = False
    same[1:] = (h[1:] == h[:-1]) & (x[1:] == x[:-1])
    starts = np.flatnonzero(~same)
    return _star(starts, np.diff(np.concatenate([starts, [len(h)]])), ids)


def band_candidates(h: np.ndarray, ids: np.ndarray, max_pairs: int = MAX_BUCKET_PAIRS) -> np.ndarray:
    """Unique pairs (i < j) of documents that share a band bucket.

    Every member of a bucket pairs with the bucket's first (smallest) id — a star is enough for
    connected components — and buckets of up to `max_pairs` members add all their other pairs, so
    that the threshold check can keep a link when the first member is the odd one out.
    """
    order = hash_order(h, ids, runs=True)
    h, ids = h[order], ids[order]
    starts, lens = run_starts(h)
    multi = lens > 1
    if not multi.any():
        return EMPTY_PAIRS
    out = [_star(starts[multi], lens[multi], ids)]
    for s, ln in zip(starts[multi & (lens > 2) & (lens <= max_pairs)].tolist(),
                     lens[multi & (lens > 2) & (lens <= max_pairs)].tolist()):
        i, j = np.triu_indices(ln, k=1)
        keep = i > 0  # pairs with the first member are already in the star
        out.append(np.stack([ids[s + i[keep]], ids[s + j[keep]]], axis=1))
    pairs = np.concatenate(out).astype(np.int64)
    return np.unique(np.sort(pairs, axis=1), axis=0)


def image_links(h: np.ndarray, hashes: np.ndarray, ids: np.ndarray, distance: int) -> np.ndarray:
    """Unique pairs (i < j) sharing a band value whose 64-bit hashes differ in at most `distance` bits."""
    order = hash_order(h, ids, runs=True)
    pairs = close_in_runs(h[order], hashes[order], ids[order], distance)
    return np.unique(np.sort(pairs, axis=1), axis=0) if len(pairs) else EMPTY_PAIRS


def jaccard_exact(sets_a: list[np.ndarray], sets_b: list[np.ndarray]) -> np.ndarray:
    """Exact Jaccard of paired shingle-hash sets (sorted unique uint32 arrays)."""
    out = np.empty(len(sets_a))
    for k, (a, b) in enumerate(zip(sets_a, sets_b)):
        inter = len(np.intersect1d(a, b, assume_unique=True))
        union = len(a) + len(b) - inter
        out[k] = inter / union if union else 1.0
    return out

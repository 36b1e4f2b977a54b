"""LSH banding over MinHash signatures: (b, r) choice, band keys, and candidate pairs."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

# Weights (false positive, false negative) handed to datasketch's parameter search. Candidates are
# checked against the threshold afterwards (signature estimate, or exact Jaccard with --verify),
# so an LSH false positive costs one cheap comparison while a false negative is a duplicate lost
# for good: weight misses 9:1. At t=0.8, 128 perms this gives 14 x 9 (found: 87% at J=0.8,
# 97.5% at 0.85) where the symmetric (0.5, 0.5) gives 9 x 13 (40% at 0.8, 69% at 0.85).
LSH_WEIGHTS = (0.1, 0.9)
# A bucket with more members than this links each member to the bucket's first one instead of
# emitting all pairs: boilerplate shared by thousands of documents must not cost millions of pairs.
MAX_BUCKET_PAIRS = 64


@lru_cache(maxsize=64)
def optimal_params(threshold: float, num_perm: int, weights: tuple[float, float] = LSH_WEIGHTS) -> tuple[int, int]:
    """(bands, rows) minimising datasketch's weighted false positive + false negative area."""
    from datasketch.lsh import _optimal_param

    return _optimal_param(threshold, num_perm, *weights)


def detection_probability(similarity, bands: int, rows: int):
    """Probability that a pair of this Jaccard similarity shares at least one band: 1-(1-s^r)^b."""
    return 1.0 - (1.0 - np.asarray(similarity, dtype=float) ** rows) ** bands


def detection_curve(bands: int, rows: int, points=(0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)) -> dict:
    """{similarity: detection probability} at a few points, for reports."""
    return {f"{s:.2f}": round(float(detection_probability(s, bands, rows)), 4) for s in points}


def band_keys(signatures: np.ndarray, bands: int, rows: int, subset: np.ndarray | None = None) -> np.ndarray:
    """(n_docs, bands) uint64 keys: band j's `rows` hash values mixed into one 64-bit number.

    `subset` (row indices) limits the keys to those rows without copying their signatures.
    """
    n, num_perm = signatures.shape if subset is None else (len(subset), signatures.shape[1])
    if bands * rows > num_perm:
        raise ValueError(f"bands x rows = {bands} x {rows} = {bands * rows} exceeds num_perm={num_perm}; "
                         "lower --bands/--rows or raise --num-perm")
    keys = np.empty((n, bands), np.uint64)
    k = np.uint64(0x9E3779B97F4A7C15)
    for band in range(bands):
        # Column by column: the temporaries stay one uint64 per document (1M docs: 8 MB, not 1 GB).
        acc = np.zeros(n, np.uint64)
        for col in range(band * rows, (band + 1) * rows):  # equal keys without equal values: ~2^-64
            column = signatures[:, col] if subset is None else signatures[subset, col]
            acc ^= column.astype(np.uint64)
            acc *= k
            acc ^= acc >> np.uint64(29)
        keys[:, band] = acc
    return keys


def _bucket_pairs(order: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i, j) of documents that share a key; `order` sorts `keys` stably."""
    sk = keys[order]
    same = np.flatnonzero(sk[1:] == sk[:-1]) + 1  # positions whose key equals the previous one
    if not len(same):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    # Each run of equal keys starts at `first`; every member pairs with the run's first member
    # (a star is enough for connected components), and small runs add all their other pairs so
    # that --verify can keep a link even when the first member is the odd one out.
    starts = np.flatnonzero(np.concatenate([[True], sk[1:] != sk[:-1]]))
    run_of = np.searchsorted(starts, same, side="right") - 1
    first = starts[run_of]
    left, right = [order[first]], [order[same]]
    run_len = np.diff(np.concatenate([starts, [len(sk)]]))
    small = (run_len > 2) & (run_len <= MAX_BUCKET_PAIRS)
    for s, ln in zip(starts[small], run_len[small]):
        i, j = np.triu_indices(int(ln), k=1)
        keep = i > 0  # pairs with the first member are already in the star
        left.append(order[s + i[keep]])
        right.append(order[s + j[keep]])
    return np.concatenate(left), np.concatenate(right)


def candidate_pairs(keys: np.ndarray) -> np.ndarray:
    """Unique (m, 2) int64 pairs (i < j) of rows that share at least one band key."""
    out = []
    for band in range(keys.shape[1]):
        col = keys[:, band]
        i, j = _bucket_pairs(np.argsort(col, kind="stable"), col)
        out.append(np.stack([np.minimum(i, j), np.maximum(i, j)], axis=1))
    if not out:
        return np.empty((0, 2), np.int64)
    pairs = np.concatenate(out).astype(np.int64)
    return np.unique(pairs, axis=0) if len(pairs) else pairs.reshape(0, 2)

"""From per-document hashes to duplicate clusters: exact groups first, then near links, union-find."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardkit.stages.dedup.lsh import band_keys, candidate_pairs
from shardkit.stages.dedup.minhash import estimate_jaccard
from shardkit.stages.dedup.unionfind import components


@dataclass
class Clusters:
    """Per document (rows sorted by key): the row it duplicates (itself when kept), why, how similar."""

    label: np.ndarray  # int64 row of the kept document of its cluster
    exact: np.ndarray  # bool: identical content to the kept document
    similarity: np.ndarray  # float64 similarity to the kept document (1.0 for exact and kept)
    stats: dict = field(default_factory=dict)

    @property
    def removed(self) -> np.ndarray:
        return np.flatnonzero(self.label != np.arange(len(self.label)))


def exact_groups(digests: np.ndarray, eligible: np.ndarray | None = None) -> np.ndarray:
    """Row of the first (smallest-key) document with the same digest; rows not eligible map to themselves."""
    n = len(digests)
    rep = np.arange(n, dtype=np.int64)
    rows = np.arange(n) if eligible is None else np.flatnonzero(eligible)
    if not len(rows):
        return rep
    _, first, inverse = np.unique(np.asarray(digests)[rows], return_index=True, return_inverse=True)
    rep[rows] = rows[first[inverse.ravel()]]
    return rep


def jaccard_exact(sets: list[np.ndarray], pairs: np.ndarray) -> np.ndarray:
    """Exact Jaccard of the shingle-hash sets of each pair (sorted unique uint32 arrays)."""
    out = np.empty(len(pairs))
    for k, (i, j) in enumerate(pairs.tolist()):
        a, b = sets[i], sets[j]
        inter = len(np.intersect1d(a, b, assume_unique=True))
        union = len(a) + len(b) - inter
        out[k] = inter / union if union else 1.0
    return out


def _finish(n: int, rep: np.ndarray, near: np.ndarray, digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    links = np.concatenate([np.stack([np.flatnonzero(rep != np.arange(n)), rep[rep != np.arange(n)]], axis=1),
                            near.reshape(-1, 2)]).astype(np.int64)
    label = components(n, links)
    exact = np.asarray(digests)[label] == np.asarray(digests)
    return label, exact


def text_clusters(digests, signatures, empty, *, threshold: float, bands: int, rows: int,
                  sets: list[np.ndarray] | None = None) -> Clusters:
    """Exact groups by digest, LSH candidates among their representatives, a threshold check on
    each candidate (signature estimate, or exact Jaccard when `sets` is given), then components."""
    n = len(digests)
    rep = exact_groups(digests, ~np.asarray(empty, bool))
    reps = np.flatnonzero((rep == np.arange(n)) & ~np.asarray(empty, bool))
    local = candidate_pairs(band_keys(signatures, bands, rows, reps))
    pairs = reps[local] if len(local) else np.empty((0, 2), np.int64)
    est = estimate_jaccard(signatures[pairs[:, 0]], signatures[pairs[:, 1]])
    score = jaccard_exact(sets, pairs) if sets is not None else est
    near = pairs[score >= threshold]
    label, exact = _finish(n, rep, near, digests)
    removed = np.flatnonzero(label != np.arange(n))
    similarity = np.ones(n)
    if sets is not None:
        similarity[removed] = jaccard_exact(sets, np.stack([removed, label[removed]], axis=1))
    else:
        similarity[removed] = estimate_jaccard(signatures[removed], signatures[label[removed]])
    similarity[exact] = 1.0
    stats = {"candidate_pairs": int(len(pairs)), "linked_pairs": int(len(near)),
             "rejected_pairs": int(len(pairs) - len(near))}
    return Clusters(label, exact, similarity, stats)


def image_clusters(digests, hashes: np.ndarray, *, distance: int) -> Clusters:
    """Exact groups by pixel digest, then pairs of representatives within `distance` bits."""
    from shardkit.stages.dedup.image import hamming, near_pairs

    n = len(digests)
    rep = exact_groups(digests)
    reps = np.flatnonzero(rep == np.arange(n))
    local = near_pairs(hashes[reps], distance)
    near = reps[local] if len(local) else np.empty((0, 2), np.int64)
    label, exact = _finish(n, rep, near, digests)
    similarity = 1.0 - hamming(hashes, hashes[label]) / 64.0
    similarity[exact] = 1.0
    return Clusters(label, exact, similarity, {"candidate_pairs": int(len(near)), "linked_pairs": int(len(near))})

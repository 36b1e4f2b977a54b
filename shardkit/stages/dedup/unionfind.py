"""Connected components over duplicate links (union-find with path halving)."""

from __future__ import annotations

import numpy as np


def components(n: int, pairs: np.ndarray) -> np.ndarray:
    """Component label of each of n nodes given (m, 2) links: the smallest node index in it.

    Labelling by the smallest member makes the result independent of link order, and, with
    nodes sorted by key, the label is the row of the key a cluster keeps.
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    labels = np.arange(n, dtype=np.int64)
    if not len(pairs):
        return labels
    parent = {}  # only linked nodes: a corpus with few duplicates costs nothing per document

    def find(x: int) -> int:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])  # path halving: shallow trees, no recursion
            x = parent[x]
        return x

    for a, b in pairs.tolist():
        ra, rb = find(a), find(b)
        if ra != rb:
            # The smaller root wins, so every root is its component's smallest index.
            if ra < rb:
                parent[rb] = ra
            else:
                parent[ra] = rb
    touched = np.unique(pairs)
    labels[touched] = [find(int(x)) for x in touched]
    return labels

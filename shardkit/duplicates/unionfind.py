"""Connected components over duplicate links, on the linked documents only (numpy, no Python dict)."""

from __future__ import annotations

import numpy as np


def linked_components(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, labels): every id that occurs in a link, sorted, and the smallest id of its component.

    Memory is a few arrays the size of the linked ids: a corpus with few duplicates costs nothing
    per document. Labelling by the smallest member makes the result independent of link order;
    with ids in key order, the label is the row of the key a cluster keeps.
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    nodes = np.unique(pairs)
    if not len(nodes):
        return nodes, nodes.copy()
    a, b = np.searchsorted(nodes, pairs[:, 0]), np.searchsorted(nodes, pairs[:, 1])
    parent = np.arange(len(nodes), dtype=np.int64)
    while True:
        # Hook: each link's larger root points at the smaller one (roots only ever decrease, so
        # the smallest member of a component stays a root and ends up as everyone's label) …
        ra, rb = parent[a], parent[b]
        if np.array_equal(ra, rb):
            break
        np.minimum.at(parent, np.maximum(ra, rb), np.minimum(ra, rb))
        # … then compress every path to its root (pointer jumping: O(log depth) passes).
        while True:
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand
    return nodes, nodes[parent]


def components(n: int, pairs: np.ndarray) -> np.ndarray:
    """Component label of each of n nodes given (m, 2) links: the smallest node index in it."""
    labels = np.arange(n, dtype=np.int64)
    nodes, roots = linked_components(pairs)
    labels[nodes] = roots
    return labels

"""A shard's mask under where=: kept ranks -> stored rows (`rows`) and back (`rank`), in at most 1 byte a row.

A batch asks one mask per shard it reads for the rows of a few hundred ranks, so the cost is a
handful of numpy calls per batch and shard, whatever the shard's size:

- every row kept: nothing stored, ranks are rows;
- at most half kept: the kept rows (uint16): rows = kept[ranks], one gather;
- more than half kept: the dropped rows, as gaps[j] = dropped[j] - j (the kept rows before the j-th
  dropped one): rows = ranks + searchsorted(gaps, ranks, "right"), one binary search;
- a shard of more than 65,536 rows (uint16 no longer holds a row): one bit per row and a uint32
  count of kept rows before each byte (0.625 B a row), one binary search and two table lookups.

So a mask takes 2 x min(kept, dropped) / rows <= 1 byte a row (0.35 B at 83% kept, 0.98 B at
half). Bit masks for every shard, asked once per batch, cost ~8.5% of the in-process loader's CPU
per text sample; these, asked a few batches at a time (selection.SelectedOrder), ~1% by profile
(bench/where_bench.py, bench/RESULTS.md "Filtering by attributes").
"""

from __future__ import annotations

import numpy as np

SMALL = 1 << 16  # rows a uint16 can number

# Per byte value: its set bits (popcount), and the position of its k-th set bit (SELECT[v, k]).
_POP = np.array([bin(v).count("1") for v in range(256)], np.uint8)
_SELECT = np.array([[[b for b in range(8) if v >> b & 1][k] if k < _POP[v] else 0 for k in range(8)]
                    for v in range(256)], np.uint8)


def make_mask(keep):
    """The smallest fast mask of a shard's keep flags (bool per stored row)."""
    keep = np.asarray(keep, bool)
    kept = int(np.count_nonzero(keep))
    if kept == len(keep):
        return AllRows(len(keep))
    if len(keep) > SMALL:
        return BitRows(keep)
    if 2 * kept <= len(keep):
        return KeptRows(np.flatnonzero(keep).astype(np.uint16), len(keep))
    dropped = np.flatnonzero(~keep)
    return DroppedRows((dropped - np.arange(len(dropped))).astype(np.uint16), len(keep))


class AllRows:
    """Every row kept."""

    __slots__ = ("size", "kept")

    def __init__(self, size: int):
        self.size = self.kept = size

    def rows(self, ranks) -> np.ndarray:
        return np.asarray(ranks, np.int64)

    def rank(self, row: int) -> int | None:
        return int(row)

    nbytes = 0


class KeptRows:
    """The kept rows, sorted (uint16)."""

    __slots__ = ("kept_rows", "size", "kept")

    def __init__(self, kept_rows: np.ndarray, size: int):
        self.kept_rows, self.size, self.kept = kept_rows, size, len(kept_rows)

    def rows(self, ranks) -> np.ndarray:
        return self.kept_rows[ranks]

    def rank(self, row: int) -> int | None:
        j = int(np.searchsorted(self.kept_rows, row))
        return j if j < self.kept and int(self.kept_rows[j]) == row else None

    @property
    def nbytes(self) -> int:
        return self.kept_rows.nbytes


class DroppedRows:
    """The dropped rows as gaps[j] = dropped[j] - j, the kept rows before the j-th dropped one (uint16,
    non-decreasing): the kept row of rank r comes after every dropped row whose gap is <= r."""

    __slots__ = ("gaps", "size", "kept")

    def __init__(self, gaps: np.ndarray, size: int):
        self.gaps, self.size, self.kept = gaps, size, size - len(gaps)

    def rows(self, ranks) -> np.ndarray:
        ranks = np.asarray(ranks)
        # Needles in the haystack's dtype: searchsorted would convert the whole gaps array otherwise.
        return ranks + np.searchsorted(self.gaps, ranks.astype(np.uint16), side="right")

    def rank(self, row: int) -> int | None:
        dropped = self.gaps.astype(np.int64) + np.arange(len(self.gaps))
        j = int(np.searchsorted(dropped, row))
        return None if j < len(dropped) and int(dropped[j]) == row else int(row) - j

    @property
    def nbytes(self) -> int:
        return self.gaps.nbytes


class BitRows:
    """One bit per row and, per byte (8 rows), the kept rows before it (uint32): 0.625 B a row."""

    __slots__ = ("bits", "before", "kept", "size")

    def __init__(self, keep: np.ndarray):
        keep = np.asarray(keep, bool)
        self.size = len(keep)
        self.bits = np.packbits(keep, bitorder="little")
        per_byte = _POP[self.bits].astype(np.int64)
        self.before = (np.cumsum(per_byte) - per_byte).astype(np.uint32)
        self.kept = int(per_byte.sum())

    def rows(self, ranks) -> np.ndarray:
        ranks = np.asarray(ranks, np.uint32)
        b = np.searchsorted(self.before, ranks, side="right") - 1  # the last byte with fewer kept rows before
        return b * 8 + _SELECT[self.bits[b], ranks - self.before[b]]

    def rank(self, row: int) -> int | None:
        b, bit = divmod(int(row), 8)
        value = int(self.bits[b])
        if not value >> bit & 1:
            return None
        return int(self.before[b]) + int(_POP[value & ((1 << bit) - 1)])

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes + self.before.nbytes

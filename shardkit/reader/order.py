"""An epoch's global order over one dataset: position -> sample id, the same for every world size.

The order is two cheap steps over shard counts, never a materialised list of the epoch's ids:
shards in an order permuted by (seed, epoch), which makes a shard-ordered stream; then that
stream cut into blocks of `block` samples, each block permuted by (seed, epoch, block). A
block's permutation is computed only when a position in it is asked for, so a process holds
O(shards) arrays and a few blocks, whatever the number of samples.

Anything with `__len__` and `ids(positions)` can stand in for an `EpochOrder` under the rank
and worker split in `partition` (e.g. an order that interleaves several datasets).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from shardkit.errors import ConfigError

BLOCKS_KEPT = 4  # a batch spans one or two blocks; workers walk blocks in order


def shard_offsets(counts) -> np.ndarray:
    """Global id of each shard's first sample (ids run over shards in id order); length n+1."""
    return np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]).astype(np.int64)


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order in which shards enter the epoch's stream (a permutation when shuffling)."""
    if not shuffle:
        return np.arange(num_shards, dtype=np.int64)
    return np.random.default_rng([seed, epoch, 0]).permutation(num_shards).astype(np.int64)


class EpochOrder:
    """The global order G of one epoch: `ids(p)` is the sample id at position p of G."""

    def __init__(self, counts, *, seed: int, epoch: int, shuffle: bool = True, block: int = 16384):
        if epoch < 0:
            raise ConfigError(f"epoch={epoch}: expected >= 0 (set_epoch(n) with n >= 0)")
        counts = np.asarray(counts, dtype=np.int64)
        self.seed, self.epoch, self.shuffle, self.block = seed, epoch, shuffle, block
        self.offsets = shard_offsets(counts)
        self.shards = shard_order(len(counts), seed, epoch, shuffle)
        # Stream position of each ordered shard's first sample: O(shards), searched per batch.
        self.starts = shard_offsets(counts[self.shards])
        self._blocks: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def ids(self, positions) -> np.ndarray:
        """Sample ids (global, shard-major) at `positions` of this epoch's order."""
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.offsets[-1]):
            raise IndexError(f"positions outside 0..{len(self) - 1}")
        stream = self._unblock(p) if self.shuffle else p
        k = np.searchsorted(self.starts, stream, side="right") - 1
        return self.offsets[self.shards[k]] + (stream - self.starts[k])

    def _unblock(self, p: np.ndarray) -> np.ndarray:
        """Positions of G -> positions of the shard-ordered stream (undo the block shuffle)."""
        blocks = p // self.block
        first, last = int(blocks.min(initial=0)), int(blocks.max(initial=0))
        if first == last:  # the common case: a batch inside one block
            return first * self.block + self._permutation(first)[p - first * self.block]
        out = np.empty_like(p)
        cuts = np.flatnonzero(blocks[1:] != blocks[:-1]) + 1
        if len(cuts) < 64:  # a few runs of one block each (a worker's batches): no sort of the positions
            bounds = [0, *cuts.tolist(), len(p)]
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                b = int(blocks[lo])
                out[lo:hi] = b * self.block + self._permutation(b)[p[lo:hi] - b * self.block]
            return out
        for b in np.unique(blocks).tolist():
            sel = blocks == b
            out[sel] = b * self.block + self._permutation(b)[p[sel] - b * self.block]
        return out

    def _permutation(self, b: int) -> np.ndarray:
        if b in self._blocks:
            self._blocks.move_to_end(b)
            return self._blocks[b]
        size = min(self.block, len(self) - b * self.block)
        perm = np.random.default_rng([self.seed, self.epoch, 1, b]).permutation(size).astype(np.int32)
        self._blocks[b] = perm
        if len(self._blocks) > BLOCKS_KEPT:
            self._blocks.popitem(last=False)
        return perm

    def shards_at(self, lo: int, hi: int) -> np.ndarray:
        """Shard ids holding the samples at positions [lo, hi) of G, in stream order (for locality checks)."""
        if hi <= lo:
            return np.empty(0, np.int64)
        if self.shuffle:  # whole blocks: a block's samples can come from anywhere in its span
            lo, hi = lo // self.block * self.block, min(len(self), -(-hi // self.block) * self.block)
        k0 = np.searchsorted(self.starts, lo, side="right") - 1
        k1 = np.searchsorted(self.starts, hi - 1, side="right") - 1
        return self.shards[k0:k1 + 1]

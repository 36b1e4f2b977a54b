"""A mixture epoch's global order: position -> (source, place in that source's stream) -> sample id.

Inside a phase with counts c_1..c_k the sources are interleaved by a binary tree of two-way
splits. At a node holding n positions of which c go left, position q goes left when
floor(((q + 1) * c + s) / n) > floor((q * c + s) / n), s a seeded offset in [0, n): a Bresenham
line, so any window of w positions holds w * c / n of them, +-1; each level below adds at most
one more. The left count before q is that floor, so a position's source and its rank among that
source's positions are a few integer operations per tree level, for any position, in any order:
nothing is materialised per epoch. Ids live in one space: source i's samples are numbered
after the samples of sources 0..i-1 (the mixture's BatchReader reads that space).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from shardkit.reader.mixing import MixPlan

OFFSETS_KEPT = 8  # phases whose offsets are kept: a batch spans one or two


def tree(k: int) -> list[tuple[int, int, int, int, int]]:
    """Nodes (lo, mid, hi, left child, right child) of a balanced split of sources [0, k); node 0
    is the root, leaves have mid == hi."""
    nodes: list = []

    def add(lo: int, hi: int) -> int:
        i = len(nodes)
        nodes.append(None)
        if hi - lo == 1:
            nodes[i] = (lo, hi, hi, -1, -1)
        else:
            mid = (lo + hi) // 2
            left = add(lo, mid)
            nodes[i] = (lo, mid, hi, left, add(mid, hi))
        return i

    add(0, k)
    return nodes


def interleave(q: np.ndarray, counts: np.ndarray, offsets: np.ndarray, nodes: list) -> tuple[np.ndarray, np.ndarray]:
    """(source, rank among that source's positions) of phase positions q, for a phase with these
    per-source counts and per-node offsets."""
    csum = np.concatenate([[0], np.cumsum(counts)])
    src, rank = np.empty(len(q), np.int64), np.empty(len(q), np.int64)
    stack = [(0, np.arange(len(q)), np.asarray(q, np.int64))]
    while stack:
        node, idx, qq = stack.pop()
        lo, mid, hi, left, right = nodes[node]
        if not len(idx):
            continue
        if mid == hi:
            src[idx], rank[idx] = lo, qq
            continue
        n, c, s = int(csum[hi] - csum[lo]), int(csum[mid] - csum[lo]), int(offsets[node])
        before = (qq * c + s) // n
        go = (qq + 1) * c + s >= (before + 1) * n  # the left count steps up at q: q is a left position
        stack.append((left, idx[go], before[go]))
        stack.append((right, idx[~go], (qq - before)[~go]))
    return src, rank


class MixtureOrder:
    """The global order of one mixture epoch, in units (samples, or whole batches with batch-level
    mixing): what `partition.EpochPlan` splits over ranks and workers."""

    def __init__(self, plan: MixPlan, epoch: int, seed: int, streams):
        self.plan, self.epoch, self.seed, self.streams = plan, epoch, seed, streams
        self.table = plan.table(epoch)
        self.starts = plan.starts(epoch)  # units of each stream taken by earlier epochs
        self.nodes = tree(len(self.starts))
        self._offsets: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return self.table.total

    def _phase_offsets(self, j: int) -> np.ndarray:
        if j not in self._offsets:
            counts = self.table.cum[j + 1] - self.table.cum[j]
            csum = np.concatenate([[0], np.cumsum(counts)])
            sizes = np.array([csum[hi] - csum[lo] for lo, _, hi, _, _ in self.nodes], np.int64)
            u = np.random.default_rng([self.seed, 0x6D6978, self.epoch, j]).random(len(self.nodes))
            self._offsets[j] = np.floor(u * sizes).astype(np.int64)
            if len(self._offsets) > OFFSETS_KEPT:
                self._offsets.popitem(last=False)
        return self._offsets[j]

    def locate(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(source, unit index within that source's share of this epoch) at `positions`."""
        p = np.asarray(positions, np.int64)
        if p.size and (p.min() < 0 or p.max() >= len(self)):
            raise IndexError(f"positions outside 0..{len(self) - 1}")
        length, cum = self.table.length, self.table.cum
        phase = p // length
        src, k = np.empty(len(p), np.int64), np.empty(len(p), np.int64)
        phases = np.unique(phase).tolist()
        for j in phases:
            sel = np.nonzero(phase == j)[0] if len(phases) > 1 else slice(None)
            s, r = interleave(p[sel] - j * length, cum[j + 1] - cum[j], self._phase_offsets(j), self.nodes)
            src[sel], k[sel] = s, cum[j, s] + r
        return src, k

    def sources(self, positions) -> np.ndarray:
        """The source at each position."""
        return self.locate(positions)[0]

    def ids(self, positions) -> np.ndarray:
        """Sample ids (in the mixture's id space) at `positions`; (n, unit) with batch-level mixing."""
        src, k = self.locate(positions)
        t = self.starts[src] + k  # units into each source's endless stream
        unit = self.plan.unit
        if unit > 1:
            src = np.repeat(src, unit)
            t = (t[:, None] * unit + np.arange(unit)).reshape(-1)
        ids = self.streams.ids(src, t)
        return ids.reshape(-1, unit) if unit > 1 else ids



class SourceStreams:
    """Sample ids of every source's endless stream: pass p of source i is that source's own
    EpochOrder for epoch p, under a seed of its own; ids are offset into the mixture's id space."""

    def __init__(self, shard_counts: list, seeds: list[int], shuffle: bool, block: int):
        from shardkit.reader.order import shard_offsets

        self.counts, self.seeds, self.shuffle, self.block = shard_counts, seeds, shuffle, block
        self.sizes = np.array([int(np.sum(c)) for c in shard_counts], np.int64)
        self.offsets = shard_offsets(self.sizes)
        self._orders: OrderedDict = OrderedDict()

    def order(self, i: int, p: int):
        """Pass p of source i (a few are kept: an up-sampled epoch walks several)."""
        from shardkit.reader.order import EpochOrder

        key = (i, p)
        if key not in self._orders:
            self._orders[key] = EpochOrder(self.counts[i], seed=self.seeds[i], epoch=p, shuffle=self.shuffle,
                                           block=self.block)
            if len(self._orders) > 4 * len(self.sizes):
                self._orders.popitem(last=False)
        else:
            self._orders.move_to_end(key)
        return self._orders[key]

    def ids(self, src: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Mixture ids of stream positions t of sources src (arrays of one length)."""
        out = np.empty(len(t), np.int64)
        for i in np.unique(src).tolist():
            sel = np.nonzero(src == i)[0]
            passes, within = np.divmod(t[sel], self.sizes[i])
            unique = np.unique(passes).tolist()
            for p in unique:
                part, rows = (sel, within) if len(unique) == 1 else (sel[passes == p], within[passes == p])
                out[part] = self.offsets[i] + self.order(i, p).ids(rows)
        return out

    def __getstate__(self):
        return dict(self.__dict__, _orders=OrderedDict())


class ChunkPlan:
    """An EpochPlan over whole batches (batch-level mixing) seen in samples, as the loader counts:
    each unit of the inner plan is one batch of `unit` samples from one source."""

    def __init__(self, inner, unit: int):
        self.inner, self.unit = inner, unit

    def __len__(self) -> int:
        return len(self.inner) * self.unit

    @property
    def padding(self) -> int:
        return self.inner.padding * self.unit

    def positions(self, lo: int, hi: int) -> np.ndarray:
        return self.inner.positions(lo // self.unit, -(-hi // self.unit))

    def ids(self, lo: int, hi: int) -> np.ndarray:
        return self.inner.ids(lo // self.unit, -(-hi // self.unit)).reshape(-1)

    def batches(self, consumed: int, worker: int, num_workers: int, stop: int | None = None, lead: int = 0):
        stop = None if stop is None else stop // self.unit
        for ids in self.inner.batches(consumed // self.unit, worker, num_workers, stop, lead // self.unit):
            yield ids.reshape(-1)

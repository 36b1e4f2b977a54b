"""Shard planning from cumulative size estimates: shards as piece ranges, then work units (chunks).

Shards are cut greedily in key order by estimated bytes (--shard-size) and count
(--max-samples-per-shard), with one binary search per cut over cumulative estimates (memory-mapped
for row files), so planning costs O(shards × log rows), not O(rows). Chunks split a shard into work
units; they change how the work is spread, never a byte of the output.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass

import numpy as np

from shardkit.sources.key_order import ATOMS, Piece
from shardkit.sources.index import load_index

PLAN_VERSION = 2
# Work-unit sizes, in samples: enough units for every worker to stay busy to the end (UNITS_PER_WORKER
# units each), none so small that per-task costs (a Dask round trip, one file written and read back,
# a few ms) show, none so large that one unit holds a worker long after the others are done.
UNITS_PER_WORKER = 8
MIN_UNIT = {"image": 16, "text": 2048}
MAX_UNIT = {"image": 1024, "text": 65536}
TAIL_SPLIT = 4


@dataclass(frozen=True)
class ShardPlan:
    """Which samples one output shard holds: decided before any task runs, from the key order."""

    id: int
    pieces: tuple[Piece, ...]

    @property
    def samples(self) -> int:
        return sum(len(p) for p in self.pieces)

    def fingerprint(self, inv, config_hash: str) -> str:
        """Changes when any input of the shard, its keys or labels, the class list or the config change."""
        h = hashlib.sha256(f"{PLAN_VERSION}|{config_hash}|{self.id}|{inv.classes}".encode())
        for p in self.pieces:
            if p.source == ATOMS:
                h.update(inv.atoms.column("stamp").slice(p.start, len(p)).to_numpy().tobytes())
                h.update(np.ascontiguousarray(inv.labels[p.start:p.stop]).tobytes())
            else:
                rf, count = inv.row_files[p.source], inv.counts[p.source]
                h.update(f"|{rf.stamp()}|{count.width}|{p.start}|{p.stop}|{inv.row_labels.get(p.source)}"
                         .encode("utf-8", "surrogatepass"))
        return h.hexdigest()


def _cumulative(inv, source: int, cache: dict) -> np.ndarray:
    if source not in cache:
        cache[source] = np.cumsum(inv.est) if source == ATOMS else load_index(inv.counts[source], inv.opts.policy)["cum"]
    return cache[source]


def plan_shards(inv, shard_size: int, max_samples: int) -> list[ShardPlan]:
    """Cut the pieces into shards: a sample joins the current shard unless that would pass either target."""
    plans, current, size, count, cache = [], [], 0, 0, {}

    def close():
        nonlocal current, size, count
        plans.append(ShardPlan(len(plans), tuple(current)))
        current, size, count = [], 0, 0

    for piece in inv.pieces:
        cum = _cumulative(inv, piece.source, cache)
        i = piece.start
        while i < piece.stop:
            base = int(cum[i - 1]) if i else 0
            by_size = int(np.searchsorted(cum, shard_size - size + base, side="right")) - 1
            k = min(by_size, i + max_samples - count - 1, piece.stop - 1)
            if k < i:
                if count:
                    close()
                    continue
                k = i  # one sample larger than the target is a shard of its own
            current.append(Piece(piece.source, i, k + 1))
            size += int(cum[k]) - base
            count += k + 1 - i
            i = k + 1
            if i < piece.stop:
                close()
    if current:
        close()
    return plans


def unit_samples(total: int, workers: int, kind: str) -> int:
    """Samples per work unit for `total` samples on `workers` worker threads (see the module notes)."""
    want = math.ceil(total / max(1, workers * UNITS_PER_WORKER))
    return max(MIN_UNIT[kind], min(MAX_UNIT[kind], want))


def _even(n: int, parts: int) -> list[int]:
    bounds = [round(j * n / parts) for j in range(parts + 1)]
    return [b - a for a, b in zip(bounds, bounds[1:]) if b > a]


def _quartered(units: list[int], small: int) -> list[int]:
    out = []
    for n in units:
        out += _even(n, min(TAIL_SPLIT, n // small)) if n >= 2 * small else [n]
    return out


def unit_sizes(counts: list[int], per_unit: int, workers: int, kind: str) -> list[list[int]]:
    """Unit sizes of each shard (samples, in order): near-equal units of ~per_unit, except at both ends
    of the build, where `workers` units (first) and 2 × `workers` units (last) are cut in TAIL_SPLIT:
    the head start (this process, while workers start) then stops soon after they are up, and the
    workers finish together instead of one waiting on the last big unit."""
    small = MIN_UNIT[kind]
    sizes = [_even(n, max(1, math.ceil(n / per_unit))) for n in counts]
    if workers <= 1 or not sizes:
        return sizes
    sizes[0] = _quartered(sizes[0][:workers], small) + sizes[0][workers:]
    left = 2 * workers
    for shard in reversed(range(len(sizes))):
        take = min(left, len(sizes[shard]))
        if take:
            head, tail = sizes[shard][:len(sizes[shard]) - take], sizes[shard][len(sizes[shard]) - take:]
            sizes[shard] = head + _quartered(tail, small)
            left -= take
    return sizes


def split(plan: ShardPlan, sizes: list[int]) -> list[tuple[Piece, ...]]:
    """The shard's pieces cut into consecutive units of the given sizes (they add up to its samples)."""
    bounds = list(itertools.accumulate(sizes))
    assert bounds[-1] == plan.samples, "unit sizes must add up to the shard's samples"
    out, cur, done = [], [], 0
    for piece in plan.pieces:
        start = piece.start
        while start < piece.stop:
            take = min(piece.stop - start, bounds[len(out)] - done)
            cur.append(Piece(piece.source, start, start + take))
            start += take
            done += take
            if done == bounds[len(out)]:
                out.append(tuple(cur))
                cur = []
    return out

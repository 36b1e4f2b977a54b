"""Who reads which samples: a pure function of shard counts, seed, epoch, rank, worker and progress."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardkit.errors import ConfigError

# Block size of the bounded shuffle, in samples. Samples are read by offset (tar) or from a
# row-group cache (Parquet), so a block costs ids, not decoded samples; a block this large
# mixes shards well (|Spearman rho| < 0.1 on 10k samples) while a rank still reads its shards
# as a contiguous run.
DEFAULT_SHUFFLE_BUFFER = 16384


@dataclass(frozen=True)
class Plan:
    """How one epoch is laid out: shuffle, per-rank equalisation and batching."""

    seed: int = 0
    shuffle: bool = True
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    drop_remainder: bool = False
    batch_size: int = 1
    drop_last: bool = False

    def __post_init__(self):
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed={self.seed!r}: expected an integer >= 0 (StreamingDataset(seed=...))")
        for name in ("shuffle_buffer", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name}={value!r}: expected a positive integer")


def _check_position(epoch: int, rank: int, world_size: int, worker: int, num_workers: int) -> None:
    if epoch < 0:
        raise ConfigError(f"epoch={epoch}: expected >= 0 (set_epoch(n) with n >= 0)")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank={rank}, world_size={world_size}: expected 0 <= rank < world_size "
                          "(check RANK/WORLD_SIZE or torch.distributed)")
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ConfigError(f"worker={worker}, num_workers={num_workers}: expected 0 <= worker < num_workers")


def shard_offsets(counts) -> np.ndarray:
    """Global id of each shard's first sample (ids run over shards in id order); length n+1."""
    return np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]).astype(np.int64)


def shard_order(num_shards: int, plan: Plan, epoch: int) -> np.ndarray:
    """The order in which shards enter the epoch's stream (a permutation when shuffling)."""
    if not plan.shuffle:
        return np.arange(num_shards, dtype=np.int64)
    return np.random.default_rng([plan.seed, epoch, 0]).permutation(num_shards).astype(np.int64)


def rank_size(total: int, world_size: int, drop_remainder: bool) -> int:
    """Samples every rank yields per epoch: all ranks yield the same count."""
    if drop_remainder:
        return total // world_size
    return math.ceil(total / world_size)


def padding(total: int, world_size: int, drop_remainder: bool) -> int:
    """Repeated samples (pad) or dropped samples (drop_remainder) across all ranks per epoch."""
    return abs(rank_size(total, world_size, drop_remainder) * world_size - total)


def rank_sequence(counts, plan: Plan, epoch: int, rank: int, world_size: int) -> np.ndarray:
    """The ordered global sample ids rank `rank` yields in `epoch` (before batching).

    The shard-ordered stream is cut into contiguous per-rank blocks, so a rank touches about
    1/world_size of the shards. Ranks that come out one short repeat one of their own samples
    (or, with drop_remainder, the longer ranks drop their last one). Then a block shuffle with
    blocks of `shuffle_buffer` samples, seeded by (seed, epoch, rank).
    """
    _check_position(epoch, rank, world_size, 0, 1)
    offsets = shard_offsets(counts)
    total = int(offsets[-1])
    if total == 0:
        raise ConfigError("the dataset has no samples; rebuild it or check the source folder")
    size = rank_size(total, world_size, plan.drop_remainder)
    if size == 0:
        raise ConfigError(f"drop_remainder=True with {total} samples over {world_size} ranks leaves "
                          "every rank empty; use drop_remainder=False (pad) or fewer ranks")
    order = shard_order(len(counts), plan, epoch)
    stream = np.concatenate([np.arange(offsets[s], offsets[s + 1], dtype=np.int64) for s in order])
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    own = stream[start:start + base + (rank < extra)]
    if len(own) > size:
        own = own[:size]
    elif len(own) < size:
        # Pad from the rank's own samples (locality); an empty rank borrows one (total < world).
        fill = own[:1] if len(own) else stream[rank % total:rank % total + 1]
        own = np.concatenate([own, fill])
    if plan.shuffle:
        rng = np.random.default_rng([plan.seed, epoch, 1, rank])
        own = own.copy()
        for lo in range(0, size, plan.shuffle_buffer):
            own[lo:lo + plan.shuffle_buffer] = rng.permutation(own[lo:lo + plan.shuffle_buffer])
    return own


def num_batches(remaining: int, batch_size: int, drop_last: bool) -> int:
    """Batches made from `remaining` samples."""
    return remaining // batch_size if drop_last else math.ceil(remaining / batch_size)


def batch_sizes(remaining: int, batch_size: int, drop_last: bool) -> list[int]:
    """The size of each batch of the rest of an epoch, in yield order."""
    n = num_batches(remaining, batch_size, drop_last)
    return [min(batch_size, remaining - j * batch_size) for j in range(n)]


def worker_batches(sequence: np.ndarray, plan: Plan, consumed: int, worker: int, num_workers: int):
    """Batches (arrays of ids) that `worker` yields after the first `consumed` samples.

    The rest of the sequence is chopped into batches; worker w takes batches w, w+W, w+2W, ...
    DataLoader collects workers round-robin in order, so the loader returns batches in sequence
    order whatever W is; resume therefore needs only `consumed`.
    """
    _check_position(0, 0, 1, worker, num_workers)
    if not 0 <= consumed <= len(sequence):
        raise ConfigError(f"consumed={consumed}: expected 0..{len(sequence)} samples for this rank's epoch "
                          "(was the state saved with another dataset, world size or drop_remainder?)")
    rest = sequence[consumed:]
    bs = plan.batch_size
    n = num_batches(len(rest), bs, plan.drop_last)
    return [rest[j * bs:(j + 1) * bs] for j in range(worker, n, num_workers)]


def partition(counts, plan: Plan, *, epoch: int, rank: int, world_size: int,
              worker: int, num_workers: int, consumed: int = 0) -> list[np.ndarray]:
    """The exact batches of global sample ids this (rank, worker) yields, in order."""
    _check_position(epoch, rank, world_size, worker, num_workers)
    sequence = rank_sequence(counts, plan, epoch, rank, world_size)
    return worker_batches(sequence, plan, consumed, worker, num_workers)


def locate(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Global ids -> (shard index, row within shard)."""
    shard = np.searchsorted(offsets, ids, side="right") - 1
    return shard, ids - offsets[shard]

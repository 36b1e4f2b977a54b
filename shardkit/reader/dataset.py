"""StreamingDataset: an IterableDataset over a shardkit dataset folder (local or any fsspec URL)."""

from __future__ import annotations

import dataclasses

import numpy as np
from torch.utils.data import IterableDataset

from shardkit.config import StreamConfig
from shardkit.errors import ConfigError
from shardkit.identity import rank_world, worker_identity, worker_info
from shardkit.manifest import load_manifest
from shardkit.reader import decode
from shardkit.reader.batches import BatchReader
from shardkit.reader.order import shard_offsets
from shardkit.reader.partition import EpochPlan, Plan, rank_size
from shardkit.reader.position import Position


class StreamingDataset(IterableDataset):
    """Streams a dataset built by `shardkit build`: exactly-once over ranks x workers, shuffled.

    `options` are StreamConfig fields (seed, shuffle, shuffle_buffer, fields, format,
    drop_remainder, cache_dir, cache_limit, on_error, variant, dtype). Iterated alone it yields
    one decoded sample dict at a time; `batches()` yields whole batches (what `make_loader`'s
    workers run). `transform` maps one decoded sample dict, `batch_transform` one batch dict.
    Progress through the epoch lives in `position`; reading and decoding in `reader`.
    """

    def __init__(self, src: str, config: StreamConfig | None = None, *, transform=None,
                 batch_transform=None, **options):
        try:
            self.config = dataclasses.replace(config or StreamConfig(), **options)
        except TypeError as e:
            valid = ", ".join(f.name for f in dataclasses.fields(StreamConfig))
            raise ConfigError(f"StreamingDataset: {e}; valid options: {valid}") from e
        self.src, self.transform, self.batch_transform = str(src), transform, batch_transform
        self.manifest = load_manifest(self.src)
        self.fields = resolve_fields(self.manifest.fields, self.config.fields)
        self.shards = self.manifest.shards_of(read_format(self.manifest, self.fields, self.config.format))
        self.counts = self.shards.samples.astype(np.int64)  # columns: no object per shard
        self.reader = BatchReader(self.src, self.manifest.fields, self.fields, self.shards,
                                  shard_offsets(self.counts), self.config)
        self.rank, self.world_size = rank_world()
        self.position = Position()
        self.epoch_plan(0)  # validates the split early: an empty rank is an error here, not mid-run

    @property
    def plan(self) -> Plan:
        """The epoch layout these options give (one sample per batch)."""
        c = self.config
        return Plan(seed=c.seed, shuffle=c.shuffle, shuffle_buffer=c.shuffle_buffer, drop_remainder=c.drop_remainder)

    def epoch_plan(self, epoch: int, layers=(), batch_size: int = 1, drop_last: bool = False) -> EpochPlan:
        """This rank's plan of `epoch` (after resume `layers`), O(shards) to compute."""
        plan = dataclasses.replace(self.plan, batch_size=batch_size, drop_last=drop_last)
        return EpochPlan.of(self.counts, plan, epoch, self.rank, self.world_size, layers)

    def __len__(self) -> int:
        """Samples this rank yields per epoch (the same on every rank)."""
        return rank_size(int(self.counts.sum()), self.world_size, self.config.drop_remainder)

    @property
    def padding(self) -> int:
        """Samples repeated (or, with drop_remainder, dropped) over all ranks by the current
        epoch's split (after a resume at another world size: by the rest of this epoch)."""
        p = self.position
        return self.epoch_plan(p.epoch, p.layers).padding

    @property
    def epoch(self) -> int:
        return self.position.epoch

    @property
    def consumed(self) -> int:
        """Samples of this epoch already yielded to the training loop (kept up by make_loader)."""
        return self.position.consumed

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` (a new order); the same epoch again keeps a restored position.

        Without set_epoch, make_loader moves to the next epoch when one has run out.
        """
        self.position.set_epoch(epoch)

    def restart(self, epoch: int = 0) -> None:
        """Go to the first sample of `epoch`, whatever was consumed (e.g. a validation pass)."""
        self.position.jump(epoch)

    @property
    def skipped_shards(self) -> list[str]:
        """Paths of shards skipped as unreadable under on_error='skip' (seen by any worker)."""
        return self.reader.skipped

    def batches(self, batch_size: int, drop_last: bool = False, alloc=None):
        """This worker's batches from the published position: {'__key__': [str], field: tensor
        or list}; batch memory comes from `alloc` (make_loader passes its shared slots)."""
        if worker_info() is not None:
            decode.tune_worker_malloc()
        epoch, consumed, layers = self.position.published()
        worker, num_workers = worker_identity()
        plan = self.epoch_plan(epoch, layers, batch_size, drop_last)
        for ids in plan.batches(consumed, worker, num_workers):
            yield self.load(ids, epoch, alloc)

    def load(self, ids: np.ndarray, epoch: int, alloc=None) -> dict:
        """The batch of global sample ids `ids` as shown in `epoch`, transforms applied."""
        if alloc is None or self.transform is not None:  # a transform rebuilds the batch
            alloc = decode.np_empty
        batch = self.reader.read(ids, epoch, alloc)
        if self.transform is not None:
            samples = [self.transform(decode.unbatch(batch, i)) for i in range(len(batch["__key__"]))]
            batch = decode.collate(samples)
        return self.batch_transform(batch) if self.batch_transform else batch

    def __iter__(self):
        """One decoded sample at a time (a plain DataLoader batches them itself)."""
        epoch, consumed, layers = self.position.published()
        worker, num_workers = worker_identity()
        for ids in self.epoch_plan(epoch, layers).batches(consumed, worker, num_workers):
            batch = self.reader.read(ids, epoch)
            for i in range(len(batch["__key__"])):
                sample = decode.unbatch(batch, i)
                yield self.transform(sample) if self.transform else sample


def read_format(manifest, fields: list[str], asked: str | None = None) -> str:
    """The shard format to stream: `asked`, else the faster one for these fields when the
    dataset has both (measured with 2 workers, shuffled, bench/RESULTS.md):

    - media and fixed-size fields (images, bytes, arrays) and token rows: tar. Tar slices them
      by offset whoever wrote the shards; Parquet matches it (raw 1.15x, JPEG 0.92x) only for
      shards written by this version, which stores those columns uncompressed and PLAIN (older
      Parquet shards decode row groups: 0.73-0.79x), and packed token rows, compressed, read
      at 0.78x of tar.
    - only text, json and ints: Parquet (1.41x tar): row groups of compressed text decode at C
      speed, where tar decodes each member in Python.
    """
    if asked is not None:
        return asked
    if len(manifest.formats) == 1:
        return manifest.formats[0]
    kinds = {manifest.fields[f]["kind"] for f in fields}
    return "tar" if kinds & {"image", "bytes", "array", "tokens"} else "parquet"


def resolve_fields(known: dict, asked) -> list[str]:
    """The fields to read: `asked`, checked against the manifest's, else all but augmentation variants."""
    if asked is None:  # variants of an augmented field are read through it
        return sorted(n for n, spec in known.items() if "variant_of" not in spec)
    bad = [f for f in asked if f not in known]
    if bad:
        raise ConfigError(f"fields={list(asked)!r}: {bad} not in this dataset; it has {sorted(known)}")
    return list(asked)

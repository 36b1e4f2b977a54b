"""StreamingDataset: an IterableDataset over a shardkit dataset folder (local or any fsspec URL)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch.utils.data import IterableDataset

from shardkit.config import StreamConfig
from shardkit.contract import fixed_nbytes
from shardkit.errors import ConfigError
from shardkit.fs import is_remote
from shardkit.identity import rank_world, worker_identity, worker_info
from shardkit.manifest import load_manifest
from shardkit.reader import decode
from shardkit.reader.batches import BatchReader, last_uses
from shardkit.reader.partition import EpochPlan, Plan, rank_size
from shardkit.reader.position import Position
from shardkit.reader.tokens import STORED, TokenBatches, resolve as resolve_tokens

# Packed token rows per DataLoader item: a worker builds this many rows (several consecutive batches)
# at once, because each item costs ~100-200 us of DataLoader and transport work in the main process
# (measured), which at 16 rows a batch was more than reading them.
GROUP_ROWS = 256


class StreamingDataset(IterableDataset):
    """Streams a dataset built by `shardkit build`: exactly-once over ranks x workers, shuffled.

    `options` are StreamConfig fields (seed, shuffle, shuffle_buffer, fields, format,
    drop_remainder, cache_dir, cache_limit, on_error, variant, dtype, tokens, mask_boundaries, keys,
    checksums, timeout, retries). Iterated alone it yields one decoded sample dict at a time;
    `batches()` yields whole batches (what `make_loader`'s workers run). A tokenized dataset yields
    input_ids and labels (position_ids and document_ids when `fields` names them; shardkit.reader.tokens).
    `transform` maps one decoded sample dict, `batch_transform` one batch dict. Progress through
    the epoch lives in `position`, reading and decoding in `reader`.
    """

    def __init__(self, src: str, config: StreamConfig | None = None, *, transform=None,
                 batch_transform=None, **options):
        try:
            self.config = dataclasses.replace(config or StreamConfig(), **options)
        except TypeError as e:
            valid = ", ".join(f.name for f in dataclasses.fields(StreamConfig))
            raise ConfigError(f"StreamingDataset: {e}; valid options: {valid}") from e
        self.src, self.transform, self.batch_transform = str(src), transform, batch_transform
        self.manifest = load_manifest(self.src, self.config.remote_policy())
        token_options, requested = resolve_tokens(self.manifest.fields, self.config, self.config.fields)
        self.fields = resolve_fields(self.manifest.fields, requested, self.config.fields)
        self.shards = self.manifest.shards_of(read_format(self.manifest, self.config.format))
        self.counts = self.shards.samples.astype(np.int64)  # columns: no object per shard
        # Token datasets build their batches in reader/tokens.py (packed rows: all of it).
        self.tokens = None if token_options is None else TokenBatches(
            self.manifest.fields["tokens"], self.shards, token_options, self.config.keys is not False)
        if self.tokens is not None and self.tokens.packed and self.config.keys is None:
            self.tokens.keys = False  # row keys are just (shard, row): only when asked for
        keys = self.config.keys is not False if self.tokens is None else self.tokens.keys
        self.reader = BatchReader(self.src, self.manifest.fields, self.fields, self.shards, self.config,
                                  self.tokens, keys)
        self.rank, self.world_size = rank_world()
        self.position = Position()
        self.epoch_plan(0)  # validates the split early: an empty rank is an error here, not mid-run

    def slotted_fields(self) -> int:
        """Tensors per batch that fill reusable shared slots in make_loader's workers (images,
        fixed-shape rows, arrays, token fields)."""
        if self.tokens is not None and self.tokens.packed:
            return self.tokens.slots()
        specs = [self.manifest.fields[f] for f in self.fields if self.tokens is None or f != "tokens"]
        fixed = sum(1 for spec in specs if spec["kind"] == "image" or fixed_nbytes(spec) is not None)
        return fixed + (self.tokens.slots() if self.tokens is not None else 0)

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
        return self.reader.skipped_shards

    @property
    def skipped_samples(self) -> int:
        """Samples left out under on_error='skip' because their bytes failed the checksum (all workers)."""
        return int(self.reader.skipped.sum())

    def batches(self, batch_size: int, drop_last: bool = False, transport=None):
        """This worker's batches from the published position: {'__key__': [str], field: tensor or
        list}. With make_loader's `transport` batch memory comes from its shared slots, and packed
        token rows come as groups of consecutive batches (cut again by `received`)."""
        if worker_info() is not None:
            decode.tune_worker_malloc()
        epoch, consumed, layers = self.position.published()
        worker, num_workers = worker_identity()
        plain = transport is not None and self.transform is None and self.batch_transform is None
        group = self._group_size(batch_size, plain)
        plan = self.epoch_plan(epoch, layers, group * batch_size, drop_last and group == 1)
        # Groups of consecutive batches, still dealt round-robin: the same order; a dropped last
        # batch is cut off before grouping.
        stop = consumed + (len(plan) - consumed) // batch_size * batch_size if group > 1 and drop_last else None
        done = {}
        if self.config.cache_limit is not None and is_remote(self.src):
            done = last_uses(plan.batches(consumed, worker, num_workers, stop), self.reader.offsets)
        cross = plain and getattr(transport, "pin", False)  # packed rows widen into pinned memory
        alloc = transport.alloc if transport is not None else None
        for j, ids in enumerate(plan.batches(consumed, worker, num_workers, stop)):
            batch = self.load(ids, epoch, alloc, cross)
            yield dict(batch, __batches__=_sizes(len(ids), batch_size)) if group > 1 else batch
            for s in done.get(j, ()):
                self.reader.close(s)

    def _group_size(self, batch_size: int, plain: bool) -> int:
        """Batches a worker builds per item: several for packed token rows sent as they are (see
        GROUP_ROWS), one otherwise (under on_error='skip' a batch may come out short)."""
        packed = self.tokens is not None and self.tokens.packed
        if not packed or not plain or self.config.on_error != "fail":
            return 1
        return max(1, GROUP_ROWS // batch_size)

    def load(self, ids: np.ndarray, epoch: int, alloc=None, cross: bool = False) -> dict:
        """The batch of global sample ids `ids` as shown in `epoch`, transforms applied."""
        if alloc is None or self.transform is not None:  # a transform rebuilds the batch
            alloc = decode.np_empty
        batch = self.reader.read(ids, epoch, alloc, cross)
        if self.transform is not None:
            samples = [self.transform(decode.unbatch(batch, i)) for i in range(_length(batch))]
            batch = decode.collate(samples)
        return self.batch_transform(batch) if self.batch_transform else batch

    def received(self, item):
        """Main process: the batches of one worker item. A group of consecutive batches (packed token
        rows) is cut into views; rows that crossed as stored are widened here into pinned memory."""
        if not isinstance(item, dict) or ("__batches__" not in item and STORED not in item):
            yield item
            return
        sizes = item.pop("__batches__", None) or [_length(item)]
        for part in self.tokens.cut(item, sizes):
            yield self.tokens.finish(part, _pinned) if STORED in part else part

    def __iter__(self):
        """One decoded sample at a time (a plain DataLoader batches them itself)."""
        epoch, consumed, layers = self.position.published()
        worker, num_workers = worker_identity()
        for ids in self.epoch_plan(epoch, layers).batches(consumed, worker, num_workers):
            batch = self.reader.read(ids, epoch)
            for i in range(_length(batch)):
                sample = decode.unbatch(batch, i)
                yield self.transform(sample) if self.transform else sample


def read_format(manifest, asked: str | None = None) -> str:
    """The shard format to stream: `asked`, else tar when the dataset has both.

    Tar is the faster or level for every field kind, measured with 2 workers under shuffle with
    checksums checked (bench/RESULTS.md): this version's Parquet is level for raw images and JPEG
    (0.97x, 0.98x: its media are sliced by offset too), 0.86x for text (compressed row groups, and a
    checksum per decoded value), and packed token rows are one gather from the tar's member (about
    2x their Parquet read); Parquet written by an older shardkit decodes row groups (0.67-0.79x).
    """
    if asked is not None:
        return asked
    return "tar" if "tar" in manifest.formats else manifest.formats[0]


def resolve_fields(known: dict, requested, asked=None) -> list[str]:
    """The manifest fields to read: `requested` (what `asked` leaves once token training fields are
    taken out), checked against the manifest, else all but augmentation variants."""
    if requested is None:  # variants of an augmented field are read through it
        return sorted(n for n, spec in known.items() if "variant_of" not in spec)
    bad = [f for f in requested if f not in known]
    if bad:
        raise ConfigError(f"fields={list(asked if asked is not None else requested)!r}: {bad} not in this "
                          f"dataset; it has {sorted(known)}")
    return list(requested)


def _pinned(shape) -> np.ndarray:
    return torch.empty(shape, dtype=torch.uint8, pin_memory=True).numpy()


def _sizes(n: int, batch_size: int) -> list[int]:
    return [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])


def _length(batch: dict) -> int:
    """Samples in a batch (keys may be left out)."""
    if "__key__" in batch:
        return len(batch["__key__"])
    return len(next(iter(batch.values())))

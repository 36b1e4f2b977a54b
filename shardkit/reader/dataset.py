"""StreamingDataset: an IterableDataset over a shardkit dataset folder (local or any fsspec URL)."""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict

import numpy as np
import torch
from torch.utils.data import IterableDataset

from shardkit.config import FLOAT_DTYPES, StreamConfig
from shardkit.errors import ChecksumMismatch, ConfigError, ShardError
from shardkit.fs import is_remote, join
from shardkit.manifest import load_manifest
from shardkit.reader import decode, variants
from shardkit.reader.cache import ShardCache
from shardkit.identity import rank_world, worker_identity, worker_info
from shardkit.reader.partition import (Plan, locate, padding, rank_sequence, rank_size, shard_offsets,
                                       worker_batches)
from shardkit.reader.shards import ROW_GROUP_CACHE_BYTES, ByteLRU, missing_shard, open_shard
from shardkit.reader.tokens import STORED, TokenBatches, resolve as resolve_tokens
from shardkit.contract import fixed_nbytes

log = logging.getLogger(__name__)
MAX_OPEN_SHARDS = 64  # per worker; a shuffle block spans a few shards, so this rarely evicts
COUNTED_WORKERS = 256  # skipped-sample counters, one per DataLoader worker: no two processes add to one
# Packed token rows per DataLoader item: a worker builds this many rows (several consecutive batches)
# at once, because each item costs ~100-200 us of DataLoader and transport work in the main process
# (measured), which at 16 rows a batch was more than reading them.
GROUP_ROWS = 256


class StreamingDataset(IterableDataset):
    """Streams a dataset built by `shardkit build`: exactly-once over ranks x workers, shuffled.

    `options` are StreamConfig fields (seed, shuffle, shuffle_buffer, fields, format,
    drop_remainder, cache_dir, cache_limit, on_error, variant, dtype, tokens, mask_boundaries, keys,
    checksums, timeout, retries). Iterated alone it yields one decoded sample dict at a time;
    `make_loader` switches it to whole batches built in the workers. A tokenized dataset yields
    input_ids and labels (position_ids and document_ids when `fields` names them; shardkit.reader.tokens).
    `transform` maps one decoded sample dict, `batch_transform` one batch dict.
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
        fmt = self.config.format
        if fmt is None and self.manifest.fields.get("tokens", {}).get("layout") == "packed" \
                and "tar" in self.manifest.formats:
            fmt = "tar"  # packed rows: a gather from the memory map, no row-group decode (2x faster, measured)
        self.shards = self.manifest.shards_of(fmt)
        token_options, requested = resolve_tokens(self.manifest.fields, self.config, self.config.fields)
        self.fields = self._resolve_fields(requested)
        # Token datasets build their batches in reader/tokens.py (packed rows: all of it).
        self.tokens = None if token_options is None else TokenBatches(
            self.manifest.fields["tokens"], self.shards, token_options, self.config.keys is not False)
        if self.tokens is not None and self.tokens.packed and self.config.keys is None:
            self.tokens.keys = False  # row keys are just (shard, row): only when asked for
        self.keys = self.config.keys is not False if self.tokens is None else self.tokens.keys
        self.float_dtype = self.config.dtype if self.config.dtype in FLOAT_DTYPES else None
        self.counts = [s.samples for s in self.shards]
        self.offsets = shard_offsets(self.counts)
        self.rank, self.world_size = rank_world()
        self.batch_size, self.drop_last = None, False
        self.epoch_pinned = False  # set_epoch() since the last loader iter(): no automatic advance
        # make_loader installs one: batch memory from reusable shared slots (alloc), and a wire
        # form for sending batches to the main process (pack).
        self.transport = None
        self._iter_epoch = 0
        # Shared with DataLoader workers (also persistent ones): [epoch, consumed at the start of
        # the current iteration, bad flag per shard]. The main process keeps the live position.
        self._shared = torch.zeros(2 + len(self.shards), dtype=torch.int64).share_memory_()
        self._skipped = torch.zeros(COUNTED_WORKERS, dtype=torch.int64).share_memory_()
        self._epoch, self._consumed = 0, 0
        self._readers: OrderedDict = OrderedDict()
        self._cache = None
        rank_sequence(self.counts, self.plan, 0, self.rank, self.world_size)  # validates early

    def _resolve_fields(self, requested) -> list[str]:
        known = self.manifest.fields
        if requested is None:  # variants of an augmented field are read through it
            return sorted(n for n, spec in known.items() if "variant_of" not in spec)
        bad = [f for f in requested if f not in known]
        if bad:
            raise ConfigError(f"fields={list(self.config.fields)!r}: {bad} not in this dataset; "
                              f"it has {sorted(known)}")
        return list(requested)

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
        c = self.config
        return Plan(seed=c.seed, shuffle=c.shuffle, shuffle_buffer=c.shuffle_buffer,
                    drop_remainder=c.drop_remainder, batch_size=self.batch_size or 1, drop_last=self.drop_last)

    def __len__(self) -> int:
        """Samples this rank yields per epoch (the same on every rank)."""
        return rank_size(int(self.offsets[-1]), self.world_size, self.config.drop_remainder)

    @property
    def padding(self) -> int:
        """Samples repeated (or, with drop_remainder, dropped) over all ranks per epoch."""
        return padding(int(self.offsets[-1]), self.world_size, self.config.drop_remainder)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def consumed(self) -> int:
        """Samples of this epoch already yielded to the training loop (kept up by make_loader)."""
        return self._consumed

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` (a new order); the same epoch again keeps a restored position.

        Without set_epoch, make_loader moves to the next epoch when one has run out.
        """
        if not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): expected an integer >= 0")
        self.epoch_pinned = True
        if epoch != self._epoch:
            self.set_position(epoch, 0)

    def set_position(self, epoch: int, consumed: int) -> None:
        """Jump to `consumed` samples into `epoch` (what load_state_dict uses)."""
        if not 0 <= consumed <= len(self):
            raise ConfigError(f"consumed={consumed}: expected 0..{len(self)} for this rank's epoch")
        self._epoch, self._consumed = epoch, consumed
        self.publish()

    def advance(self, samples: int) -> None:
        """Count samples handed to the training loop; workers keep the start they were given."""
        self._consumed += samples

    def publish(self) -> None:
        """Hand the position to workers: iterations started from now on begin there.

        Workers read it once, when their iteration starts; counting progress goes to a
        separate, unshared counter, so a late-starting worker never sees a moved start.
        """
        self._shared[0], self._shared[1] = self._epoch, self._consumed

    def set_batching(self, batch_size: int | None, drop_last: bool = False) -> None:
        """Yield whole batches of `batch_size` (built in the workers); None yields single samples."""
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
            raise ConfigError(f"batch_size={batch_size!r}: expected a positive integer or None")
        self.batch_size, self.drop_last = batch_size, bool(drop_last)

    @property
    def skipped_shards(self) -> list[str]:
        """Paths of shards skipped as unreadable under on_error='skip' (seen by any worker)."""
        bad = self._shared[2:].nonzero().flatten().tolist()
        return [self.shards[i].path for i in bad]

    @property
    def skipped_samples(self) -> int:
        """Samples left out under on_error='skip' because their bytes failed the checksum (all workers)."""
        return int(self._skipped.sum())

    def __iter__(self):
        epoch, consumed = int(self._shared[0]), int(self._shared[1])
        self._iter_epoch = epoch  # in a worker, self.epoch is the main process's at fork time
        if self.transport is not None:
            self.transport.start_iteration()
        if worker_info() is not None:
            decode.tune_worker_malloc()
        worker, num_workers = worker_identity()
        sequence = rank_sequence(self.counts, self.plan, epoch, self.rank, self.world_size)
        group, plan = self._group_size(), self.plan
        if group > 1:  # groups of consecutive batches, still dealt round-robin: the same order
            if self.drop_last:
                sequence = sequence[:consumed + (len(sequence) - consumed) // self.batch_size * self.batch_size]
            plan = dataclasses.replace(plan, batch_size=group * self.batch_size, drop_last=False)
        items = worker_batches(sequence, plan, consumed, worker, num_workers)
        done = self._last_uses(items)
        for j, ids in enumerate(items):
            if self.batch_size is None:
                yield from self._samples(ids)
            elif group > 1:
                yield dict(self.load_batch(ids), __batches__=_sizes(len(ids), self.batch_size))
            else:
                yield self.load_batch(ids)
            for s in done.get(j, ()):
                self._close(s)

    def _last_uses(self, batches) -> dict[int, list[int]]:
        """Under a cache_limit: batch index -> shards this worker reads for the last time this epoch
        in that batch. Closing them then unpins their cached copies for eviction, so the cache holds
        about the shards of each worker's current shuffle block beyond the limit, not its last 64."""
        if self.config.cache_limit is None or not is_remote(self.src) or not batches:
            return {}
        ids = np.concatenate(batches)
        batch_of = np.repeat(np.arange(len(batches)), [len(b) for b in batches])
        shard_of = locate(ids, self.offsets)[0]
        shards, last = np.unique(shard_of[::-1], return_index=True)  # first seen from the end
        out: dict[int, list[int]] = {}
        for s, j in zip(shards.tolist(), batch_of[len(ids) - 1 - last].tolist()):
            out.setdefault(j, []).append(s)
        return out

    def _plain_workers(self) -> bool:
        """make_loader workers and no user transform (which needs its batch as asked for)."""
        return self.transport is not None and self.transform is None and self.batch_transform is None

    def _cross_stored(self) -> bool:
        """Where packed token rows are widened, once. With pinned memory (CUDA) in the main process:
        it copies every byte into pinned memory anyway, and widening is that copy. Otherwise in the
        workers, in parallel, into the shared slot the fields travel in: 1.3x the main-process
        variant at B=64, equal at B=16 (measured on 2 cores, bench/RESULTS.md)."""
        return self._plain_workers() and getattr(self.transport, "pin", False)

    def _group_size(self) -> int:
        """Batches a worker builds per item: several for packed token rows crossing as stored (see
        GROUP_ROWS), one otherwise (under on_error='skip' a batch may come out short)."""
        packed = self.tokens is not None and self.tokens.packed
        if not packed or not self._plain_workers() or self.config.on_error != "fail":
            return 1
        return max(1, GROUP_ROWS // (self.batch_size or GROUP_ROWS))

    def received(self, item):
        """Main process: the batches of one worker item. A group of consecutive batches (packed token
        rows) is cut into views; rows that crossed as stored are widened here into pinned memory."""
        if not isinstance(item, dict) or ("__batches__" not in item and STORED not in item):
            yield item
            return
        sizes = item.pop("__batches__", None) or [_length(item)]
        for part in self.tokens.cut(item, sizes):
            yield self.tokens.finish(part, _pinned) if STORED in part else part

    def _samples(self, ids):
        batch = self._batch(ids)
        for i in range(_length(batch)):
            sample = decode.unbatch(batch, i)
            yield self.transform(sample) if self.transform else sample

    def load_batch(self, ids: np.ndarray) -> dict:
        """The batch of global sample ids `ids`: {'__key__': [str], field: tensor or list}."""
        batch = self._batch(ids)
        if self.transform is not None:
            samples = [self.transform(decode.unbatch(batch, i)) for i in range(_length(batch))]
            batch = decode.collate(samples)
        batch = self.batch_transform(batch) if self.batch_transform else batch
        return self.transport.pack(batch) if self.transport is not None else batch

    def _alloc(self):
        if self.transport is None or self.transform is not None:  # a transform rebuilds the batch
            return decode.np_empty
        return self.transport.alloc

    def _batch(self, ids: np.ndarray) -> dict:
        """Read and decode; under on_error='skip' a failing shard's samples are left out."""
        while True:
            shard_idx, rows = locate(np.asarray(ids, np.int64), self.offsets)
            try:
                return self._build(shard_idx, rows)
            except ShardError as e:
                bad = getattr(e, "shard_index", None)
                if self.config.on_error != "skip" or bad is None:
                    raise
                if isinstance(e, ChecksumMismatch):  # only these samples: the rest of the shard is sound
                    log.warning("skipping %d sample(s): %s", len(e.rows), e)
                    drop = (shard_idx == bad) & np.isin(rows, e.rows)
                    self._skipped[worker_identity()[0] % COUNTED_WORKERS] += int(drop.sum())
                    ids = np.asarray(ids)[~drop]
                    continue
                log.warning("skipping shard %s: %s", self.shards[bad].path, e)
                self._shared[2 + bad] = 1
                self._close(bad)
                ids = np.asarray(ids)[shard_idx != bad]

    def _build(self, shard_idx: np.ndarray, rows: np.ndarray) -> dict:
        n = len(rows)
        groups = []  # (reader, positions, rows) per shard, in first-seen order
        for s in dict.fromkeys(shard_idx.tolist()):
            if self._shared[2 + s]:
                raise _tagged(ShardError(f"shard {self.shards[s].path} was skipped earlier"), s)
            pos = np.nonzero(shard_idx == s)[0]
            groups.append((s, self._reader(s), pos, rows[pos]))
        if self.tokens is not None and self.tokens.packed:
            if self._cross_stored():  # widened in the main process (`received`), into pinned memory
                return self.tokens.packed_batch(groups, n, self.transport.alloc, _guard)
            return self.tokens.finish(self.tokens.packed_batch(groups, n, self.tokens.scratch, _guard), self._alloc())
        batch = {"__key__": self._keys(groups, n)} if self.keys else {}
        for name in self.fields:
            batch[name] = self._column(name, groups, n)
        if self.tokens is not None:  # one document per sample: the tokens become training fields
            batch = self.tokens.document_batch(batch, self.offsets[shard_idx] + rows, self._alloc())
        return batch

    @staticmethod
    def _keys(groups, n: int) -> list:
        keys: list = [None] * n
        for s, reader, pos, r in groups:
            rk = reader.keys
            for p, row in zip(pos.tolist(), r.tolist()):
                keys[p] = rk[row]
        return keys

    def _column(self, name: str, groups, n: int):
        spec = self.manifest.fields[name]
        if spec.get("variants"):  # offline augmentation: each sample reads this epoch's variant only
            groups = variants.wrap_groups(groups, self.manifest.fields, name, self._iter_epoch,
                                          self.config.variant, self.config.seed)
        if fixed_nbytes(spec):
            # Rows widened into a new tensor (token ids to int64, a dtype cast) are read into
            # plain memory; the tensor handed on takes the shared slot.
            direct = decode.stored_as_is(spec, self.float_dtype)
            flat = decode.fixed_batch(n, spec, self._alloc() if direct else decode.np_empty)
            present = np.zeros(n, bool)
            for s, reader, pos, r in groups:
                if reader.has(name):
                    present[pos] = _guard(s, lambda: reader.fill(name, r, flat, pos))
            return decode.arrays(flat, present, spec, self._alloc(), self.float_dtype)
        values: list = [None] * n
        for s, reader, pos, r in groups:
            if reader.has(name):
                for p, v in zip(pos.tolist(), _guard(s, lambda: reader.values(name, r))):
                    values[p] = v
        try:
            return decode.column(spec, values, self._alloc())
        except decode.DecodeFailed as e:
            s = next(s for s, _, pos, _ in groups if e.index in pos)
            raise _tagged(ShardError(f"shard {join(self.src, self.shards[s].path)}: cannot decode field "
                                     f"{name!r} of an image in it ({e}); rebuild the dataset"), s) from e

    def _reader(self, s: int):
        if s in self._readers:
            self._readers.move_to_end(s)
            return self._readers[s][0]
        if self._cache is None:
            # Created lazily, in the worker that reads: caches are per process.
            self._cache = ShardCache(self.src, self.config.cache_dir, self.config.cache_limit,
                                     self.config.remote_policy())
            self._row_groups = ByteLRU(ROW_GROUP_CACHE_BYTES)
        url = join(self.src, self.shards[s].path)
        try:
            try:
                self._readers[s] = self._open(s)
            except FileNotFoundError:
                if not self._cache.remote:
                    raise
                # The cache pins what it hands out; a copy deleted behind its back is fetched again, once.
                self._readers[s] = self._open(s)
        except ShardError as e:
            raise _tagged(e, s)
        except FileNotFoundError as e:
            raise _tagged(missing_shard(url, e), s) from e
        except OSError as e:
            raise _tagged(ShardError(f"cannot open shard {url}: {e}"), s) from e
        if len(self._readers) > MAX_OPEN_SHARDS:
            self._close(next(iter(self._readers)))
        return self._readers[s][0]

    def _open(self, s: int):
        """(reader, PinnedShard): the shard's files stay in the cache until _close(s) unpins them."""
        shard = self.shards[s]
        pinned, url = self._cache.pin_shard(shard), join(self.src, shard.path)
        try:
            if self.tokens is not None and self.tokens.packed:
                reader = self.tokens.open(pinned.path, shard, url, self._row_groups)
            else:
                reader = open_shard(pinned.path, shard, self.manifest.fields, url, index_path=pinned.index,
                                    cache=self._row_groups, checks=self.config.checksums)
        except BaseException:
            pinned.release()
            raise
        pinned.release_index()
        return reader, pinned

    def _close(self, s: int) -> None:
        entry = self._readers.pop(s, None)
        if entry is not None:
            entry[1].release()
            self._cache.evict()  # what the pin held over cache_limit may go now

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_readers"], state["_cache"] = OrderedDict(), None  # open files stay in their process
        state.pop("_row_groups", None)
        return state


def _pinned(shape) -> np.ndarray:
    return torch.empty(shape, dtype=torch.uint8, pin_memory=True).numpy()


def _sizes(n: int, batch_size: int) -> list[int]:
    return [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])


def _length(batch: dict) -> int:
    """Samples in a batch (keys may be left out)."""
    if "__key__" in batch:
        return len(batch["__key__"])
    return len(next(iter(batch.values())))


def _tagged(error: ShardError, shard_index: int) -> ShardError:
    error.shard_index = shard_index
    return error


def _guard(s: int, read):
    try:
        return read()
    except ShardError as e:
        raise _tagged(e, s)

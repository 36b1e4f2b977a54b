"""Batch building: global sample ids -> one decoded batch, read shard by shard (per process)."""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import torch

from shardkit.config import StreamConfig
from shardkit.contract import fixed_nbytes
from shardkit.errors import ShardError
from shardkit.fs import join
from shardkit.reader import decode, variants
from shardkit.reader.cache import ShardCache
from shardkit.reader.partition import locate
from shardkit.reader.shards import ROW_GROUP_CACHE_BYTES, ByteLRU, open_shard

log = logging.getLogger(__name__)
MAX_OPEN_SHARDS = 64  # per process; a shuffle block spans a few shards, so this rarely evicts


class BatchReader:
    """Reads and decodes batches of global sample ids; shards are opened lazily, in the process
    that reads (open files, caches and mappings never cross a fork or a pickle).

    `shards` is the dataset's shard table of one format (indexable: shard index -> ShardInfo),
    `offsets` the global id of each shard's first sample. Under on_error='skip' a shard that
    fails is flagged in shared memory, so every worker and the main process see it.
    """

    def __init__(self, src: str, specs: dict, fields: list[str], shards, offsets: np.ndarray,
                 config: StreamConfig):
        self.src, self.specs, self.fields, self.shards = src, specs, fields, shards
        self.offsets, self.config = offsets, config
        self.bad = torch.zeros(len(offsets) - 1, dtype=torch.uint8).share_memory_()
        self._readers: OrderedDict = OrderedDict()
        self._cache = self._row_groups = None

    @property
    def skipped(self) -> list[str]:
        """Paths of shards skipped as unreadable (seen by any worker)."""
        return [self.shards[i].path for i in self.bad.nonzero().flatten().tolist()]

    def read(self, ids: np.ndarray, epoch: int, alloc=decode.np_empty) -> dict:
        """The batch of `ids`: {'__key__': [str], field: tensor or list}; batch memory from `alloc`.

        Under on_error='skip' a failing shard's samples are left out."""
        while True:
            shard_idx, rows = locate(np.asarray(ids, np.int64), self.offsets)
            try:
                return self._build(shard_idx, rows, epoch, alloc)
            except ShardError as e:
                bad = getattr(e, "shard_index", None)
                if self.config.on_error != "skip" or bad is None:
                    raise
                log.warning("skipping shard %s: %s", self.shards[bad].path, e)
                self.bad[bad] = 1
                self._readers.pop(bad, None)
                ids = np.asarray(ids)[shard_idx != bad]

    def _build(self, shard_idx: np.ndarray, rows: np.ndarray, epoch: int, alloc) -> dict:
        n = len(rows)
        groups = []  # (shard, reader, positions, rows) per shard, in first-seen order
        for s in dict.fromkeys(shard_idx.tolist()):
            if self.bad[s]:
                raise _tagged(ShardError(f"shard {self.shards[s].path} was skipped earlier"), s)
            pos = np.nonzero(shard_idx == s)[0]
            groups.append((s, self._reader(s), pos, rows[pos]))
        keys: list = [None] * n
        for s, reader, pos, r in groups:
            rk = reader.keys
            for p, row in zip(pos.tolist(), r.tolist()):
                keys[p] = rk[row]
        batch = {"__key__": keys}
        for name in self.fields:
            batch[name] = self._column(name, groups, n, epoch, alloc)
        return batch

    def _column(self, name: str, groups, n: int, epoch: int, alloc):
        spec = self.specs[name]
        if spec.get("variants"):  # offline augmentation: each sample reads this epoch's variant only
            groups = variants.wrap_groups(groups, self.specs, name, epoch, self.config.variant, self.config.seed)
        if fixed_nbytes(spec):
            # Rows widened into a new tensor (token ids to int64, a dtype cast) are read into
            # plain memory; the tensor handed on takes the batch memory from `alloc`.
            direct = decode.stored_as_is(spec, self.config.dtype)
            flat = decode.fixed_batch(n, spec, alloc if direct else decode.np_empty)
            present = np.zeros(n, bool)
            for s, reader, pos, r in groups:
                if reader.has(name):
                    present[pos] = _guard(s, lambda: reader.fill(name, r, flat, pos))
            return decode.arrays(flat, present, spec, alloc, self.config.dtype)
        values: list = [None] * n
        for s, reader, pos, r in groups:
            if reader.has(name):
                for p, v in zip(pos.tolist(), _guard(s, lambda: reader.values(name, r))):
                    values[p] = v
        try:
            return decode.column(spec, values, alloc)
        except decode.DecodeFailed as e:
            s = next(s for s, _, pos, _ in groups if e.index in pos)
            raise _tagged(ShardError(f"shard {join(self.src, self.shards[s].path)}: cannot decode field "
                                     f"{name!r} of an image in it ({e}); rebuild the dataset"), s) from e

    def _reader(self, s: int):
        if s in self._readers:
            self._readers.move_to_end(s)
            return self._readers[s]
        if self._cache is None:  # created lazily, in the process that reads: caches are per process
            self._cache = ShardCache(self.src, self.config.cache_dir, self.config.cache_limit)
            self._row_groups = ByteLRU(ROW_GROUP_CACHE_BYTES)
        shard = self.shards[s]
        url = join(self.src, shard.path)

        def load():
            path, index_path = self._cache.shard_paths(shard)
            return open_shard(path, shard, self.specs, url, index_path=index_path, cache=self._row_groups)

        try:
            try:
                reader = load()
            except FileNotFoundError:
                reader = load()  # another worker evicted the cached copy between fetch and open
        except ShardError as e:
            raise _tagged(e, s)
        except OSError as e:
            raise _tagged(ShardError(f"cannot open shard {url}: {e}; is the dataset complete?"), s) from e
        self._readers[s] = reader
        if len(self._readers) > MAX_OPEN_SHARDS:
            self._readers.popitem(last=False)
        return reader

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_readers"], state["_cache"], state["_row_groups"] = OrderedDict(), None, None
        return state


def _tagged(error: ShardError, shard_index: int) -> ShardError:
    error.shard_index = shard_index
    return error


def _guard(s: int, read):
    try:
        return read()
    except ShardError as e:
        raise _tagged(e, s)

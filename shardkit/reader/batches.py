"""Batch building: global sample ids -> one decoded batch, read shard by shard (per process)."""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import torch

from shardkit.config import FLOAT_DTYPES, StreamConfig
from shardkit.contract import fixed_nbytes
from shardkit.errors import ChecksumMismatch, ShardError
from shardkit.fs import join
from shardkit.identity import worker_identity
from shardkit.reader import decode, variants
from shardkit.reader.order import shard_offsets
from shardkit.reader.partition import locate
from shardkit.reader.remote import Remote
from shardkit.reader.shards import ROW_GROUP_CACHE_BYTES, ByteLRU, missing_shard, open_shard

log = logging.getLogger(__name__)
DATASET_KEY = "__dataset__"  # batches of a mixture: the source of each sample (its index in the mixture)
MAX_OPEN_SHARDS = 64  # per process; a shuffle block spans a few shards, so this rarely evicts
COUNTED_WORKERS = 256  # skipped-sample counters, one per DataLoader worker: no two processes add to one


class ShardSet:
    """The shards of one or more datasets as one list (a mixture reads several): shard index s ->
    ShardInfo, the dataset root it lies in, and which dataset it belongs to. Sample ids run over
    the shards in this order, so dataset i's samples come after those of datasets 0..i-1."""

    def __init__(self, parts):
        self.roots = [str(root) for root, _ in parts]
        self.tables = [table for _, table in parts]
        self.first = shard_offsets([len(t) for t in self.tables])  # first shard index of each dataset
        self.samples = np.concatenate([np.asarray(t.samples, np.int64) for t in self.tables])

    def __len__(self) -> int:
        return int(self.first[-1])

    def part(self, s):
        """The dataset (index into the parts) of shard index s (an int or an array)."""
        return np.searchsorted(self.first, s, side="right") - 1

    def __getitem__(self, s: int):
        p = int(self.part(s))
        return self.tables[p][int(s - self.first[p])]

    def __iter__(self):
        for table in self.tables:
            yield from table

    def root(self, s: int) -> str:
        return self.roots[int(self.part(s))]

    def url(self, s: int) -> str:
        return join(self.root(s), self[s].path)


class BatchReader:
    """Reads and decodes batches of global sample ids; shards are opened lazily, in the process
    that reads (open files, caches, pins and mappings never cross a fork or a pickle).

    `shards` is a ShardSet (or one dataset's shard table of one format, read from `src`).
    With `tag_parts` every batch says which dataset each sample came from (`__dataset__`, int64).
    Under on_error='skip' a shard that fails is flagged in shared memory, and samples whose bytes
    fail their checksum are counted there, so every worker and the main process see both.
    `tokens` (reader.tokens.TokenBatches) builds the batches of a tokenized dataset.
    """

    def __init__(self, src: str | None, specs: dict, fields: list[str], shards, config: StreamConfig,
                 tokens=None, keys: bool = True, tag_parts: bool = False):
        if not isinstance(shards, ShardSet):
            shards = ShardSet([(src, shards)])
        self.specs, self.fields, self.shards, self.config = specs, fields, shards, config
        self.tokens, self.keys, self.tag_parts = tokens, keys, tag_parts
        self.offsets = shard_offsets(shards.samples)
        self.float_dtype = config.dtype if config.dtype in FLOAT_DTYPES else None
        self.bad = torch.zeros(len(shards), dtype=torch.uint8).share_memory_()
        self.skipped = torch.zeros(COUNTED_WORKERS, dtype=torch.int64).share_memory_()
        self._readers: OrderedDict = OrderedDict()  # shard index -> (reader, pinned files)
        self._row_groups = None  # made in the process that reads
        self.remote = Remote(shards, self.offsets, specs, config, tokens, _tagged)

    @property
    def skipped_shards(self) -> list[str]:
        """Paths of shards skipped as unreadable (seen by any worker); URLs when several datasets are read."""
        bad = self.bad.nonzero().flatten().tolist()
        return [self.shards[i].path if len(self.shards.roots) == 1 else self.shards.url(i) for i in bad]

    def read(self, ids: np.ndarray, epoch: int, alloc=decode.np_empty, cross: bool = False,
             shared: bool = False) -> dict:
        """The batch of `ids` as shown in `epoch`: {'__key__': [str], field: tensor or list}; batch
        memory from `alloc`. `cross`: packed token rows stay as stored (widened in the main process).
        `shared`: packed rows' input_ids and labels may be two views of one array (no transform edits them).

        Under on_error='skip' a failing shard's samples, or samples failing their checksum, are left out."""
        while True:
            shard_idx, rows = locate(np.asarray(ids, np.int64), self.offsets)
            try:
                batch = self._build(shard_idx, rows, epoch, alloc, cross, shared)
                self.remote._ranged_left = max(0, self.remote._ranged_left - 1)
                return batch
            except ShardError as e:
                bad = getattr(e, "shard_index", None)
                if self.config.on_error != "skip" or bad is None:
                    raise
                if isinstance(e, ChecksumMismatch):  # only these samples: the rest of the shard is sound
                    log.warning("skipping %d sample(s): %s", len(e.rows), e)
                    drop = (shard_idx == bad) & np.isin(rows, e.rows)
                    self.skipped[worker_identity()[0] % COUNTED_WORKERS] += int(drop.sum())
                    ids = np.asarray(ids)[~drop]
                    continue
                log.warning("skipping shard %s: %s", self.shards[bad].path, e)
                self.bad[bad] = 1
                self.close(bad)
                ids = np.asarray(ids)[shard_idx != bad]

    def _build(self, shard_idx: np.ndarray, rows: np.ndarray, epoch: int, alloc, cross: bool,
               shared: bool) -> dict:
        n = len(rows)
        groups = []  # (shard, reader, positions, rows) per shard, in first-seen order
        needed = dict.fromkeys(shard_idx.tolist())
        if self.remote.fetcher is not None:  # all of this batch's shards download at once, not one by one
            self.remote.fetcher.want([s for s in needed if s not in self._readers])
        ranged = self.remote._read_by_range(needed, shard_idx, rows, self._readers, self.bad) if self.remote._ranged_left else {}
        for s in needed:
            if self.bad[s]:
                raise _tagged(ShardError(f"shard {self.shards[s].path} was skipped earlier"), s)
            pos = np.nonzero(shard_idx == s)[0]
            groups.append((s, ranged.get(s) or self._reader(s), pos, rows[pos]))
        tokens = self.tokens
        if tokens is not None and tokens.packed:
            if cross:  # widened in the main process (StreamingDataset.received), into pinned memory
                return self._tag(tokens.packed_batch(groups, n, alloc, _guard), shard_idx)
            return self._tag(tokens.finish(tokens.packed_batch(groups, n, tokens.scratch, _guard), alloc, shared), shard_idx)
        batch = {"__key__": _keys(groups, n)} if self.keys else {}
        for name in self.fields:
            batch[name] = self._column(name, groups, n, epoch, alloc)
        if tokens is not None:  # one document per sample: the tokens become training fields
            batch = tokens.document_batch(batch, self.offsets[shard_idx] + rows, alloc)
        return self._tag(batch, shard_idx)

    def _tag(self, batch: dict, shard_idx: np.ndarray) -> dict:
        if self.tag_parts:  # small: travels by value, and the main process counts it (Mixture.yielded)
            batch[DATASET_KEY] = torch.from_numpy(self.shards.part(shard_idx).astype(np.int64))
        return batch

    def _column(self, name: str, groups, n: int, epoch: int, alloc):
        spec = self.specs[name]
        if spec.get("variants"):  # offline augmentation: each sample reads this epoch's variant only
            groups = variants.wrap_groups(groups, self.specs, name, epoch, self.config.variant, self.config.seed)
        if fixed_nbytes(spec):
            # Rows widened into a new tensor (token ids to int64, a dtype cast) are read into
            # plain memory; the tensor handed on takes the batch memory from `alloc`.
            direct = decode.stored_as_is(spec, self.float_dtype)
            flat = decode.fixed_batch(n, spec, alloc if direct else decode.np_empty)
            present = np.zeros(n, bool)
            for s, reader, pos, r in groups:
                if reader.has(name):
                    present[pos] = _guard(s, lambda: reader.fill(name, r, flat, pos))
            return decode.arrays(flat, present, spec, alloc, self.float_dtype)
        values: list = [None] * n
        for s, reader, pos, r in groups:
            if reader.has(name):
                for p, v in zip(pos.tolist(), _guard(s, lambda: reader.values(name, r))):
                    values[p] = v
        try:
            return decode.column(spec, values, alloc)
        except decode.DecodeFailed as e:
            s = next(s for s, _, pos, _ in groups if e.index in pos)
            raise _tagged(ShardError(f"shard {self.shards.url(s)}: cannot decode field "
                                     f"{name!r} of an image in it ({e}); rebuild the dataset"), s) from e

    def _reader(self, s: int):
        if s in self._readers:
            self._readers.move_to_end(s)
            return self._readers[s][0]
        if self._row_groups is None:  # created lazily, in the process that reads: caches are per process
            self._row_groups = ByteLRU(ROW_GROUP_CACHE_BYTES)
        url = self.shards.url(s)
        try:
            try:
                self._readers[s] = self._open(s)
            except FileNotFoundError:
                if not self.cache(s).remote:
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
            self.close(next(iter(self._readers)))
        return self._readers[s][0]

    def is_open(self, s: int) -> bool:
        """Whether shard s is open here (and its cached files pinned)."""
        return s in self._readers

    def shard_keys(self, s: int) -> list[str]:
        """The sorted keys of shard s (the tar index's key column, the Parquet shard's), opened as a
        batch would open it: through the shard cache, its checks made."""
        return _guard(s, lambda: self._reader(s).keys)

    def stored(self, s: int, field: str, row: int):
        """The stored value of `field` at `row` of shard s (encoded bytes, int, str, dict; None where
        the sample lacks it), checksum-checked, undecoded."""
        reader = self._reader(s)
        return _guard(s, lambda: reader.values(field, [row])[0]) if reader.has(field) else None

    @property
    def net(self):
        return self.remote.net

    def cache(self, s: int):
        return self.remote.cache(s)

    def start_fetching(self, batches, ranged: int = 0) -> None:
        self.remote.start_fetching(batches, ranged, skip=set(self._readers))

    def stop_fetching(self) -> None:
        self.remote.stop_fetching()

    def _open(self, s: int):
        """(reader, PinnedShard): the shard's files stay in the cache until close(s) unpins them."""
        shard = self.shards[s]
        pinned, url = self.remote._pinned(s), self.shards.url(s)
        if self.cache(s).remote:  # checked when fetched: a later mismatch is damage to this copy
            url = f"{url} (cached copy {pinned.path}: delete it to fetch the shard again)"
        try:
            if self.tokens is not None and self.tokens.packed:
                reader = self.tokens.open(pinned.path, shard, url, self._row_groups)
            else:
                reader = open_shard(pinned.path, shard, self.specs, url, index_path=pinned.index,
                                    cache=self._row_groups, checks=self.config.checksums)
        except BaseException:
            pinned.release()
            raise
        pinned.release_index()
        return reader, pinned

    def close(self, s: int) -> None:
        """Close shard s here and unpin its cached files (they may be evicted now)."""
        entry = self._readers.pop(s, None)
        if entry is not None:
            entry[1].release()
            self.cache(s).evict()  # what the pin held over cache_limit may go now

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_readers"], state["_row_groups"] = OrderedDict(), None
        return state


def last_uses(batches, offsets: np.ndarray) -> dict[int, list[int]]:
    """Batch index -> shards read for the last time in that batch, over an iterator of id arrays:
    one pass, O(shards touched) memory. Closing those shards then unpins their cached copies, so
    under a cache_limit a worker holds about the shards of its current shuffle block."""
    last: dict[int, int] = {}
    for j, ids in enumerate(batches):
        for s in np.unique(locate(np.asarray(ids, np.int64), offsets)[0]).tolist():
            last[s] = j
    out: dict[int, list[int]] = {}
    for s, j in last.items():
        out.setdefault(j, []).append(s)
    return out


def _keys(groups, n: int) -> list:
    keys: list = [None] * n
    for s, reader, pos, r in groups:
        rk = reader.keys
        for p, row in zip(pos.tolist(), r.tolist()):
            keys[p] = rk[row]
    return keys


def _tagged(error: ShardError, shard_index: int) -> ShardError:
    error.shard_index = shard_index
    return error


def _guard(s: int, read):
    try:
        return read()
    except ShardError as e:
        raise _tagged(e, s)

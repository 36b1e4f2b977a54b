"""Batch building: global sample ids -> one decoded batch, read shard by shard (per process)."""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict

import numpy as np
import torch

from shardkit.config import FLOAT_DTYPES, StreamConfig
from shardkit.contract import fixed_nbytes
from shardkit.errors import ChecksumMismatch, ShardError
from shardkit.store.local import join
from shardkit.identity import worker_identity
from shardkit.reader import decode, spans, variants
from shardkit.reader.order import shard_offsets
from shardkit.reader.partition import locate
from shardkit.reader.remote import Remote
from shardkit.reader.shards import ROW_GROUP_CACHE_BYTES, ByteLRU, missing_shard, open_shard

log = logging.getLogger(__name__)
DATASET_KEY = "__dataset__"  # batches of a mixture: the source of each sample (its index in the mixture)
# Per process, the least recently read closed first. A batch reads the shards its one or two shuffle
# blocks cover (block / samples per shard of them; a mixture's come from each source), never closed
# while it reads them: more than this evicts (small shards, a large block), and a reopen costs a read.
MAX_OPEN_SHARDS = 64
COUNTED_WORKERS = 256  # skipped-sample counters, one per DataLoader worker: no two processes add to one


_TURNS = threading.Lock()  # makes a Turns' lock once per process


def _turns_forked() -> None:  # a forked child's: the parent's may have been held by another thread
    global _TURNS
    _TURNS = threading.Lock()


os.register_at_fork(after_in_child=_turns_forked)


class Turns:
    """The lock the threads of a process that share a reader take turns with (ds[i] and ds.get from
    a pool of user threads, an epoch read beside them): its open shards, pins and rows read by range
    are one thread's at a time. Without it two threads' lookups read zeros where the other's rows
    were to land, or closed a shard the other was reading. One dataset per thread reads in parallel.
    An RLock made in the process that uses it (one held across a fork stays held; a pickle drops it)."""

    def __init__(self):
        self._made = (None, None)  # (pid, RLock)

    def lock(self) -> threading.RLock:
        pid, lock = self._made
        if pid != os.getpid():
            with _TURNS:
                pid, lock = self._made
                if pid != os.getpid():
                    lock = threading.RLock()
                    self._made = (os.getpid(), lock)
        return lock

    def __getstate__(self):
        return {"_made": (None, None)}


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
        self.readers: OrderedDict = OrderedDict()  # shard index -> (reader, pinned files): the open shards
        self._row_groups = None  # made in the process that reads
        self.turns = Turns()  # held while a thread reads here
        self.remote = Remote(shards, config, tokens, _tagged, specs)  # where a shard's files come from

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
        with self.turns.lock():  # threads sharing this reader take turns (Turns)
            while True:
                shard_idx, rows = locate(np.asarray(ids, np.int64), self.offsets)
                try:
                    return self._build(shard_idx, rows, epoch, alloc, cross, shared)
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
        needed = dict.fromkeys(shard_idx.tolist())
        spans.note("shards", list(needed))
        for s in needed:
            if self.bad[s]:
                raise _tagged(ShardError(f"shard {self.shards[s].path} was skipped earlier"), s)
        self._open_all({s: rows[shard_idx == s] for s in needed})
        groups = []  # (shard, reader, positions, rows) per shard, in first-seen order
        for s in needed:
            pos = np.nonzero(shard_idx == s)[0]
            groups.append((s, self.readers[s][0], pos, rows[pos]))
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
            with spans.within("decode"):
                return decode.arrays(flat, present, spec, alloc, self.float_dtype)
        values: list = [None] * n
        for s, reader, pos, r in groups:
            if reader.has(name):
                for p, v in zip(pos.tolist(), _guard(s, lambda: reader.values(name, r))):
                    values[p] = v
        try:
            with spans.within("decode"):
                return decode.column(spec, values, alloc)
        except decode.DecodeFailed as e:
            s = next(s for s, _, pos, _ in groups if e.index in pos)
            raise _tagged(ShardError(f"shard {self.shards.url(s)}: cannot decode field "
                                     f"{name!r} of an image in it ({e}); rebuild the dataset"), s) from e

    def _open_all(self, needs: dict) -> None:
        """Open the shards of `needs` ({shard: the rows read of it}) that are not open, or are open
        over rows read by range (these rows may not be among them): their files come from
        `remote`, all at once. At most MAX_OPEN_SHARDS stay open, the least recently read closed."""
        ask = {s: r for s, r in needs.items() if s not in self.readers or self.readers[s][1].partial is not None}
        if self._row_groups is None:  # created lazily, in the process that reads: caches are per process
            self._row_groups = ByteLRU(ROW_GROUP_CACHE_BYTES)
        # A remote shard's files: the time blocked here is the batch's network wait (what fetching
        # ahead did not hide); a local one's: pinning the files (a cache lookup).
        with spans.within("network wait" if self.remote.remote and ask else "fetch"):
            got = self.remote.pinned(ask) if ask else {}
        try:
            for s, pinned in list(got.items()):
                entry = self.readers.get(s)
                if entry is None or entry[1] is not pinned:
                    if entry is not None:  # its whole file came: the rows read by range go
                        self.close(s)
                    self.readers[s] = (self._open(s, pinned, ask[s]), pinned)
                del got[s]
        finally:
            for s, pinned in got.items():  # not opened (another failed first): unpinned now
                if self.readers.get(s, (None, None))[1] is not pinned:
                    self.remote.closed(s, pinned)
        for s in needs:
            self.readers.move_to_end(s)
        while len(self.readers) > MAX_OPEN_SHARDS and next(iter(self.readers)) not in needs:
            self.close(next(iter(self.readers)))

    def shard(self, s: int, rows=()):
        """The open reader of shard s (opened as a batch would open it: through the shard cache,
        its checks made), where `rows` can be read; for ds[i], ds.get and the shard's keys."""
        self._open_all({s: np.asarray(rows, np.int64)})
        return self.readers[s][0]

    def _open(self, s: int, pinned, rows):
        """A reader of shard s over `pinned` (its files stay in the cache until close(s) unpins
        them). A cached copy deleted behind the cache's back is fetched again, once."""
        url = self.shards.url(s)
        try:
            try:
                return self._reader_of(s, pinned)
            except FileNotFoundError:
                if not self.remote.cache(s).remote:
                    raise
                pinned = self.remote.pinned({s: rows})[s]
                return self._reader_of(s, pinned)
        except ShardError as e:
            raise _tagged(e, s)
        except FileNotFoundError as e:
            raise _tagged(missing_shard(url, e), s) from e
        except OSError as e:
            raise _tagged(ShardError(f"cannot open shard {url}: {e}"), s) from e

    def _reader_of(self, s: int, pinned):
        shard, url = self.shards[s], self.shards.url(s)
        if pinned.partial is not None:
            url = f"{url} (rows read by range)"
        elif self.remote.cache(s).remote:  # complete when fetched: a later mismatch may be damage to this copy
            url = f"{url} (cached copy {pinned.path}: delete it to fetch the shard again)"
        try:
            if self.tokens is not None and self.tokens.packed:
                reader = self.tokens.open(pinned.path, shard, url, self._row_groups)
            else:
                reader = open_shard(pinned.path, shard, self.specs, url, index_path=pinned.index,
                                    cache=self._row_groups, checks=self.config.checksums, partial=pinned.partial)
        except BaseException:
            self.remote.closed(s, pinned)
            raise
        pinned.release_index()
        return reader

    def close(self, s: int) -> None:
        """Close shard s here and unpin its cached files (they may be evicted now)."""
        with self.turns.lock():
            entry = self.readers.pop(s, None)
            if entry is not None:
                self.remote.closed(s, entry[1])

    def __getstate__(self):
        state = self.__dict__.copy()
        state["readers"], state["_row_groups"] = OrderedDict(), None
        return state


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

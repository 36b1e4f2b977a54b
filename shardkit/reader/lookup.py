"""Random access on one dataset: a sample by its global index or by its key, read as streaming reads it.

Both go through the dataset's BatchReader, so a looked-up sample is decoded and checksum-checked
(check_digests) exactly as a streamed one: a tar sample is sliced out of the mapped shard by its
index sidecar's offsets, a Parquet value by its page offsets (or its row group). Nothing reads a
whole shard for one sample, apart from the shard's keys (the index sidecar's key column, a Parquet
shard's key column) when a key is looked up. A remote tar sample is read by range (its index,
cached, then its bytes: reader.ranged); a remote Parquet shard comes whole through the shard cache.
"""

from __future__ import annotations

import bisect
import operator

import numpy as np

from shardkit.errors import ConfigError, IndexOutOfRange, SampleNotFound, ShardError
from shardkit.reader import decode
from shardkit.reader.base import length
from shardkit.reader.partition import locate

LOOKUP_EPOCH = 0  # an augmented field shows its epoch-0 variant, as the first epoch streams it


MISSING = object()  # get(key) without a default: a missing key raises


class Lookup:
    """`sample(i)` and `get(key)` for a StreamingDataset (made by its `lookup` property)."""

    def __init__(self, ds):
        self.ds = ds
        self.total = int(ds.counts.sum())
        self.first, self.last = ds.shards.key_bounds()
        self._index_bounds()
        # A shard a lookup opened stays open (pinned in the shard cache) for the next lookup; under
        # a remote cache_limit only the last one does, or lookups over many shards would pin them
        # all (up to the reader's open-shard limit) and fill the cache past its limit.
        self.bounded = ds.reader.remote.bounded
        self._own: int | None = None

    def _index_bounds(self) -> None:
        """Shards with keys, in order, and their last keys, when one binary search can find a key's
        shard: every non-empty shard has bounds and they ascend without overlap (as builds write them)."""
        held = np.nonzero(np.asarray(self.ds.counts) > 0)[0]
        first, last = self.first[held].tolist(), self.last[held].tolist()
        self.unbounded = sum(f is None for f in first)
        ordered = not self.unbounded and all(a <= b for a, b in zip(first, last)) and all(
            b < a for b, a in zip(last[:-1], first[1:]))
        self.held, self.lasts = (held, last) if ordered else (None, None)

    def check_index(self, index) -> int:
        """`index` as a global sample id: negative counts from the end, as a Python sequence does."""
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"dataset indices are integers (use ds.get(key) for a key), not "
                            f"{type(index).__name__}: {index!r}") from None
        n = self.total
        if not -n <= i < n:
            raise IndexOutOfRange(f"index {i} is out of range for dataset {self.ds.src}: it has {n} samples, "
                                  f"valid indices are 0..{n - 1} (or -{n}..-1 from the end)")
        return i + n if i < 0 else i

    def sample(self, i: int) -> dict:
        """Sample i (0 <= i < total), decoded as streaming yields it, the dataset's transform applied."""
        ids = self._stored_ids(i)
        with self.ds.reader.turns.lock():  # threads sharing the dataset take turns (batches.Turns)
            if self.bounded:  # the read below locates the shard itself; this is only for the pin bookkeeping
                self._visit(int(locate(ids, self.ds.reader.offsets)[0][0]))
            batch = self.ds.reader.read(ids, LOOKUP_EPOCH)
        if not length(batch):  # on_error='skip' left it out: say so rather than return nothing
            raise ShardError(f"sample {i} of dataset {self.ds.src} cannot be read: its shard or its bytes failed "
                             "their checks (on_error='skip' left it out; the log says why)")
        sample = decode.unbatch(batch, 0)
        return self.ds.transform(sample) if self.ds.transform else sample

    def _stored_ids(self, i: int) -> np.ndarray:
        """Sample i as the reader's id (under where=, i counts kept samples only)."""
        ids = np.array([i], np.int64)
        return ids if self.ds.selection is None else self.ds.selection.stored(ids)

    def stored(self, i: int, field: str):
        """Field `field` of sample i as stored (an image's encoded bytes), checksum-checked, undecoded."""
        s, rows = locate(self._stored_ids(i), self.ds.reader.offsets)
        s, row = int(s[0]), int(rows[0])
        self._visit(s)
        reader = self.ds.reader.shard(s, [row])
        value = reader.values(field, [row])[0] if reader.has(field) else None
        return bytes(value) if isinstance(value, (memoryview, bytearray)) else value

    def get(self, key: str, default=MISSING):
        """The sample whose key is `key`; `default` (when given) if there is none, else SampleNotFound."""
        i = self.index_of(key)
        if i is not None:
            return self.sample(i)
        if default is not MISSING:
            return default
        raise self.not_found(key)

    def not_found(self, key: str) -> SampleNotFound:
        """The error for a key the dataset does not hold."""
        where = self.ds.config.where
        among = f"among the {self.total} samples where={where!r} keeps" if where else f"({self.total} samples)"
        return SampleNotFound(f"no sample has key {key!r} in dataset {self.ds.src} {among}; keys "
                             "are case-sensitive and have no field suffix (e.g. 'class0/img1', not "
                             "'class0/img1.jpg'); `shardkit show DATASET '#0'` prints the first sample's key")

    def index_of(self, key: str) -> int | None:
        """The global index of the sample whose key is `key`, or None.

        The shard comes from the key bounds the manifest records per shard: one binary search over
        them, then one in the shard's sorted keys. A dataset written before bounds were recorded has
        none: its shards' keys are scanned, one shard at a time until the key is found, and each
        scanned shard's bounds are kept, so each shard is scanned at most once per process."""
        if not isinstance(key, str):
            raise TypeError(f"ds.get takes a sample key (str), not {type(key).__name__}: {key!r}; "
                            "use ds[i] for an index")
        tokens = self.ds.tokens
        if tokens is not None and tokens.packed:
            raise ConfigError(f"dataset {self.ds.src} holds packed token rows, which have no keys: "
                              "read a row by its index, ds[i]")
        for s in self._candidates(key):
            row = self._row(s, key)
            if row is not None:  # under where=, ids count kept samples: a sample left out has none
                selection = self.ds.selection
                if selection is None:
                    return int(self.ds.reader.offsets[s]) + row
                rank = selection.rank(s, row)
                return None if rank is None else int(selection.offsets[s]) + rank
        return None

    def _candidates(self, key: str):
        """Shard indexes that may hold `key`: those whose bounds take it in, then those without bounds."""
        if self.held is not None:
            j = bisect.bisect_left(self.lasts, key)  # the first shard whose last key is >= key
            if j < len(self.lasts) and self.first[self.held[j]] <= key:
                yield int(self.held[j])
            return
        known = [s for s, (f, la) in enumerate(zip(self.first, self.last)) if f is not None and f <= key <= la]
        yield from known
        for s in np.nonzero(np.asarray(self.ds.counts) > 0)[0].tolist():
            if self.first[s] is None:  # not scanned yet (bounds are recorded as shards are scanned)
                yield s

    def _row(self, s: int, key: str) -> int | None:
        """The row of `key` in shard s (its keys are sorted), or None; records the shard's bounds."""
        self._visit(s)
        keys = self.ds.reader.shard(s).keys
        if len(keys) and self.first[s] is None:
            self.first[s], self.last[s] = keys[0], keys[-1]
            self.unbounded -= 1
            if not self.unbounded:  # every shard scanned once: binary search from now on
                self._index_bounds()
        r = bisect.bisect_left(keys, key)
        return r if r < len(keys) and keys[r] == key else None

    def _visit(self, s: int) -> None:
        """Before a lookup reads shard s: under a remote cache_limit, close the shard the previous
        lookup opened (unpinned, the cache may evict it) and note s if this lookup opens it."""
        if not self.bounded:
            return
        reader = self.ds.reader
        if self._own is not None and self._own != s:
            reader.close(self._own)
            self._own = None
        if s not in reader.readers:
            self._own = s


"""A remote tar shard's rows read by ranged GETs, for a batch that cannot wait for whole shards.

A worker's first batch of an epoch draws its samples from a whole shuffle block: with the default
16,384-sample block, ~150 shards of 16 MB of raw 224² images. Waiting for them all before the first
batch took seconds; reading just the batch's samples (one GET per sample, its members side by side
in the tar) from the offsets in the shard's index sidecar takes a few round trips, while the whole
shards keep downloading for the batches after it. Each value read this way is checked against the
xxh3 the index records (so this is used only with checksums on), exactly as a mapped shard's.
"""

from __future__ import annotations

import numpy as np

from shardkit.contract import CHECKSUM_SUFFIX, ShardInfo
from shardkit.errors import ShardError
from shardkit.fs import RemoteError, filesystem, with_retries
from shardkit.reader.download import RangeIgnored
from shardkit.reader.shards import TarShard, _index_bytes


class RangedTar(TarShard):
    """The rows `rows` of a remote tar shard, read by one ranged GET per row on `pool`; reads the
    same values as a TarShard over the whole file (values, fill, keys, has) for those rows only."""

    def __init__(self, url: str, index_path: str, shard: ShardInfo, specs: dict, rows, pool, policy):
        import pyarrow.parquet as pq

        self.url, self.specs, self.checks = url, specs, True
        try:
            t = pq.read_table(_index_bytes(index_path, shard, url, True))
        except ShardError:
            raise
        except Exception as e:  # pyarrow errors: the index cannot be used
            raise ShardError(f"cannot open shard {url}: {type(e).__name__}: {e}; rebuild the dataset") from e
        self.keys = t.column("__key__").to_pylist()
        fields = [n[:-7] for n in t.column_names if n.endswith(".offset")]
        offsets = {f: t.column(f + ".offset").to_numpy().astype(np.int64) for f in fields}
        self.sizes = {f: t.column(f + ".size").to_numpy().astype(np.int64) for f in fields}
        self.sums = {f: t.column(f + CHECKSUM_SUFFIX).to_numpy() for f in fields
                     if f + CHECKSUM_SUFFIX in t.column_names}
        rows = np.unique(np.asarray(rows, np.int64))
        spans = _spans(offsets, self.sizes, rows)
        data = _fetch(url, spans, pool, policy)
        # One buffer of the rows' spans; each value's offset moved into it (-1 stays: absent).
        self.mm = b"".join(data)
        self.buf = np.frombuffer(self.mm, np.uint8)
        base = np.cumsum([0] + [len(d) for d in data[:-1]])
        self.offsets = {}
        for f, offs in offsets.items():
            moved = np.full(len(offs), -1, np.int64)
            o = offs[rows]
            moved[rows] = np.where(o >= 0, base + o - spans[:, 0], -1)
            self.offsets[f] = moved


def _spans(offsets: dict, sizes: dict, rows: np.ndarray) -> np.ndarray:
    """(start, end) of the bytes that hold each row's present members (adjacent in the tar)."""
    lo = np.full(len(rows), np.iinfo(np.int64).max)
    hi = np.zeros(len(rows), np.int64)
    for f, offs in offsets.items():
        o, s = offs[rows], sizes[f][rows]
        present = o >= 0
        lo = np.where(present, np.minimum(lo, o), lo)
        hi = np.where(present, np.maximum(hi, o + s), hi)
    lo = np.where(hi > 0, lo, 0)  # a row with no member at all: an empty span
    return np.stack([lo, hi], axis=1)


def _fetch(url: str, spans: np.ndarray, pool, policy) -> list[bytes]:
    """The bytes of each span, GETs in parallel on `pool`, each retried alone."""
    fs, path = filesystem(url, policy)

    def one(span) -> bytes:
        start, end = int(span[0]), int(span[1])
        if end <= start:
            return b""

        def get() -> bytes:
            data = fs.cat_file(path, start=start, end=end)
            if len(data) != end - start:
                raise RangeIgnored(f"asked bytes {start}-{end - 1}, got {len(data)} bytes")
            return data

        return with_retries(url, policy, get)

    try:
        return list(pool.map(one, spans))
    except RemoteError as e:
        if isinstance(e.__cause__, RangeIgnored):
            raise RangeIgnored(str(e)) from e
        raise ShardError(f"cannot fetch shard {url}: {e.detail}") from e

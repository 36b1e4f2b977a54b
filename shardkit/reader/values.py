"""Stored values out of shard files: slices by offset, the row-group LRU, and the checksum check."""

from __future__ import annotations

import json
import os
from collections import OrderedDict

import numpy as np

from shardkit.contract import CHECKSUM_SUFFIX, ShardInfo
from shardkit.errors import ChecksumMismatch, ShardError

ROW_GROUP_CACHE_BYTES = 1 << 30  # per worker: holds a shuffle window of decoded Parquet row groups


def stored_value(spec: dict, data):
    """Tar member bytes -> the stored Python form: bytes, int, str or dict."""
    kind = spec["kind"]
    if kind == "int":
        return int(bytes(data))
    if kind == "text":
        return bytes(data).decode("utf-8")
    if kind == "json":
        return json.loads(bytes(data))
    return data


def stored_values(spec: dict, data: list, where: tuple, keys, rows) -> list:
    """stored_value of each of `data` (None stays None), called only once their checksums passed, so
    damaged bytes are a ChecksumMismatch, not a UnicodeDecodeError. Unchecked bytes (a dataset
    without checksums, or checks off) that do not parse are a ShardError naming the sample.
    `where` is (shard url, field); rows[i] is the shard row of data[i]."""
    if spec["kind"] not in ("int", "text", "json"):
        return data
    out = []
    for i, v in enumerate(data):
        try:
            out.append(None if v is None else stored_value(spec, v))
        except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, int('?')
            raise ShardError(f"shard {where[0]}: field {where[1]!r} of sample {keys[int(rows[i])]!r} is not valid "
                             f"{spec['kind']} ({type(e).__name__}: {e}): the shard is corrupt; restore or rebuild "
                             "it (StreamingDataset(checksums=True) names such samples, on_error='skip' skips the "
                             "shard)") from e
    return out


def _bytes_digest():
    """contract.checksum for bytes-like values, without its type dispatch: the tar loops call it
    on every member they read."""
    import xxhash

    return xxhash.xxh3_64_intdigest


def check_digests(url: str, field: str, keys, rows, digests, expected) -> None:
    """The one check of values read against the checksums the writer recorded, whatever the format
    and however the values were gathered: `digests[i]` (contract.checksum of the bytes read) must
    equal `expected[i]` for the value of `field` at shard row `rows[i]`.

    `expected` None means nothing to check against: a dataset written before checksums were
    recorded, or checks turned off (StreamingDataset(checksums=False)). A mismatch raises
    ChecksumMismatch naming the shard, the field and the keys.
    """
    if expected is None or not len(digests):
        return
    expected = np.asarray(expected, np.uint64)
    if expected.tolist() == list(digests):  # the common case, as cheap as it gets per batch
        return
    bad = np.nonzero(np.fromiter(digests, np.uint64, len(digests)) != expected)[0]
    bad_rows = np.asarray(rows, np.int64)[bad]
    named = ", ".join(repr(keys[r]) for r in bad_rows[:3].tolist()) + (" …" if len(bad) > 3 else "")
    raise ChecksumMismatch(
        f"shard {url}: field {field!r} of {len(bad)} sample(s) ({named}) differs from the checksum recorded "
        "at build time: the shard is corrupt; restore or rebuild it (StreamingDataset(on_error='skip') leaves "
        "such samples out and counts them)", bad_rows)


class ByteLRU:
    """A least-recently-used cache bounded by the bytes of what it holds."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes, self.items = max_bytes, 0, OrderedDict()

    def get(self, key, load):
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key][0]
        value, size = load()
        self.items[key] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes and len(self.items) > 1:
            _, (_, old) = self.items.popitem(last=False)
            self.bytes -= old
        return value


def _check_size(path: str, shard: ShardInfo, url: str) -> None:
    size = os.path.getsize(path)
    if size != shard.bytes:
        raise ShardError(f"shard {url} has {size} bytes, the manifest says {shard.bytes}: it is truncated or "
                         "was replaced; rebuild the dataset (or delete the cached copy to refetch it)")


def gather(buf: np.ndarray, offs: np.ndarray, sizes: np.ndarray, out: np.ndarray, positions, where: tuple,
           hashed: bool = False):
    """Copy the fixed-size values at byte offsets `offs` of a mapped file into out[positions] (-1:
    absent): one slice copy per value, no decode. Returns the presence mask and, when `hashed`,
    the checksum of each value copied (for check_digests). `where` is (shard url, field)."""
    nbytes = out.shape[1]
    present = offs >= 0
    if np.any(sizes[present] != nbytes):
        raise ShardError(f"shard {where[0]}: field {where[1]!r} has a value that is not {nbytes} bytes; "
                         "rebuild the dataset")
    pairs = zip(offs[present].tolist(), np.asarray(positions)[present].tolist())
    if not hashed:
        for o, p in pairs:
            out[p] = buf[o:o + nbytes]
        return present, None
    digest, digests = _bytes_digest(), []
    for o, p in pairs:
        member = buf[o:o + nbytes]
        # Copied, then hashed while it is still in the CPU cache: the copy streams it in from
        # memory once; hashing first measured 2-3x the cost (bench/checksum_bench.py).
        out[p] = member
        digests.append(digest(member))
    return present, digests


def values_checked(shard: ShardInfo, path: str, index_path: str | None) -> bool:
    """Whether every value of this shard file is checked against a checksum that the manifest
    vouches for, so that a checked read needs no whole-file sha256 as well: a tar shard whose index
    sidecar (checked whole against the manifest's sha256) records `<field>.xxh3` for each field, a
    Parquet shard whose `<field>.xxh3` columns (and keys) the manifest records a digest of
    (ShardInfo.sums, checked when the shard opens).

    A Parquet shard of a build before `sums` is not: its checksum columns travel inside the file
    they check, so a shard replaced by another build's (same size) would pass them all; its
    whole-file sha256 is checked as it is fetched. False too for shards written before checksums,
    and packed token rows."""
    import pyarrow.parquet as pq

    try:
        if shard.format == "tar":
            names = pq.read_schema(index_path).names if index_path else []
            fields = [n[:-len(".offset")] for n in names if n.endswith(".offset")]
        elif shard.format == "parquet" and shard.sums:
            names = pq.read_schema(path).names
            fields = [n for n in names if not n.startswith("__") and not n.endswith(CHECKSUM_SUFFIX)]
        else:
            return False
    except Exception:  # an unreadable file: let the sha256 say what is wrong with it
        return False
    return bool(fields) and all(f + CHECKSUM_SUFFIX in names for f in fields)

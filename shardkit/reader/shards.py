"""Shard readers: tar members sliced by index offsets, Parquet row groups; stored values, no decode."""

from __future__ import annotations

import functools
import json
import mmap
import os
from collections import OrderedDict

import numpy as np

from shardkit.errors import ChecksumMismatch, ShardError
from shardkit.fs import is_remote, join, local_path
from shardkit.manifest import Manifest
from shardkit.sample import Sample
from shardkit.contract import CHECKSUM_SUFFIX, ShardInfo, checksum

BLOCK = 512
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


def _scan_tar(path: str) -> tuple[list[str], dict[str, tuple[list[int], list[int]]]]:
    """Member offsets by parsing headers, for tars without an index sidecar."""
    import tarfile

    keys, where = [], {}
    with tarfile.open(path, "r:") as tf:
        for m in tf:
            if not m.isfile() or "." not in m.name:
                continue
            key, field = m.name.split(".", 1)
            if not keys or keys[-1] != key:
                keys.append(key)
            where[(key, field)] = (m.offset_data, m.size)
    fields = sorted({f for _, f in where})
    cols = {f: ([where.get((k, f), (-1, -1))[0] for k in keys], [where.get((k, f), (-1, -1))[1] for k in keys])
            for f in fields}
    return keys, cols


class TarShard:
    """One tar shard, memory-mapped; members are found through the index sidecar's offsets."""

    def __init__(self, path: str, shard: ShardInfo, specs: dict, index_path: str | None, url: str,
                 checks: bool = True):
        import pyarrow.parquet as pq

        self.url, self.specs = url, specs
        self.sums: dict[str, np.ndarray] = {}  # field -> checksum per row (absent: nothing to check)
        try:
            _check_size(path, shard, url)
            with open(path, "rb") as f:
                self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self.buf = np.frombuffer(self.mm, np.uint8)
            if index_path is not None:
                t = pq.read_table(index_path)
                self.keys = t.column("__key__").to_pylist()
                cols = {n[:-7]: (t.column(n).to_numpy(), t.column(n[:-7] + ".size").to_numpy())
                        for n in t.column_names if n.endswith(".offset")}
                if checks:
                    self.sums = {f: t.column(f + CHECKSUM_SUFFIX).to_numpy() for f in cols
                                 if f + CHECKSUM_SUFFIX in t.column_names}
            else:
                self.keys, cols = _scan_tar(path)
            self.offsets = {f: np.asarray(o, np.int64) for f, (o, _) in cols.items()}
            self.sizes = {f: np.asarray(s, np.int64) for f, (_, s) in cols.items()}
        except (ShardError, FileNotFoundError):  # a missing file: the caller may fetch it again
            raise
        except Exception as e:  # pyarrow/OS errors: all mean the shard cannot be used
            raise ShardError(f"cannot open shard {url}: {type(e).__name__}: {e}; rebuild the dataset") from e
        if len(self.keys) != shard.samples:
            raise ShardError(f"shard {url} indexes {len(self.keys)} samples, the manifest says {shard.samples}; "
                             "rebuild the dataset")
        self._check_headers()

    def _check_headers(self) -> None:
        """Each member's tar header must name `{key}.{field}`: catches shifted or overwritten data."""
        for field, offs in self.offsets.items():
            sizes = self.sizes[field]
            if len(offs) and int((offs + sizes).max()) > len(self.buf):
                raise ShardError(f"shard {self.url}: member data runs past the end of the file; rebuild the dataset")
            for key, off in zip(self.keys, offs.tolist()):
                if off < 0:
                    continue
                name = f"{key}.{field}".encode()
                stored = self.mm[off - BLOCK:off - BLOCK + 100].rstrip(b"\0")
                if not (name.startswith(stored) and len(stored) >= min(len(name), 99)):
                    raise ShardError(f"shard {self.url} is corrupt: the header before {key}.{field} reads "
                                     f"{stored[:40]!r}; rebuild the dataset")

    def has(self, field: str) -> bool:
        return field in self.offsets

    def values(self, field: str, rows) -> list:
        """Stored values (bytes for media, int, str, dict) of `field` at `rows`; None where absent."""
        spec, offs, sizes = self.specs[field], self.offsets[field], self.sizes[field]
        sums = self.sums.get(field)
        out, read, digests = [], [], []
        digest = _bytes_digest()
        for r in rows:
            o, s = int(offs[r]), int(sizes[r])
            if o < 0:
                out.append(None)
                continue
            data = self.mm[o:o + s]
            if sums is not None:
                read.append(r)
                digests.append(digest(data))
            out.append(stored_value(spec, data))
        check_digests(self.url, field, self.keys, read, digests, None if sums is None else sums[read])
        return out

    def fill(self, field: str, rows, out: np.ndarray, positions) -> np.ndarray:
        """Copy fixed-size values into out[positions] (rows of bytes); returns a presence mask."""
        nbytes = out.shape[1]
        offs, sizes = self.offsets[field][rows], self.sizes[field][rows]
        present = offs >= 0
        if np.any(sizes[present] != nbytes):
            raise ShardError(f"shard {self.url}: field {field!r} has a member that is not {nbytes} bytes; "
                             "rebuild the dataset")
        buf, sums = self.buf, self.sums.get(field)
        pairs = zip(offs[present].tolist(), np.asarray(positions)[present].tolist())
        if sums is None:
            for o, p in pairs:
                out[p] = buf[o:o + nbytes]
            return present
        digest, digests = _bytes_digest(), []
        for o, p in pairs:
            member = buf[o:o + nbytes]
            # Copied, then hashed while it is still in the CPU cache: the copy streams it in from
            # memory once; hashing first measured 2-3x the cost (bench/checksum_bench.py).
            out[p] = member
            digests.append(digest(member))
        read = np.asarray(rows)[present]
        check_digests(self.url, field, self.keys, read, digests, sums[read])
        return present


class ParquetShard:
    """One Parquet shard; row groups are read on demand (only the needed columns) into an LRU."""

    def __init__(self, path: str, shard: ShardInfo, specs: dict, url: str, cache: ByteLRU, checks: bool = True):
        import pyarrow.parquet as pq

        self.url, self.specs, self.cache, self.path, self.checks = url, specs, cache, path, checks
        try:
            _check_size(path, shard, url)
            self.pf = pq.ParquetFile(path, memory_map=True)
            meta = self.pf.metadata
            counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            self.columns = set(self.pf.schema_arrow.names)
        except (ShardError, FileNotFoundError):  # a missing file: the caller may fetch it again
            raise
        except Exception as e:
            raise ShardError(f"cannot open shard {url}: {type(e).__name__}: {e}; rebuild the dataset") from e
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.starts[-1] != shard.samples:
            raise ShardError(f"shard {url} holds {self.starts[-1]} rows, the manifest says {shard.samples}; "
                             "rebuild the dataset")

    def has(self, field: str) -> bool:
        return field in self.columns

    def _group(self, i: int, field: str):
        def load():
            try:
                arr = self.pf.read_row_group(i, columns=[field]).column(0).combine_chunks()
            except Exception as e:
                raise ShardError(f"shard {self.url}: cannot read row group {i} column {field!r} "
                                 f"({type(e).__name__}: {e}); rebuild the dataset") from e
            return arr, arr.nbytes
        return self.cache.get((self.path, i, field), load)

    def _sums(self, g: int, field: str, local) -> np.ndarray | None:
        """Recorded checksums of `field` at rows `local` of row group g (None: none recorded, or checks off)."""
        name = field + CHECKSUM_SUFFIX
        if not self.checks or name not in self.columns:
            return None
        sums = self._group(g, name)
        if sums.null_count:  # null beside a null value; to_numpy would turn the column into floats
            sums = sums.fill_null(0)
        return sums.to_numpy(zero_copy_only=False)[local]

    def _by_group(self, rows):
        rows = np.asarray(rows, np.int64)
        groups = np.searchsorted(self.starts, rows, side="right") - 1
        for g in np.unique(groups):
            sel = np.nonzero(groups == g)[0]
            yield int(g), sel, rows[sel] - self.starts[g]

    def values(self, field: str, rows) -> list:
        """Stored values of `field` at `rows` (binary as bytes, json parsed); None where null."""
        out: list = [None] * len(rows)
        json_field = self.specs[field]["kind"] == "json"
        rows = np.asarray(rows, np.int64)
        for g, sel, local in self._by_group(rows):
            arr, sums = self._group(g, field), self._sums(g, field, local)
            read, digests = [], []
            for k, (j, r) in enumerate(zip(sel.tolist(), local.tolist())):
                v = arr[r].as_py()
                if v is not None and sums is not None:
                    read.append(k)
                    digests.append(checksum(v))
                out[j] = json.loads(v) if json_field and v is not None else v
            if sums is not None:
                check_digests(self.url, field, self.keys, rows[sel[read]], digests, sums[read])
        return out

    def fill(self, field: str, rows, out: np.ndarray, positions) -> np.ndarray:
        """Gather fixed-size binary values into out[positions] straight from Arrow buffers."""
        nbytes = out.shape[1]
        positions = np.asarray(positions)
        present = np.ones(len(rows), bool)
        for g, sel, local in self._by_group(rows):
            arr = self._group(g, field)
            # fixed_size_binary: buffer 1 is the values, contiguous; a view, no copy.
            view = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * nbytes:(arr.offset + len(arr)) * nbytes]
            view = view.reshape(len(arr), nbytes)
            sums = self._sums(g, field, local)
            if arr.null_count:
                valid = arr.is_valid().to_numpy(zero_copy_only=False)[local]
                present[sel] = valid
                sel, local = sel[valid], local[valid]
                sums = None if sums is None else sums[valid]
            out[positions[sel]] = view[local]
            if sums is not None:  # on the bytes gathered, as any gather path would
                digest = _bytes_digest()
                digests = [digest(out[p]) for p in positions[sel].tolist()]  # row views: no copy
                check_digests(self.url, field, self.keys, np.asarray(rows, np.int64)[sel], digests, sums)
        return present

    @functools.cached_property
    def keys(self) -> list[str]:
        import pyarrow.parquet as pq

        try:
            if self.checks:  # the keys column has no checksums of its own: its pages' CRCs cover it
                return pq.read_table(self.path, columns=["__key__"], memory_map=True,
                                     page_checksum_verification=True).column(0).to_pylist()
            return self.pf.read(columns=["__key__"]).column(0).to_pylist()
        except Exception as e:
            raise ShardError(f"shard {self.url}: cannot read keys ({type(e).__name__}: {e}); "
                             "rebuild the dataset") from e


def open_shard(path: str, shard: ShardInfo, specs: dict, url: str, *, index_path: str | None = None,
               cache: ByteLRU | None = None, checks: bool = True):
    """A reader for one local shard file (tar or Parquet); `checks`: verify each value read against
    its recorded checksum (check_digests)."""
    if shard.format == "tar":
        return TarShard(path, shard, specs, index_path, url, checks)
    if shard.format == "parquet":
        return ParquetShard(path, shard, specs, url, cache or ByteLRU(ROW_GROUP_CACHE_BYTES), checks)
    raise ShardError(f"shard {url} has format {shard.format!r}; this reader knows 'tar' and 'parquet'")


def read_shard_samples(root: str, manifest: Manifest, shard: ShardInfo) -> list[Sample]:
    """All samples of one shard, field values in stored form (bytes, int, str, dict), no decoding."""
    url = join(root, shard.path)
    if is_remote(root):
        from shardkit.reader.cache import fetch_to_temp

        with fetch_to_temp(root, shard) as (path, index_path):
            return _read_all(open_shard(path, shard, manifest.fields, url, index_path=index_path))
    index_path = join(local_path(root), shard.index["path"]) if shard.index else None
    try:
        return _read_all(open_shard(join(local_path(root), shard.path), shard, manifest.fields, url,
                                    index_path=index_path))
    except FileNotFoundError as e:
        raise missing_shard(url, e) from e


def missing_shard(url: str, error: FileNotFoundError) -> ShardError:
    """The error for a local shard file that is not there."""
    return ShardError(f"shard {url} is missing ({error.strerror}: {error.filename}); the dataset folder is "
                      "incomplete: restore it or rebuild it with `shardkit build`")


def _read_all(reader) -> list[Sample]:
    keys = reader.keys
    rows = np.arange(len(keys))
    columns = {f: reader.values(f, rows) for f in reader.specs if reader.has(f)}
    samples = []
    for i, key in enumerate(keys):
        fields = {f: (bytes(v) if isinstance(v, (memoryview, bytearray)) else v)
                  for f, col in columns.items() if (v := col[i]) is not None}
        samples.append(Sample(key, fields))
    return samples

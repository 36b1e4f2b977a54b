"""Shard readers: tar members sliced by index offsets, Parquet row groups; stored values, no decode."""

from __future__ import annotations

import functools
import json
import mmap
import os
from collections import OrderedDict

import numpy as np

from shardkit.contract import ShardInfo, fixed_nbytes
from shardkit.errors import ShardError
from shardkit.fs import is_remote, join, local_path
from shardkit.manifest import Manifest
from shardkit.reader import parquet_pages
from shardkit.sample import Sample

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

    def __init__(self, path: str, shard: ShardInfo, specs: dict, index_path: str | None, url: str):
        import pyarrow.parquet as pq

        self.url, self.specs = url, specs
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
            else:
                self.keys, cols = _scan_tar(path)
            self.offsets = {f: np.asarray(o, np.int64) for f, (o, _) in cols.items()}
            self.sizes = {f: np.asarray(s, np.int64) for f, (_, s) in cols.items()}
        except ShardError:
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
        out = []
        for r in rows:
            o, s = int(offs[r]), int(sizes[r])
            out.append(None if o < 0 else stored_value(spec, self.mm[o:o + s]))
        return out

    def fill(self, field: str, rows, out: np.ndarray, positions) -> np.ndarray:
        """Copy fixed-size values into out[positions] (rows of bytes); returns a presence mask."""
        return gather(self.buf, self.offsets[field][rows], self.sizes[field][rows], out, positions,
                      (self.url, field))


def gather(buf: np.ndarray, offs: np.ndarray, sizes: np.ndarray, out: np.ndarray, positions, where: tuple):
    """Copy the fixed-size values at byte offsets `offs` of a mapped file into out[positions]
    (-1: absent); returns the presence mask. One slice copy per value, no decode. `where` is
    (shard url, field), for the error."""
    nbytes = out.shape[1]
    present = offs >= 0
    if np.any(sizes[present] != nbytes):
        raise ShardError(f"shard {where[0]}: field {where[1]!r} has a value that is not {nbytes} bytes; "
                         "rebuild the dataset")
    for o, p in zip(offs[present].tolist(), np.asarray(positions)[present].tolist()):
        out[p] = buf[o:o + nbytes]
    return present


class ParquetShard:
    """One Parquet shard. Uncompressed PLAIN media and fixed-size columns (what shardkit writes)
    are sliced out of the memory-mapped file by value offsets, as tar members are; any other
    column is read a row group at a time (only the needed column) into an LRU."""

    def __init__(self, path: str, shard: ShardInfo, specs: dict, url: str, cache: ByteLRU):
        import pyarrow.parquet as pq

        self.url, self.specs, self.cache, self.path = url, specs, cache, path
        try:
            _check_size(path, shard, url)
            self.pf = pq.ParquetFile(path, memory_map=True)
            meta = self.pf.metadata
            counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            self.columns = set(self.pf.schema_arrow.names)
            with open(path, "rb") as f:
                self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ShardError:
            raise
        except Exception as e:
            raise ShardError(f"cannot open shard {url}: {type(e).__name__}: {e}; rebuild the dataset") from e
        self.buf = np.frombuffer(self.mm, np.uint8)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.starts[-1] != shard.samples:
            raise ShardError(f"shard {url} holds {self.starts[-1]} rows, the manifest says {shard.samples}; "
                             "rebuild the dataset")
        self._direct: dict = {}  # field -> (offsets, sizes) of every row's value, or None
        self._int_columns: dict = {}

    def has(self, field: str) -> bool:
        return field in self.columns

    def direct(self, field: str):
        """(offsets, sizes) of each row's value in the file (-1 where null), or None when the
        column is not stored uncompressed and PLAIN; computed once per field from page headers."""
        if field not in self._direct:
            self._direct[field] = self._value_offsets(field)
        return self._direct[field]

    def _value_offsets(self, field: str):
        spec = self.specs[field]
        if spec["kind"] in ("int", "text", "json"):
            return None
        meta = self.pf.metadata
        j = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == field), None)
        if j is None:
            return None
        chunks = [parquet_pages.chunk_offsets(self.mm, meta.row_group(g).column(j), meta.schema.column(j),
                                              fixed_nbytes(spec)) for g in range(meta.num_row_groups)]
        if not chunks or any(c is None for c in chunks):
            return None
        return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])

    def _group(self, i: int, field: str):
        def load():
            try:
                arr = self.pf.read_row_group(i, columns=[field]).column(0).combine_chunks()
            except Exception as e:
                raise ShardError(f"shard {self.url}: cannot read row group {i} column {field!r} "
                                 f"({type(e).__name__}: {e}); rebuild the dataset") from e
            return arr, arr.nbytes
        return self.cache.get((self.path, i, field), load)

    def _by_group(self, rows):
        rows = np.asarray(rows, np.int64)
        groups = np.searchsorted(self.starts, rows, side="right") - 1
        for g in np.unique(groups):
            sel = np.nonzero(groups == g)[0]
            yield int(g), sel, rows[sel] - self.starts[g]

    def _ints(self, field: str):
        """A whole int column (values, validity) as numpy, read once: 8 bytes a row, while a
        row group per sample under shuffle costs a decode each."""
        if field not in self._int_columns:
            try:
                col = self.pf.read(columns=[field]).column(0).combine_chunks()
            except Exception as e:
                raise ShardError(f"shard {self.url}: cannot read column {field!r} ({type(e).__name__}: {e}); "
                                 "rebuild the dataset") from e
            valid = col.is_valid().to_numpy(zero_copy_only=False)
            self._int_columns[field] = (col.fill_null(0).to_numpy(), valid)
        return self._int_columns[field]

    def values(self, field: str, rows) -> list:
        """Stored values of `field` at `rows` (binary as bytes, json parsed); None where null."""
        direct = self.direct(field)
        if direct is not None:
            offs, sizes = direct[0][rows], direct[1][rows]
            return [None if o < 0 else self.mm[o:o + n] for o, n in zip(offs.tolist(), sizes.tolist())]
        if self.specs[field]["kind"] == "int":
            ints, valid = self._ints(field)
            return [v if ok else None for v, ok in zip(ints[rows].tolist(), valid[rows].tolist())]
        out: list = [None] * len(rows)
        json_field = self.specs[field]["kind"] == "json"
        for g, sel, local in self._by_group(rows):
            arr = self._group(g, field)
            for j, r in zip(sel.tolist(), local.tolist()):
                v = arr[r].as_py()
                out[j] = json.loads(v) if json_field and v is not None else v
        return out

    def fill(self, field: str, rows, out: np.ndarray, positions) -> np.ndarray:
        """Gather fixed-size binary values into out[positions]: by offset from the mapped file, else
        from Arrow buffers of the row groups."""
        direct = self.direct(field)
        if direct is not None:
            return gather(self.buf, direct[0][rows], direct[1][rows], out, positions, (self.url, field))
        nbytes = out.shape[1]
        positions = np.asarray(positions)
        present = np.ones(len(rows), bool)
        for g, sel, local in self._by_group(rows):
            arr = self._group(g, field)
            # fixed_size_binary: buffer 1 is the values, contiguous; a view, no copy.
            view = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * nbytes:(arr.offset + len(arr)) * nbytes]
            view = view.reshape(len(arr), nbytes)
            if arr.null_count:
                valid = arr.is_valid().to_numpy(zero_copy_only=False)[local]
                present[sel] = valid
                sel, local = sel[valid], local[valid]
            out[positions[sel]] = view[local]
        return present

    @functools.cached_property
    def keys(self) -> list[str]:
        try:
            return self.pf.read(columns=["__key__"]).column(0).to_pylist()
        except Exception as e:
            raise ShardError(f"shard {self.url}: cannot read keys ({type(e).__name__}: {e}); "
                             "rebuild the dataset") from e


def open_shard(path: str, shard: ShardInfo, specs: dict, url: str, *, index_path: str | None = None,
               cache: ByteLRU | None = None):
    """A reader for one local shard file (tar or Parquet)."""
    if shard.format == "tar":
        return TarShard(path, shard, specs, index_path, url)
    if shard.format == "parquet":
        return ParquetShard(path, shard, specs, url, cache or ByteLRU(ROW_GROUP_CACHE_BYTES))
    raise ShardError(f"shard {url} has format {shard.format!r}; this reader knows 'tar' and 'parquet'")


def read_shard_samples(root: str, manifest: Manifest, shard: ShardInfo) -> list[Sample]:
    """All samples of one shard, field values in stored form (bytes, int, str, dict), no decoding."""
    url = join(root, shard.path)
    if is_remote(root):
        from shardkit.reader.cache import fetch_to_temp

        with fetch_to_temp(root, shard) as (path, index_path):
            return _read_all(open_shard(path, shard, manifest.fields, url, index_path=index_path))
    index_path = join(local_path(root), shard.index["path"]) if shard.index else None
    return _read_all(open_shard(join(local_path(root), shard.path), shard, manifest.fields, url,
                                index_path=index_path))


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

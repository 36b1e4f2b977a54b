"""Shard readers: tar members sliced by index offsets, Parquet values by page offsets or row groups; no decode."""

from __future__ import annotations

import functools
import hashlib
import mmap

import numpy as np

from shardkit.contract import CHECKSUM_SUFFIX, ShardInfo, checksum, fixed_nbytes, sums_digest
from shardkit.errors import ShardError
from shardkit.store.local import is_url, join, local_path
from shardkit.manifest import Manifest
from shardkit.reader import parquet_pages
from shardkit.reader.values import (ROW_GROUP_CACHE_BYTES, ByteLRU, _bytes_digest, _check_size,  # noqa: F401
                                    check_digests, gather, stored_values)
from shardkit.sample import Sample

BLOCK = 512
HEADER_ROWS = 1 << 16  # rows whose tar headers are checked at once (6.5 MB of name fields)


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


def read_index(path: str, shard: ShardInfo, url: str, checks: bool = True):
    """A tar shard's index sidecar, checked whole against the manifest's sha256 (it is read whole
    anyway, and small): a damaged offset, size or column name would otherwise read a value as
    absent or slice the wrong bytes, with nothing else to notice it."""
    import pyarrow as pa

    with open(path, "rb") as f:
        blob = f.read()
    if checks and shard.index.get("sha256") and hashlib.sha256(blob).hexdigest() != shard.index["sha256"]:
        raise ShardError(f"the index of shard {url} ({shard.index['path']}, {len(blob)} bytes) does not match the "
                         "manifest's sha256: it is damaged or was replaced; restore it or rebuild the dataset")
    return pa.BufferReader(blob)


class TarShard:
    """One tar shard, memory-mapped; members are found through the index sidecar's offsets. `partial`:
    in place of `path`, a buffer the shard's size holding the rows read by range (reader.ranged), the
    only ones asked for; their values are checked as any are, the headers between them are not."""

    def __init__(self, path: str | None, shard: ShardInfo, specs: dict, index_path: str | None, url: str,
                 checks: bool = True, partial=None):
        import pyarrow.parquet as pq

        self.url, self.specs = url, specs
        self.sums: dict[str, np.ndarray] = {}  # field -> checksum per row (absent: nothing to check)
        try:
            if partial is None:
                _check_size(path, shard, url)
                with open(path, "rb") as f:
                    self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            else:
                self.mm = partial
            self.buf = np.frombuffer(self.mm, np.uint8)
            if index_path is not None:
                # No reader threads, here or below: pyarrow's thread pools, still running while a process
                # that imported torch exits, aborted it now and then ("terminate called without an
                # active exception", exit 134). pq.read_table starts them even with use_threads=False,
                # as does a ParquetFile opened by path with pre_buffer (its I/O thread); one shard's
                # columns gain nothing from threads.
                t = pq.ParquetFile(read_index(index_path, shard, url, checks)).read(use_threads=False)
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
        if partial is None:
            self._check_headers()

    def _check_headers(self) -> None:
        """Each member's tar header must name `{key}.{field}`: catches shifted or overwritten data.
        The name field (100 bytes, NUL-padded) is compared to the name for a whole field at once:
        the first 99 bytes equal, the last equal or NUL (a 100-byte name may fill it, or leave its
        last byte for the NUL). One row at a time, this was ~2.6 ms of a 1,942-row shard's 6.2 ms open."""
        for field, offs in self.offsets.items():
            sizes = self.sizes[field]
            if len(offs) and int((offs + sizes).max()) > len(self.buf):
                raise ShardError(f"shard {self.url}: member data runs past the end of the file; rebuild the dataset")
            rows = np.flatnonzero(offs >= 0)
            for lo in range(0, len(rows), HEADER_ROWS):  # bounded temporaries for shards of many rows
                self._check_names(field, rows[lo:lo + HEADER_ROWS])

    def _check_names(self, field: str, rows: np.ndarray) -> None:
        starts = self.offsets[field][rows] - BLOCK
        bad = np.flatnonzero(starts < 0)  # no room for a header before the member
        if not len(bad):
            stored = self.buf[starts[:, None] + np.arange(100)]
            names = np.array([f"{self.keys[r]}.{field}".encode() for r in rows.tolist()], dtype="S100")
            want = names.view(np.uint8).reshape(len(rows), 100)
            ok = (stored[:, :99] == want[:, :99]).all(axis=1) & ((stored[:, 99] == 0) | (stored[:, 99] == want[:, 99]))
            bad = np.flatnonzero(~ok)
        if len(bad):
            r, start = int(rows[bad[0]]), max(0, int(starts[bad[0]]))
            stored = bytes(self.mm[start:start + 100]).rstrip(b"\0")
            raise ShardError(f"shard {self.url} is corrupt: the header before {self.keys[r]}.{field} reads "
                             f"{stored[:40]!r}; rebuild the dataset")

    def has(self, field: str) -> bool:
        return field in self.offsets

    def values(self, field: str, rows) -> list:
        """Stored values (bytes for media, int, str, dict) of `field` at `rows`; None where absent."""
        offs, sizes = self.offsets[field], self.sizes[field]
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
            out.append(data)
        check_digests(self.url, field, self.keys, read, digests, None if sums is None else sums[read])
        return stored_values(self.specs[field], out, (self.url, field), self.keys, rows)

    def fill(self, field: str, rows, out: np.ndarray, positions) -> np.ndarray:
        """Copy fixed-size values into out[positions] (rows of bytes); returns a presence mask."""
        sums = self.sums.get(field)
        present, digests = gather(self.buf, self.offsets[field][rows], self.sizes[field][rows], out, positions,
                                  (self.url, field), sums is not None)
        if sums is not None:
            read = np.asarray(rows)[present]
            check_digests(self.url, field, self.keys, read, digests, sums[read])
        return present


class ParquetShard:
    """One Parquet shard. Uncompressed PLAIN media and fixed-size columns (what shardkit writes)
    are sliced out of the memory-mapped file by value offsets, as tar members are; int columns are
    read whole once (8 bytes a row); any other column is read a row group at a time (only the
    needed column) into an LRU. `partial`: in place of `path`, the bytes of some rows read by range
    (reader.ranged_parquet.LandedParquet), the only rows asked for."""

    def __init__(self, path: str | None, shard: ShardInfo, specs: dict, url: str, cache: ByteLRU,
                 checks: bool = True, partial=None):
        import pyarrow.parquet as pq

        self.url, self.specs, self.cache, self.path, self.checks = url, specs, cache, path, checks
        self.partial = partial
        try:
            if partial is None:
                _check_size(path, shard, url)
            self.pf = pq.ParquetFile(_source(self), memory_map=True, pre_buffer=False)  # no I/O thread: see TarShard
            meta = self.pf.metadata
            counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            self.columns = set(self.pf.schema_arrow.names)
            _check_schema(self.pf.schema_arrow, specs, url)
            if partial is None:
                with open(path, "rb") as f:
                    self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            else:
                self.mm = partial.buf
        except (ShardError, FileNotFoundError):  # a missing file: the caller may fetch it again
            raise
        except Exception as e:
            raise ShardError(f"cannot open shard {url}: {type(e).__name__}: {e}; rebuild the dataset") from e
        self.buf = np.frombuffer(self.mm, np.uint8)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.starts[-1] != shard.samples:
            raise ShardError(f"shard {url} holds {self.starts[-1]} rows, the manifest says {shard.samples}; "
                             "rebuild the dataset")
        self._direct: dict = {}  # field -> (offsets, sizes) of every row's value, or None
        self._whole: dict = {}   # int column -> (values, validity), read once
        if checks and shard.sums:
            _check_sums(self, shard.sums)

    def direct(self, field: str):
        """(offsets, sizes) of each row's value in the file (-1 where null), or None when the column
        is not stored uncompressed and PLAIN; computed once per field from the page headers."""
        spec = self.specs[field]
        if self.partial is not None:  # the pages landed so far (more land with later lookups)
            return None if spec["kind"] in ("int", "text", "json") else self.partial.direct(field, fixed_nbytes(spec))
        if field not in self._direct:
            self._direct[field] = None if spec["kind"] in ("int", "text", "json") else parquet_pages.field_offsets(
                self.pf.metadata, self.mm, field, fixed_nbytes(spec))
        return self._direct[field]

    def _ints(self, name: str):
        """A whole integer column as numpy (values, validity), read once: 8 bytes a row, where a row
        group per sample under shuffle would cost a decode each."""
        if name not in self._whole:
            try:
                col = self.pf.read(columns=[name], use_threads=False).column(0).combine_chunks()
            except Exception as e:
                raise ShardError(f"shard {self.url}: cannot read column {name!r} ({type(e).__name__}: {e}); "
                                 "rebuild the dataset") from e
            self._whole[name] = (col.fill_null(0).to_numpy(), col.is_valid().to_numpy(zero_copy_only=False))
        return self._whole[name]

    def _all_sums(self, field: str):
        """Recorded checksums of every row of `field` (None: none recorded, or checks off)."""
        name = field + CHECKSUM_SUFFIX
        return self._ints(name)[0] if self.checks and name in self.columns else None

    def has(self, field: str) -> bool:
        return field in self.columns

    def _group(self, i: int, field: str):
        def load():
            try:
                arr = self.pf.read_row_group(i, columns=[field], use_threads=False).column(0).combine_chunks()
            except Exception as e:
                raise ShardError(f"shard {self.url}: cannot read row group {i} column {field!r} "
                                 f"({type(e).__name__}: {e}); rebuild the dataset") from e
            return arr, arr.nbytes
        return self.cache.get((self.path or self.url, i, field), load)

    def _sums(self, g: int, field: str, local) -> np.ndarray | None:
        """Recorded checksums of `field` at rows `local` of row group g (None: none recorded, or checks off)."""
        name = field + CHECKSUM_SUFFIX
        if not self.checks or name not in self.columns:
            return None
        sums = self._group(g, name)
        if sums.null_count:  # null beside a null value; to_numpy would turn the column into floats
            sums = sums.fill_null(0)
        return sums.to_numpy(zero_copy_only=False)[local]

    def values(self, field: str, rows) -> list:
        """Stored values of `field` at `rows` (binary as bytes, json parsed); None where null."""
        rows = np.asarray(rows, np.int64)
        if self.partial is not None:
            self.partial.check(rows)
        if self.direct(field) is not None:
            return self._sliced(field, rows)
        if self.specs[field]["kind"] == "int":
            return self._int_values(field, rows)
        out: list = [None] * len(rows)
        for g, sel, local in _by_group(self.starts, rows):
            # Bytes as stored (a string column viewed as binary: no UTF-8 check yet), checked first.
            arr, sums = _as_binary(self._group(g, field)), self._sums(g, field, local)
            raw = arr.take(local).to_pylist()  # bytes or None each; one C loop, not a scalar per row
            if sums is not None:
                read = [k for k, v in enumerate(raw) if v is not None]
                digest = _bytes_digest()
                check_digests(self.url, field, self.keys, rows[sel[read]], [digest(raw[k]) for k in read], sums[read])
            for j, v in zip(sel.tolist(), stored_values(self.specs[field], raw, (self.url, field), self.keys, rows[sel])):
                out[j] = v
        return out

    def _sliced(self, field: str, rows: np.ndarray) -> list:
        offsets, sizes = self.direct(field)
        offs, lens, sums = offsets[rows], sizes[rows], self._all_sums(field)
        out = [None if o < 0 else self.mm[o:o + n] for o, n in zip(offs.tolist(), lens.tolist())]
        if sums is not None:
            read = np.nonzero(offs >= 0)[0]
            digest = _bytes_digest()
            check_digests(self.url, field, self.keys, rows[read], [digest(out[i]) for i in read.tolist()],
                          sums[rows[read]])
        return out

    def _int_values(self, field: str, rows: np.ndarray) -> list:
        values, valid = self._ints(field)
        out = [v if ok else None for v, ok in zip(values[rows].tolist(), valid[rows].tolist())]
        sums = self._all_sums(field)
        if sums is not None:
            read = np.nonzero(valid[rows])[0]
            check_digests(self.url, field, self.keys, rows[read], [checksum(out[i]) for i in read.tolist()],
                          sums[rows[read]])
        return out

    def fill(self, field: str, rows, out: np.ndarray, positions) -> np.ndarray:
        """Gather fixed-size binary values into out[positions]: by offset from the mapped file, else
        from Arrow buffers of the row groups."""
        if self.partial is not None:
            self.partial.check(rows)
        direct = self.direct(field)
        if direct is not None:
            rows, sums = np.asarray(rows, np.int64), self._all_sums(field)
            present, digests = gather(self.buf, direct[0][rows], direct[1][rows], out, positions,
                                      (self.url, field), sums is not None)
            if sums is not None:
                check_digests(self.url, field, self.keys, rows[present], digests, sums[rows[present]])
            return present
        nbytes = out.shape[1]
        positions = np.asarray(positions)
        present = np.ones(len(rows), bool)
        for g, sel, local in _by_group(self.starts, rows):
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
                pf = pq.ParquetFile(_source(self), memory_map=True, pre_buffer=False,
                                    page_checksum_verification=True)
                return pf.read(columns=["__key__"], use_threads=False).column(0).to_pylist()
            return self.pf.read(columns=["__key__"], use_threads=False).column(0).to_pylist()
        except Exception as e:
            raise ShardError(f"shard {self.url}: cannot read keys ({type(e).__name__}: {e}); "
                             "rebuild the dataset") from e


def _source(shard: ParquetShard):
    """What pyarrow opens: the file, or the buffer of the rows read by range."""
    import pyarrow as pa

    return shard.path if shard.partial is None else pa.BufferReader(pa.py_buffer(shard.partial.buf))


def _check_sums(shard: ParquetShard, recorded: str) -> None:
    """The checksums in the shard's file (and its keys) are those the manifest records: every value is
    checked against them, so a shard replaced by another build's, whose values pass its own
    checksums, is refused here, before any value is served. 8 bytes a value are read (the
    checksum columns, which checked reads read anyway), not the whole file's sha256."""
    sums = {n: shard._ints(n) for n in shard.columns if n.endswith(CHECKSUM_SUFFIX)}
    got = sums_digest(shard.keys, sums)
    if got != recorded:
        raise ShardError(f"shard {shard.url}: its keys and checksums are not those the manifest records (digest "
                         f"{got[:16]}…, the manifest says {recorded[:16]}…): the file was replaced since the "
                         "build (another build's shard, or damage); rebuild or re-upload the dataset")


def _by_group(starts: np.ndarray, rows):
    """(row group g, positions in `rows`, rows local to g) for each row group the rows fall in (`starts`:
    each group's first row, then the row count)."""
    rows = np.asarray(rows, np.int64)
    groups = np.searchsorted(starts, rows, side="right") - 1
    for g in np.unique(groups):
        sel = np.nonzero(groups == g)[0]
        yield int(g), sel, rows[sel] - starts[g]


def _check_schema(schema, specs: dict, url: str) -> None:
    """Columns whose Arrow type decides the Python type handed out (keys and text as str, ints as
    int) must have it: the footer has no checksum, and one flipped byte there can turn a string
    column into binary, whose values would pass their checksums as bytes."""
    import pyarrow as pa

    wanted = {"__key__": "text"} | {f: s["kind"] for f, s in specs.items() if s["kind"] in ("text", "json", "int")}
    for name, kind in wanted.items():
        if name not in schema.names:
            continue
        t = schema.field(name).type
        ok = pa.types.is_integer(t) if kind == "int" else pa.types.is_string(t) or pa.types.is_large_string(t)
        if not ok:
            raise ShardError(f"shard {url}: column {name!r} has Arrow type {t}, expected "
                             f"{'an integer' if kind == 'int' else 'string'}: the shard's footer is corrupt; restore "
                             "or rebuild it")


def _as_binary(arr):
    """A string array as the binary array over the same buffers (zero-copy; as_py gives bytes)."""
    import pyarrow as pa

    if pa.types.is_string(arr.type):
        return arr.cast(pa.binary())
    if pa.types.is_large_string(arr.type):
        return arr.cast(pa.large_binary())
    return arr


def open_shard(path: str | None, shard: ShardInfo, specs: dict, url: str, *, index_path: str | None = None,
               cache: ByteLRU | None = None, checks: bool = True, partial=None):
    """A reader for one local shard file (tar or Parquet); `checks`: verify each value read against
    its recorded checksum (check_digests). `partial`: some rows of the shard read by range (TarShard,
    ParquetShard)."""
    if shard.format == "tar":
        return TarShard(path, shard, specs, index_path, url, checks, partial)
    if shard.format == "parquet":
        return ParquetShard(path, shard, specs, url, cache or ByteLRU(ROW_GROUP_CACHE_BYTES), checks, partial)
    raise ShardError(f"shard {url} has format {shard.format!r}; this reader knows 'tar' and 'parquet'")


def read_shard_samples(root: str, manifest: Manifest, shard: ShardInfo, policy=None) -> list[Sample]:
    """All samples of one shard, field values in stored form (bytes, int, str, dict), no decoding.
    `policy`: the RemotePolicy of a remote root's fetch (a job's: its --timeout/--retries)."""
    keys, columns = read_shard_columns(root, manifest, shard, policy)
    samples = []
    for i, key in enumerate(keys):
        fields = {f: (bytes(v) if isinstance(v, (memoryview, bytearray)) else v)
                  for f, col in columns.items() if (v := col[i]) is not None}
        samples.append(Sample(key, fields))
    return samples


def read_shard_columns(root: str, manifest: Manifest, shard: ShardInfo,
                       policy=None) -> tuple[list[str], dict[str, list]]:
    """(keys, {field: its stored values, None where absent}) of one whole shard, each value checked
    against its recorded checksum: `read_shard_samples` without a Python object per sample."""
    url = join(root, shard.path)
    if is_url(root):
        from shardkit.reader.cache import fetch_to_temp

        with fetch_to_temp(root, shard, policy) as (path, index_path):
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


def _read_all(reader) -> tuple[list[str], dict[str, list]]:
    rows = np.arange(len(reader.keys))
    return list(reader.keys), {f: reader.values(f, rows) for f in reader.specs if reader.has(f)}

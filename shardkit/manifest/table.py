"""The shard table: every shard's record as columns (manifest.shards.parquet), read by row group."""

from __future__ import annotations

import json
import posixpath

from shardkit.contract import ShardInfo
from shardkit.errors import ManifestError


def safe_relpath(path: str) -> str:
    """Reject paths that could leave the dataset folder: absolute, drive-letter, or with '..'."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"shard path {path!r} is not a non-empty string")
    p = path.replace("\\", "/")
    if p.startswith("/") or (len(p) > 1 and p[1] == ":") or "://" in p:
        raise ManifestError(f"shard path {path!r} is absolute; manifest paths must be relative to the dataset folder")
    if ".." in p.split("/") or posixpath.normpath(p).startswith(".."):
        raise ManifestError(f"shard path {path!r} leaves the dataset folder ('..' is not allowed in manifest paths)")
    return p


# The shard table's columns. A tar shard's index record gets typed columns too; anything else a
# ShardInfo holds travels as JSON in `extra` (null when there is nothing), so the table carries
# every field the JSON list would.
_COLUMNS = {"id": "int64", "format": "string", "path": "string", "samples": "int64", "bytes": "int64",
            "sha256": "string", "index_path": "string", "index_bytes": "int64", "index_sha256": "string",
            "extra": "string", "first_key": "string", "last_key": "string"}
# Columns a table written by an older shardkit lacks (its shards' records have no key bounds).
_OPTIONAL = ("first_key", "last_key")
TABLE_ROW_GROUP = 1024  # rows read together when one shard's record is needed
ROW_GROUPS_KEPT = 8


def _row(info: ShardInfo) -> dict:
    d = info.to_dict()
    index = dict(d.pop("index", None) or {})
    row = {k: d.pop(k) for k in ("id", "format", "path", "samples", "bytes", "sha256")}
    row.update(index_path=index.pop("path", None), index_bytes=index.pop("bytes", None),
               index_sha256=index.pop("sha256", None))
    keys = d.pop("keys", None) or (None, None)
    row.update(first_key=keys[0], last_key=keys[1])
    if index:
        d["index"] = index
    row["extra"] = json.dumps(d, sort_keys=True) if d else None
    return row


def _info(row: dict) -> ShardInfo:
    """A table row as a ShardInfo; its paths are checked here, as each record is used."""
    d = {k: row[k] for k in ("id", "format", "path", "samples", "bytes", "sha256")}
    if row["index_path"] is not None:
        d["index"] = {"path": row["index_path"], "bytes": row["index_bytes"], "sha256": row["index_sha256"]}
    if row.get("first_key") is not None:
        d["keys"] = (row["first_key"], row["last_key"])
    extra = json.loads(row["extra"]) if row["extra"] else {}
    if "index" in extra:
        d["index"] = {**(d.get("index") or {}), **extra.pop("index")}
    info = ShardInfo.from_dict({**d, **extra})
    safe_relpath(info.path)
    if info.index:
        safe_relpath(info.index["path"])
    return info


class TableColumns:
    """A shard table's columns in its order (`rows`): the ones held as arrays (ids, formats, sample
    counts, bytes), and the others, read from the table file (`blob`) when asked for."""

    @property
    def formats(self) -> list[str]:
        return sorted(set(self._formats[self.rows].tolist()))

    @property
    def samples(self):
        """Samples of each shard, as an int64 numpy array in this table's order."""
        return self._samples[self.rows]

    @property
    def nbytes(self):
        """Bytes of each shard file, as an int64 numpy array in this table's order."""
        return self._bytes[self.rows]

    @property
    def ids(self):
        """Shard ids, as an int64 numpy array in this table's order."""
        return self._ids[self.rows]

    def strings(self, name: str) -> list:
        """Column `name` (sha256, path, ...) of these shards, in this table's order (read when asked)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        column = pq.ParquetFile(pa.BufferReader(self.blob)).read(columns=[name], use_threads=False).column(0)
        return column.take(self.rows).to_pylist()

    def content_digest(self) -> str:
        """xxh3 of the shards' sha256s in this table's order: equal for the same shard files
        wherever they are kept, different for other contents (read from the table when asked)."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        import xxhash

        sums = pq.ParquetFile(pa.BufferReader(self.blob)).read(columns=["sha256"], use_threads=False).column(0)
        return xxhash.xxh3_64_hexdigest("\n".join(sums.take(self.rows).to_pylist()).encode())

    def key_bounds(self):
        """(first keys, last keys) of every shard in this table's order, as object arrays with None for
        a shard whose record has none (an empty shard, or one written before bounds were recorded)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        if "first_key" not in self.columns:
            return np.full(len(self.rows), None, dtype=object), np.full(len(self.rows), None, dtype=object)
        cols = pq.ParquetFile(pa.BufferReader(self.blob)).read(columns=["first_key", "last_key"], use_threads=False)
        return tuple(np.asarray(c.to_pylist(), dtype=object)[self.rows] for c in cols.columns)


class ShardTable(TableColumns):
    """Shard records as columns: a reader of 100k+ shards holds a few arrays, not 100k objects.

    Only ids, formats and sample counts are held as arrays; a shard's full record (paths,
    sizes, checksums) is read from the table file's row group when it is asked for. Indexing
    gives one ShardInfo and iteration all of them, as a list of ShardInfo would; `of(fmt)` is a
    view of one format's shards in id order. Its columns, held or read when asked, are TableColumns'.
    """

    def __init__(self, blob: bytes, where: str = "shard table", rows=None):
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.blob, self.where = blob, where
        try:
            pf = pq.ParquetFile(pa.BufferReader(blob))
            self.columns = [c for c in _COLUMNS if c in pf.schema_arrow.names]
            missing = [c for c in _COLUMNS if c not in self.columns and c not in _OPTIONAL]
            cols = pf.read(columns=["id", "format", "samples", "bytes"], use_threads=False)
            sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
        except Exception as e:  # pyarrow raises several types for a damaged file
            raise ManifestError(f"{where} is not a readable shard table ({type(e).__name__}: {e}); "
                                "rebuild the dataset") from e
        if missing:
            raise ManifestError(f"{where} lacks the columns {missing}; rebuild the dataset")
        self.rows = np.arange(cols.num_rows, dtype=np.int64) if rows is None else rows
        self._ids = cols.column("id").to_numpy()
        self._formats = np.asarray(cols.column("format").to_pylist(), dtype=object)
        self._samples = cols.column("samples").to_numpy()
        self._bytes = cols.column("bytes").to_numpy()
        self._starts = np.cumsum([0] + sizes)  # first row of each row group
        self._groups = None
        self._check_paths(pf)

    def _check_paths(self, pf) -> None:
        """Every path stays inside the dataset folder: a vectorised screen over the path columns,
        then safe_relpath on each flagged row, which names the bad path."""
        import pyarrow.compute as pc

        paths = pf.read(columns=["path", "index_path", "extra"], use_threads=False)
        unsafe = r'^$|^[/\\]|^.:|://|(^|[/\\])\.\.([/\\]|$)'
        flagged = pc.or_(pc.fill_null(pc.match_substring_regex(paths.column("path"), unsafe), True),
                         pc.fill_null(pc.match_substring_regex(paths.column("index_path"), unsafe), False))
        flagged = pc.or_(flagged, pc.fill_null(pc.match_substring_regex(paths.column("extra"), '"path"'), False))
        for i in pc.indices_nonzero(flagged).to_pylist():
            self[i]  # raises ManifestError for the unsafe path

    @classmethod
    def from_infos(cls, infos) -> "ShardTable":
        """The table of these records (sorted by id, then format), as written next to manifest.json."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [_row(s) for s in sorted(infos, key=lambda s: (s.id, s.format))]
        table = pa.table({name: pa.array([r[name] for r in rows], getattr(pa, kind)())
                          for name, kind in _COLUMNS.items()})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd", row_group_size=TABLE_ROW_GROUP)
        return cls(sink.getvalue().to_pybytes())

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        """Shard i as a ShardInfo (a slice gives a list of them, as a list would); its paths are
        checked again here."""
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        import numpy as np

        row = int(self.rows[i])
        group = int(np.searchsorted(self._starts, row, side="right")) - 1
        return _info(self._group(group)[row - int(self._starts[group])])

    def _group(self, g: int) -> list[dict]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._groups is None:
            self._groups = {}
        if g not in self._groups:
            if len(self._groups) >= ROW_GROUPS_KEPT:
                self._groups.pop(next(iter(self._groups)))
            pf = pq.ParquetFile(pa.BufferReader(self.blob))
            self._groups[g] = pf.read_row_group(g, columns=self.columns, use_threads=False).to_pylist()
        return self._groups[g]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other) -> bool:
        import numpy as np

        return isinstance(other, ShardTable) and self.blob == other.blob and np.array_equal(self.rows, other.rows)

    def __getstate__(self):
        return {**self.__dict__, "_groups": None}  # decoded row groups stay in their process

    def of(self, fmt: str) -> "ShardTable":
        """The shards of one format, ordered by id: a view, the columns are shared."""
        import numpy as np

        rows = self.rows[self._formats[self.rows] == fmt]
        view = object.__new__(ShardTable)
        view.__dict__.update(self.__dict__, rows=rows[np.argsort(self._ids[rows], kind="stable")], _groups=None)
        return view

    def to_parquet(self) -> bytes:
        """The table file's bytes (the same records give the same bytes)."""
        import numpy as np

        if np.array_equal(self.rows, np.arange(len(self._ids))):
            return self.blob
        return ShardTable.from_infos(list(self)).blob

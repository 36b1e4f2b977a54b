"""manifest.json: the versioned contract between the build and the readers (written last)."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field

from shardkit._version import __version__
from shardkit.contract import FIELD_KINDS, ShardInfo
from shardkit.errors import ConfigError, ManifestError
from shardkit.fs import RemoteError, atomic_write, join, read_bytes, sha256_bytes

FORMAT = "shardkit"
VERSION = 2  # 2: the shard list may live only in the shard table; 1: always inline
MANIFEST_NAME = "manifest.json"
TABLE_NAME = "manifest.shards.parquet"
# Up to this many shard records stay inline in manifest.json too (version 1, which older
# shardkit reads); beyond it parsing them dominates start-up (100k inline: 2.2 s and a 292 MB
# peak, against 0.1 s and 172 MB from the table; bench/scale_bench.py), so the list lives only
# in the columnar table (version 2).
INLINE_SHARDS = 10_000


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


class ShardTable:
    """Shard records as columns: a reader of 100k+ shards holds a few arrays, not 100k objects.

    Only ids, formats and sample counts are held as arrays; a shard's full record (paths,
    sizes, checksums) is read from the table file's row group when it is asked for. Indexing
    gives one ShardInfo and iteration all of them, as a list of ShardInfo would; `of(fmt)` is a
    view of one format's shards in id order.
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

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other) -> bool:
        import numpy as np

        return isinstance(other, ShardTable) and self.blob == other.blob and np.array_equal(self.rows, other.rows)

    def __getstate__(self):
        return {**self.__dict__, "_groups": None}  # decoded row groups stay in their process

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

    def content_digest(self) -> str:
        """xxh3 of the shards' sha256s in this table's order: equal for the same shard files
        wherever they are kept, different for other contents (read from the table when asked)."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        import xxhash

        sums = pq.ParquetFile(pa.BufferReader(self.blob)).read(columns=["sha256"], use_threads=False).column(0)
        return xxhash.xxh3_64_hexdigest("\n".join(sums.take(self.rows).to_pylist()).encode())

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


@dataclass
class Manifest:
    """The dataset: samples, field specs, classes, shards, and how it was built.

    `shards` is a ShardTable (a list of ShardInfo given here becomes one): it indexes and
    iterates like a list of ShardInfo.
    """

    samples: int
    fields: dict
    shards: ShardTable
    classes: list[str] | None = None
    build: dict = field(default_factory=dict)
    errors: dict = field(default_factory=lambda: {"count": 0, "by_reason": {}})
    extra: dict = field(default_factory=dict)
    created_by: str = f"shardkit {__version__}"

    def __post_init__(self):
        if not isinstance(self.shards, ShardTable):
            self.shards = ShardTable.from_infos(self.shards)

    @property
    def formats(self) -> list[str]:
        return self.shards.formats

    def shards_of(self, fmt: str | None = None) -> ShardTable:
        """Shards of one format (default: parquet when present, else tar), ordered by id."""
        fmt = fmt or ("parquet" if "parquet" in self.formats else "tar")
        if not len(self.shards):
            raise ManifestError("this dataset is empty (0 samples, no shards): nothing to read; build it from a "
                                "folder with inputs")
        if fmt not in self.formats:
            raise ManifestError(f"this dataset has no {fmt!r} shards; it has {self.formats}")
        return self.shards.of(fmt)

    def to_dict(self) -> dict:
        """manifest.json's content; the shard list is inline only when it is small (see INLINE_SHARDS)."""
        blob = self.shards.to_parquet()
        d = {
            "format": FORMAT,
            "version": 1 if len(self.shards) <= INLINE_SHARDS else VERSION,
            "created_by": self.created_by,
            "samples": self.samples,
            "fields": self.fields,
            "shard_table": {"path": TABLE_NAME, "rows": len(self.shards), "bytes": len(blob),
                            "sha256": sha256_bytes(blob)},
            "build": self.build,
            "errors": self.errors,
        }
        if d["version"] == 1:
            d["shards"] = [s.to_dict() for s in self.shards]
        if self.classes is not None:
            d["classes"] = self.classes
        d.update(self.extra)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict, where: str = "manifest", root: str | None = None, policy=None) -> "Manifest":
        """A manifest from manifest.json's content; `root` is where its shard table lies (version 2),
        read with `policy` (a shardkit.fs.RemotePolicy) when remote."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ManifestError(f"{where} is not a shardkit manifest (expected \"format\": \"shardkit\")")
        if d.get("version") not in (1, VERSION):
            raise ManifestError(
                f"{where} has version {d.get('version')!r}; this shardkit ({__version__}) reads versions "
                f"1 and {VERSION}: upgrade shardkit or rebuild the dataset"
            )
        try:
            shards = _inline_shards(d["shards"], where) if "shards" in d else _table(d["shard_table"], where, root, policy)
            known = {"format", "version", "created_by", "samples", "fields", "shards", "shard_table", "classes",
                     "build", "errors"}
            check_counts(d["samples"], shards, where)
            check_fields(d["fields"], where)
            return cls(samples=int(d["samples"]), fields=dict(d["fields"]), shards=shards,
                       classes=d.get("classes"), build=d.get("build", {}),
                       errors=d.get("errors", {"count": 0, "by_reason": {}}),
                       extra={k: v for k, v in d.items() if k not in known},
                       created_by=d.get("created_by", ""))
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{where} is malformed ({type(e).__name__}: {e}); rebuild the dataset") from e


def _inline_shards(records: list, where: str) -> ShardTable:
    shards = [ShardInfo.from_dict(s) for s in records]
    for s in shards:
        safe_relpath(s.path)
        if s.index:
            safe_relpath(s.index["path"])
        for name in ("samples", "bytes"):  # the table's int64 columns would not say which shard
            if not _count(getattr(s, name)):
                raise ManifestError(f"{where}: shard {s.path} has {name}={getattr(s, name)!r}; expected an integer "
                                    ">= 0: the manifest is damaged, rebuild the dataset")
    return ShardTable.from_infos(shards)


def _table(record: dict, where: str, root: str | None, policy=None) -> ShardTable:
    """The shard table a version-2 manifest names, checked against its size and sha256."""
    if root is None:
        raise ManifestError(f"{where} keeps its shards in {record.get('path')!r}: load it with load_manifest(ROOT)")
    url = join(root, safe_relpath(record["path"]))
    try:
        blob = read_bytes(url, policy)
    except ConfigError as e:  # a remote backend that is not installed: the message names the extra
        raise ManifestError(str(e)) from e
    except (OSError, RemoteError) as e:
        raise ManifestError(f"cannot read the shard table {url} ({getattr(e, 'detail', e)}); the dataset is "
                            "incomplete: copy the whole folder or rebuild it") from e
    if len(blob) != record["bytes"] or sha256_bytes(blob) != record["sha256"]:
        raise ManifestError(f"the shard table {url} does not match manifest.json (size or sha256): it was "
                            "replaced or damaged; rebuild the dataset")
    table = ShardTable(blob, url)
    if len(table) != record["rows"]:
        raise ManifestError(f"the shard table {url} has {len(table)} rows, manifest.json says {record['rows']}")
    return table


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_counts(samples, shards: ShardTable, where: str = "manifest") -> None:
    """Counts a reader can trust: every shard's samples and bytes an integer >= 0, and the shards of
    each format adding up to the dataset's samples (readers size epochs from these); checked over
    the table's columns."""
    import numpy as np

    if not _count(samples):
        raise ManifestError(f"{where}: samples={samples!r}; expected an integer >= 0: the manifest is damaged, "
                            "rebuild the dataset")
    for name, values in (("samples", shards.samples), ("bytes", shards.nbytes)):
        bad = np.nonzero(values < 0)[0]
        if len(bad):
            raise ManifestError(f"{where}: shard {shards[int(bad[0])].path} has {name}={int(values[bad[0]])}; "
                                "expected an integer >= 0: the manifest is damaged, rebuild the dataset")
    for fmt in shards.formats:
        total = int(shards.of(fmt).samples.sum())
        if total != samples:
            raise ManifestError(f"{where}: its {fmt} shards hold {total} samples in all but it says samples={samples}: "
                                "the manifest is damaged, rebuild the dataset (`shardkit verify` checks each shard)")


def check_fields(fields, where: str = "manifest") -> None:
    """Field specs a reader can trust: a known kind each, and a shape of positive ints and a numpy
    dtype where given. manifest.json has no checksum of its own, and a damaged spec would change
    how values decode (a raw image read as plain bytes) instead of failing."""
    import numpy as np

    if not isinstance(fields, dict):
        raise ManifestError(f"{where}: fields is {type(fields).__name__}, expected an object of field specs: "
                            "the manifest is damaged, rebuild the dataset")
    for name, spec in fields.items():
        kind = spec.get("kind") if isinstance(spec, dict) else None
        problem = None if kind in FIELD_KINDS else f"kind {kind!r}; expected one of {', '.join(FIELD_KINDS)}"
        shape = spec.get("shape") if problem is None else None
        if shape is not None and not (isinstance(shape, list) and all(_count(v) and v > 0 for v in shape)):
            problem = f"shape {shape!r}; expected a list of positive integers"
        if problem is None and spec.get("dtype") is not None:
            try:
                np.dtype(spec["dtype"])
            except TypeError:
                problem = f"dtype {spec['dtype']!r}; expected a numpy dtype name"
        if problem is not None:
            raise ManifestError(f"{where}: field {name!r} has {problem}: the manifest is damaged, rebuild the dataset")


def manifest_url(root: str) -> str:
    return join(root, MANIFEST_NAME)


def load_manifest(root: str, policy=None) -> Manifest:
    """Read and validate ROOT/manifest.json (a local folder, or an fsspec URL read with `policy`'s
    timeouts and retries: a shardkit.fs.RemotePolicy)."""
    url = manifest_url(root)
    try:
        raw = read_bytes(url, policy)
    except ConfigError as e:  # a remote backend that is not installed: the message names the extra
        raise ManifestError(str(e)) from e
    except (FileNotFoundError, NotADirectoryError, RemoteError) as e:  # a file given as ROOT: not a directory
        if isinstance(e, RemoteError) and not e.not_found:
            raise ManifestError(f"cannot fetch {url}: {e.detail}") from e
        raise ManifestError(
            f"no manifest at {url}: is {root!r} a dataset built by `shardkit build`? "
            "(a build that did not finish writes no manifest; rerun it)"
        ) from e
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise ManifestError(f"{url} is not valid JSON ({e}); rebuild the dataset") from e
    return Manifest.from_dict(d, where=url, root=root, policy=policy)


def shard_files(shards) -> set[str]:
    """Relative paths of every file the shards consist of (shard files and their index sidecars)."""
    return {s.path for s in shards} | {s.index["path"] for s in shards if s.index}


def remove_unlisted_shards(root: str, shards) -> None:
    """Delete ROOT/shards/data-* files that `shards` do not name (left by an earlier, larger run)."""
    import os

    keep, folder = shard_files(shards), os.path.join(root, "shards")
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith("data-") and f"shards/{name}" not in keep:
            os.remove(os.path.join(folder, name))


def write_manifest(root: str, manifest: Manifest) -> None:
    """Write ROOT/manifest.json atomically, after the shard table it checksums; call it only after
    every shard it names is in place."""
    atomic_write(join(root, TABLE_NAME), manifest.shards.to_parquet())
    atomic_write(manifest_url(root), manifest.to_json())

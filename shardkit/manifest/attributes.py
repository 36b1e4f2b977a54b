"""The manifest's attributes: which attribute columns the dataset has, and one record per shard id
of its attribute table (manifest.attributes.parquet, checksummed in manifest.json like the shard table).

manifest.json gains one key, `attributes` (its own `version`), which manifests without it and
readers that do not know it ignore:

    "attributes": {"version": 1,
                   "table": {"path", "rows", "bytes", "sha256"},          # manifest.attributes.parquet
                   "columns": {column: {"type": "bool", "scorer": name}},
                   "scorers": {name: {"fingerprint", "config"}},
                   "selections": {where: {"column": "kept:<digest>", "kept": samples}}}

The table has a row per shard id (`id, path, rows, bytes, sha256, source, scorers`: the
AttributeInfo fields, `scorers` as JSON) and, per stored selection, an int64 column of each shard's
kept samples: a reader plans a where= epoch from it without opening any attribute table.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from shardkit.contract import AttributeInfo
from shardkit.errors import ConfigError, ManifestError
from shardkit.store.remote import RemoteError, read_bytes
from shardkit.store.local import join, sha256_bytes
from shardkit.manifest.table import safe_relpath

VERSION = 1
TABLE_NAME = "manifest.attributes.parquet"
_COLUMNS = ("id", "path", "rows", "bytes", "sha256", "source", "scorers")


def source_format(manifest) -> str:
    """The shard format attributes are computed from (and checked against): Parquet when the dataset
    has it (its text column reads without a tar walk), else tar; both hold the same samples per id."""
    return "parquet" if "parquet" in manifest.formats else "tar"


def selection_column(where: str) -> str:
    return "kept:" + hashlib.sha256(where.encode()).hexdigest()[:16]


class Attributes:
    """A dataset's attribute columns and per-shard attribute records, in shard id order."""

    def __init__(self, record: dict, table):
        self.columns = dict(record.get("columns", {}))
        self.scorers = dict(record.get("scorers", {}))
        self.selections = dict(record.get("selections", {}))
        self.table = table.sort_by("id")
        self.ids = self.table.column("id").to_numpy()

    @classmethod
    def of(cls, infos, columns: dict, scorers: dict, kept: dict | None = None):
        """From AttributeInfos; `kept` {where: kept samples per shard, in id order} are the stored selections."""
        import pyarrow as pa

        infos = sorted(infos, key=lambda i: i.id)
        rows = {c: [getattr(i, c) for i in infos] for c in _COLUMNS[:-1]}
        rows["scorers"] = [json.dumps(i.scorers, sort_keys=True) for i in infos]
        table = pa.table(rows, schema=pa.schema([("id", pa.int64()), ("path", pa.string()), ("rows", pa.int64()),
                                                 ("bytes", pa.int64()), ("sha256", pa.string()),
                                                 ("source", pa.string()), ("scorers", pa.string())]))
        for where, counts in sorted((kept or {}).items()):
            table = table.append_column(selection_column(where), pa.array(np.asarray(counts, np.int64)))
        selections = {w: {"column": selection_column(w), "kept": int(np.sum(c))} for w, c in sorted((kept or {}).items())}
        return cls({"columns": columns, "scorers": scorers, "selections": selections}, table)

    def __len__(self) -> int:
        return len(self.ids)

    def info(self, shard_id: int) -> AttributeInfo:
        """Shard `shard_id`'s attribute record; its path checked to stay inside the dataset."""
        i = int(np.searchsorted(self.ids, shard_id))
        if i >= len(self.ids) or self.ids[i] != shard_id:
            raise ManifestError(f"shard {shard_id} has no attribute table; run `shardkit annotate` on the dataset")
        row = {c: self.table.column(c)[i].as_py() for c in _COLUMNS}
        info = AttributeInfo.from_dict({**row, "scorers": json.loads(row["scorers"] or "{}")})
        safe_relpath(info.path)
        return info

    def columns_of(self, scorer: str) -> list[str]:
        """The columns a scorer (or the dedup step) filled, in table order."""
        return [c for c, spec in self.columns.items() if spec.get("scorer") == scorer]

    def infos(self) -> list[AttributeInfo]:
        """Every shard's record, in id order (the columns read once: O(shards))."""
        cols = {c: self.table.column(c).to_pylist() for c in _COLUMNS}
        out = []
        for row in zip(*cols.values()):
            d = dict(zip(cols, row))
            out.append(AttributeInfo.from_dict({**d, "scorers": json.loads(d["scorers"] or "{}")}))
            safe_relpath(out[-1].path)
        return out

    def kept(self, where: str) -> np.ndarray | None:
        """Kept samples per shard (id order) of a stored selection, or None when it is not stored."""
        if where not in self.selections:
            return None
        return self.table.column(self.selections[where]["column"]).to_numpy()

    def blob(self) -> bytes:
        """manifest.attributes.parquet's bytes (the same records give the same bytes)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(self.table, sink, compression="zstd", row_group_size=max(1, len(self)))
        return sink.getvalue().to_pybytes()

    def record(self, blob: bytes) -> dict:
        """manifest.json's `attributes` entry for this table's bytes."""
        return {"version": VERSION, "columns": self.columns, "scorers": self.scorers, "selections": self.selections,
                "table": {"path": TABLE_NAME, "rows": len(self), "bytes": len(blob), "sha256": sha256_bytes(blob)}}


def attach(root: str, manifest, attributes: Attributes | None, policy=None) -> None:
    """Write `attributes`' table into ROOT and name it in `manifest` (None removes the entry): call
    before write_manifest, which writes manifest.json last."""
    manifest.extra.pop("attributes", None)
    if attributes is not None:
        import shardkit.store as store

        blob = attributes.blob()
        store.write(store.join(root, TABLE_NAME), blob, policy)  # a local folder (temp, then rename) or a store
        manifest.extra["attributes"] = attributes.record(blob)


def load_attributes(manifest, root: str, policy=None, check: bool = True) -> Attributes | None:
    """The dataset's attributes (None when it has none), checked: the table against manifest.json's
    sha256, and (`check`) one record per shard id computed from that shard's current content."""
    record = manifest.extra.get("attributes")
    if record is None:
        return None
    where = join(root, TABLE_NAME)
    if not isinstance(record, dict) or record.get("version") != VERSION:
        version = record.get("version") if isinstance(record, dict) else record
        raise ManifestError(f"{root}: attributes of version {version!r}; this shardkit reads version {VERSION}: "
                            "upgrade shardkit, or run `shardkit annotate` again")
    try:
        blob = read_bytes(join(root, safe_relpath(record["table"]["path"])), policy)
    except ConfigError as e:
        raise ManifestError(str(e)) from e
    except (OSError, RemoteError) as e:
        raise ManifestError(f"cannot read the attribute table {where} ({getattr(e, 'detail', e)}): copy the whole "
                            "dataset folder, or run `shardkit annotate` again") from e
    if len(blob) != record["table"]["bytes"] or sha256_bytes(blob) != record["table"]["sha256"]:
        raise ManifestError(f"the attribute table {where} does not match manifest.json (size or sha256): run "
                            "`shardkit annotate` again")
    import pyarrow as pa
    import pyarrow.parquet as pq

    attributes = Attributes(record, pq.ParquetFile(pa.BufferReader(blob)).read(use_threads=False))
    if check:
        _check_sources(attributes, manifest, where)
    return attributes


def _check_sources(attributes: Attributes, manifest, where: str) -> None:
    """Every shard id has a record, computed from the shard content the manifest names (vectorised:
    both tables are in id order)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    shards = manifest.shards_of(source_format(manifest))  # in id order
    if not np.array_equal(np.asarray(shards.ids), attributes.ids):
        raise ManifestError(f"{where} covers shards {attributes.ids[:8].tolist()}..., the dataset has "
                            f"{np.asarray(shards.ids)[:8].tolist()}...: run `shardkit annotate` again")
    rows = attributes.table.column("rows").to_numpy()
    if not np.array_equal(rows, np.asarray(shards.samples)):
        bad = attributes.ids[np.flatnonzero(rows != np.asarray(shards.samples))]
        raise ManifestError(f"the attribute tables of shards {bad[:8].tolist()} have other row counts than the "
                            "shards: run `shardkit annotate` again")
    same = pc.equal(pa.array(shards.strings("sha256"), pa.string()), attributes.table.column("source"))
    stale = attributes.ids[np.flatnonzero(~np.asarray(same.to_numpy(zero_copy_only=False), bool))]
    if len(stale):
        raise ManifestError(f"the attributes of shards {stale[:8].tolist()} were computed from other shard content "
                            "than the manifest names: run `shardkit annotate` again")
